import random

import pytest
import torch

from latentstrat import encoding
from latentstrat.base import data
from latentstrat.bench.decode import naive_decode
from latentstrat.modeling import decode
from latentstrat.modeling.backbone import build_backbone
from latentstrat.modeling.model import LatentStrategyModel
from latentstrat.tasks import TASKS

EMBEDDED = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    task = TASKS["list_reversal"]  # 4-6 digit inputs: prompts of different lengths
    rng = random.Random(0)
    xs = [task.sample_input(rng) for _ in range(12)]
    texts = xs + [task.render(x, s) for x in xs for s in task.strategies]
    d = tmp_path_factory.mktemp("tok")
    data.build_tokenizer(texts).save(str(d / "tokenizer.json"))
    tok = encoding.load_tokenizer(d)
    torch.manual_seed(0)
    backbone = build_backbone({"source": "embedded", "embedded": EMBEDDED}, tok)
    model = LatentStrategyModel(backbone, latent_dim=4, z_slots=2, adaptation="lora")
    # make the LoRA adapter non-trivial (B starts at 0) so the generator adapter matters
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    model.eval()
    return model, tok, xs


def test_prompts_are_the_training_record_cut_after_y_open(tiny):
    model, tok, xs = tiny
    p = decode.encode_prompts(tok, xs[:1], z_slots=2)
    words = tok.convert_ids_to_tokens(p.prompt[0])
    assert words == ["<bos>", "<x>", *xs[0].split(), "</x>", "<z>", "[Z]", "[Z]", "</z>", "<y>"]
    assert tok.convert_ids_to_tokens(p.router[0])[-1] == "<z>"
    assert [words[i] for i in p.slot_pos[0]] == ["[Z]", "[Z]"]


def test_greedy_batched_equals_naive_loop(tiny):
    model, tok, xs = tiny
    z = torch.randn(len(xs), 4, generator=torch.Generator().manual_seed(1))
    fast = decode.generate(model, tok, xs, z=z, decoding=decode.Decoding(max_new_tokens=12, batch_size=5))
    slow = naive_decode(model, tok, xs, z, max_new_tokens=12)
    assert fast.token_ids == slow
    assert fast.n_generated == [len(t) for t in slow]
    # prompts of different lengths share a batch (left padding is exercised)
    lengths = {len(p) for p in decode.encode_prompts(tok, xs, 2).prompt}
    assert len(lengths) > 1
    # batch size does not change greedy outputs
    again = decode.generate(model, tok, xs, z=z, decoding=decode.Decoding(max_new_tokens=12, batch_size=12))
    assert again.token_ids == fast.token_ids


def test_z_changes_generation_and_router_sampling_is_seeded(tiny):
    model, tok, xs = tiny
    a = decode.generate(model, tok, xs, decoding=decode.Decoding(seed=3, max_new_tokens=6))
    b = decode.generate(model, tok, xs, decoding=decode.Decoding(seed=3, max_new_tokens=6, batch_size=4))
    c = decode.generate(model, tok, xs, decoding=decode.Decoding(seed=4, max_new_tokens=6))
    # the same seed gives the same z whatever the batching (eps is drawn for all rows at once;
    # batches of other lengths round the router's pass differently in the last bits)
    assert torch.allclose(a.z, b.z, rtol=0, atol=1e-5) and a.texts == b.texts
    assert not torch.equal(a.z, c.z)
    assert torch.allclose(a.mu_r, c.mu_r)
    # router mean and sampled z differ by sigma * eps
    m = decode.generate(model, tok, xs, sample_z_from="router_mean", decoding=decode.Decoding(max_new_tokens=2))
    assert torch.equal(m.z, m.mu_r)
    # the router reads x only: mu_r equals router_prefix on the unpadded prefix
    p = decode.encode_prompts(tok, xs[:1], 2)
    ids = torch.tensor(p.router)
    mu, _ = model.router_prefix(ids, torch.ones_like(ids), torch.tensor([ids.shape[1] - 1]))
    assert torch.allclose(mu[0], a.mu_r[0], atol=1e-5)


def test_temperature_sampling_seeded(tiny):
    model, tok, xs = tiny
    z = torch.zeros(len(xs), 4)
    a = decode.generate(model, tok, xs, z=z, decoding=decode.Decoding(temperature=1.0, seed=0, max_new_tokens=5))
    b = decode.generate(model, tok, xs, z=z, decoding=decode.Decoding(temperature=1.0, seed=0, max_new_tokens=5))
    g = decode.generate(model, tok, xs, z=z, decoding=decode.Decoding(max_new_tokens=5))
    assert a.token_ids == b.token_ids
    assert a.token_ids != g.token_ids


def test_y_text_cut_at_end_tokens(tiny):
    _, tok, _ = tiny
    ids = [tok.convert_tokens_to_ids(w) for w in ["answer", "1", "2", "</y>", "<eos>"]]
    assert encoding.decode_y(tok, ids) == "answer 1 2"
    assert encoding.decode_y(tok, ids[:3]) == "answer 1 2"
    assert encoding.decode_y(tok, []) == ""


def test_bad_arguments(tiny):
    model, tok, xs = tiny
    with pytest.raises(ValueError, match="shape"):
        decode.generate(model, tok, xs, z=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="sample_z_from"):
        decode.generate(model, tok, xs, sample_z_from="posterior")


def test_benchmark_run_small():
    from pathlib import Path

    from latentstrat.bench.decode import build_bench_model, run
    from latentstrat.config import load_config

    cfg = load_config(
        Path(__file__).resolve().parents[1] / "config" / "smoke.yaml",
        overrides={"data": {"tasks": ["sorting_algorithms", "multidigit_addition"]}},
    )
    bench_model = build_bench_model(cfg["data"]["tasks"], cfg["backbone"], cfg["lora"], cfg["cell"])
    res = run(bench_model, n=6, max_new_tokens=5, batch_size=4)
    assert res["identical"] and res["mismatched_examples"] == []
    assert res["examples"] == 6 and 6 <= res["generated_tokens"] <= 30
    assert res["kv_cache_tokens_per_s"] > 0 and res["naive_tokens_per_s"] > 0


def test_rows_finishing_at_different_steps_leave_the_batch(tiny):
    model, tok, xs = tiny
    eos = tok.convert_tokens_to_ids("<eos>")

    def favour_eos(module, inputs, output):  # <eos> wins once a hidden feature (drifting up, row-dependent) passes 0
        output = output.clone()
        output[..., eos] += 50.0 * inputs[0][..., 3]
        return output

    handle = model.lm.lm_head.register_forward_hook(favour_eos)
    try:
        z = torch.randn(len(xs), 4, generator=torch.Generator().manual_seed(2))
        fast = decode.generate(model, tok, xs, z=z, decoding=decode.Decoding(max_new_tokens=12, batch_size=6))
        slow = naive_decode(model, tok, xs, z, max_new_tokens=12)
    finally:
        handle.remove()
    assert fast.token_ids == slow
    lengths = fast.n_generated
    assert len(set(lengths)) >= 3 and min(lengths) < 12  # several finishing steps, in the same batches
    assert all(t[-1] == eos for t, n in zip(fast.token_ids, lengths) if n < 12)
