"""Our own Qwen2 (latentstrat.qwen2) against transformers' on the same saved weights, its cached
decoding, what it refuses, and the LoRA layers (latentstrat.model.LoraLinear) by hand."""
import json
import subprocess
import sys

import pytest
import torch

from latentstrat import qwen2
from latentstrat.model import LoraLinear, add_lora, load_entangled, merged_copy


def saved(tmp_path, tie=True, **kw):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    c = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=tie, pad_token_id=0, **kw)
    hf = Qwen2ForCausalLM(c).eval()
    with torch.no_grad():  # biases and norms off their init, so a dropped one shows
        for n, p in hf.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.normal_(0, 0.5)
    d = tmp_path / ("tied" if tie else "untied")
    hf.save_pretrained(d)
    return hf, d


def padded_batch():
    torch.manual_seed(1)
    ids = torch.randint(1, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0  # right padding
    mask[2, :3] = 0  # left padding, positions counted over real tokens
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return ids, mask, pos


@pytest.mark.parametrize("tie,kw", [(True, {}), (False, {"rope_theta": 1e6, "rms_norm_eps": 1e-5})])
def test_same_function_as_transformers(tmp_path, tie, kw):
    hf, d = saved(tmp_path, tie, **kw)
    own = load_entangled(d)
    assert isinstance(own, qwen2.Qwen2ForCausalLM)
    assert {n: p.shape for n, p in own.named_parameters()} == {n: p.shape for n, p in hf.named_parameters()}
    ids, mask, pos = padded_batch()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = own(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        real = mask.bool()
        assert (got - want)[real].abs().max() < 1e-5
        h_want = hf.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        h_got = own.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        assert (h_got - h_want)[real].abs().max() < 1e-5
    # negative control: a weight changed in the file changes the function
    with torch.no_grad():
        own.model.layers[1].self_attn.v_proj.bias.add_(1.0)
        assert (own(input_ids=ids, attention_mask=mask, position_ids=pos).logits - want)[real].abs().max() > 1e-2


def test_cached_decoding_equals_the_full_pass(tmp_path):
    """One pass over left-padded prompts fills the cache, then one token at a time (rows leaving
    the batch as `decode` drops them): each step's logits equal a full pass over everything so far."""
    _, d = saved(tmp_path)
    own = load_entangled(d)
    ids, mask, pos = padded_batch()
    ids, mask, pos = ids[[0, 2]], mask[[0, 2]], pos[[0, 2]]  # left-padded prompts
    with torch.no_grad():
        out = own(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        seq, m, p = ids, mask, pos
        for step in range(4):
            tok = out.logits[:, -1].argmax(-1)
            if step == 2:  # the second row leaves
                out.cache.batch_select_indices(torch.tensor([0]))
                tok, seq, m, p = tok[:1], seq[:1], m[:1], p[:1]
            seq = torch.cat([seq, tok[:, None]], 1)
            m = torch.cat([m, torch.ones_like(m[:, :1])], 1)
            p = torch.cat([p, p[:, -1:] + 1], 1)
            out = own(input_ids=tok[:, None], attention_mask=m, position_ids=p[:, -1:], cache=out.cache, use_cache=True)
            full = own(input_ids=seq, attention_mask=m, position_ids=p).logits[:, -1]
            assert (out.logits[:, -1] - full).abs().max() < 1e-5


def test_what_it_does_not_implement_loads_through_transformers(tmp_path):
    from transformers import Qwen2ForCausalLM

    _, d = saved(tmp_path, use_sliding_window=True, sliding_window=4)
    assert "sliding-window" in qwen2.supported(qwen2.read_config(d))
    assert isinstance(load_entangled(d), Qwen2ForCausalLM)
    with pytest.raises(ValueError, match="not a Qwen2 this loader implements"):
        qwen2.load(d)
    _, d = saved(tmp_path)
    raw = qwen2.read_config(d)
    (d / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"do not match its config.json \(missing \['model.layers.2"):
        qwen2.load(d)


def test_cell_stages_do_not_import_transformers(tmp_path):
    """The reason this module exists: loading a saved model, adding adapters and running it
    imports neither transformers nor peft."""
    _, d = saved(tmp_path)
    code = (f"import sys, torch; from latentstrat.model import LatentStrategyModel, load_entangled; "
            f"m = LatentStrategyModel(load_entangled({str(d)!r}), 4, 1, 'lora', {{'r': 4}}); "
            f"m.lm(input_ids=torch.tensor([[1, 2, 3]])); "
            f"print(sorted(k for k in ('transformers', 'peft') if k in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_lora_layer_by_hand():
    """y = W x + b + (alpha / r) B A x for the active adapter, the base alone for an unknown one;
    B starts at zero; merging folds the same update into W."""
    torch.manual_seed(0)
    lm = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    lm.get_output_embeddings = lambda: lm[1]  # the output projection gets no adapter
    state = add_lora(lm, {"r": 2, "alpha": 3})
    layer = lm[0]
    assert isinstance(layer, LoraLinear) and isinstance(lm[1], torch.nn.Linear)
    assert all(torch.equal(b.weight, torch.zeros(5, 2)) for b in layer.lora_B.values())
    x = torch.randn(4, 6)
    with torch.no_grad():
        base = x @ layer.base_layer.weight.T + layer.base_layer.bias
        assert torch.equal(layer(x), base)  # B = 0: the identity
        for name in ("generator", "posterior"):
            layer.lora_B[name].weight.normal_()
        for name in ("generator", "posterior"):
            state.active = name
            A, B = layer.lora_A[name].weight, layer.lora_B[name].weight
            want = base + 1.5 * x @ A.T @ B.T
            assert torch.allclose(layer(x), want, atol=1e-6)
            assert torch.allclose(merged_copy(lm, name)[0](x), want, atol=1e-5)
        assert not torch.allclose(layer(x), base)
        state.active = "none"
        assert torch.equal(layer(x), base)
    # dropout acts on the adapter's input in training only
    lm2 = torch.nn.Sequential(torch.nn.Linear(6, 5))
    lm2.get_output_embeddings = lambda: None
    add_lora(lm2, {"r": 2, "dropout": 0.5})
    with torch.no_grad():
        lm2[0].lora_B["generator"].weight.normal_()
        lm2.eval()
        assert torch.equal(lm2(x), lm2(x))
        lm2.train()
        assert not torch.equal(lm2(x), lm2(x))
