"""Decode benchmark: the batched KV-cache decoder against a naive loop, on the same batch.

    python -m latentstrat.bench decode [--n 64] [--max-new-tokens 64] [--threads 2] ...

The naive loop decodes one example at a time with a full forward over the whole
sequence for every new token (no cache, no padding). Both decode greedily from the same z;
the benchmark checks that the outputs are identical and prints tokens/s of both and the ratio.
The model is the embedded Qwen2 backbone (sizes of the config's backbone.embedded, random
init, LoRA latent model) over a tokenizer built from the configured tasks' examples.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from latentstrat import encoding
from latentstrat.base import data
from latentstrat.modeling import decode
from latentstrat.modeling.backbone import device_of
from latentstrat.paths import DATA_FILES


@torch.no_grad()
def naive_decode(model, tokenizer, x_texts: list[str], z: torch.Tensor, max_new_tokens: int) -> list[list[int]]:
    """Reference: one example at a time, full forward per token, no KV cache."""
    eos = decode.special_id(tokenizer, encoding.EOS)
    prompts = decode.encode_prompts(tokenizer, x_texts, model.z_slots)
    dev = device_of(model)
    model.eval()
    outs = []
    with model.adapter("generator"):
        for i in range(len(x_texts)):
            ids = torch.tensor([prompts.prompt[i]], device=dev)
            slots = torch.tensor([prompts.slot_pos[i]], device=dev)
            gen = []
            for _ in range(max_new_tokens):
                logits = model.lm(
                    inputs_embeds=model.embed_with_z(ids, z[i : i + 1].to(dev), slots), use_cache=False
                ).logits
                tok = int(logits[0, -1].argmax())
                gen.append(tok)
                if tok == eos:
                    break
                ids = torch.cat([ids, torch.tensor([[tok]], device=dev)], 1)
            outs.append(gen)
    return outs


def build_bench_model(tasks: list[str], backbone_cfg: dict, lora_cfg: dict, cell_cfg: dict, seed: int = 0):
    """Tokenizer over the tasks' examples + a random latent model: the `backbone` section's,
    with the `cell` section's latent and the `lora` section's adapters."""
    import tempfile
    from pathlib import Path

    from latentstrat.modeling.backbone import build_backbone
    from latentstrat.modeling.model import LatentStrategyModel
    from latentstrat.tasks import TASKS

    rng = random.Random(seed)
    texts, xs = [], []
    for name in tasks:
        task = TASKS[name]
        for _ in range(40):
            x = task.sample_input(rng)
            xs.append(x)
            texts += [x] + [task.render(x, s) for s in task.strategies]
    with tempfile.TemporaryDirectory() as d:
        data.build_tokenizer(texts).save(str(Path(d) / DATA_FILES["tokenizer"]))
        tokenizer = encoding.load_tokenizer(d)
    torch.manual_seed(seed)
    backbone = build_backbone(backbone_cfg, tokenizer)
    model = LatentStrategyModel(backbone, cell_cfg["latent_dim"], cell_cfg["z_slots"], cell_cfg["adaptation"], lora_cfg)
    rng.shuffle(xs)
    return model, tokenizer, xs


def run(bench_model: tuple, n: int, max_new_tokens: int, batch_size: int, seed: int = 0) -> dict:
    """Decode `n` inputs of `bench_model` (build_bench_model's model, tokenizer and inputs) with
    the batched KV cache and with the naive loop: their speed and whether they agree."""
    model, tokenizer, xs = bench_model
    xs = xs[:n]
    z = torch.randn(len(xs), model.latent_dim, generator=torch.Generator().manual_seed(seed))
    decode.generate(model, tokenizer, xs[:2], z=z[:2], decoding=decode.Decoding(2))  # warm-up both paths
    naive_decode(model, tokenizer, xs[:1], z[:1], 2)
    t0 = time.perf_counter()
    fast = decode.generate(model, tokenizer, xs, z=z, decoding=decode.Decoding(max_new_tokens, batch_size))
    t_fast = time.perf_counter() - t0
    print(f"batched KV cache: {sum(fast.n_generated)} tokens in {t_fast:.2f} s; running the naive loop ...", flush=True)
    t0 = time.perf_counter()
    slow = naive_decode(model, tokenizer, xs, z, max_new_tokens)
    t_slow = time.perf_counter() - t0
    tokens = sum(len(t) for t in slow)
    mismatch = [i for i, (a, b) in enumerate(zip(fast.token_ids, slow)) if a != b]
    return {
        "examples": len(xs),
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "generated_tokens": tokens,
        "identical": not mismatch,
        "mismatched_examples": mismatch,
        "kv_cache_tokens_per_s": sum(fast.n_generated) / t_fast,
        "naive_tokens_per_s": tokens / t_slow,
        "kv_cache_s": t_fast,
        "naive_s": t_slow,
        "speedup": t_slow / t_fast,
        "threads": torch.get_num_threads(),
        "model": {k: getattr(model.lm.config, k) for k in ("hidden_size", "num_hidden_layers")},
    }


def main(argv=None) -> int:
    from latentstrat.config import config_for_command

    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.bench decode", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", default="config/config.yaml", help="collection config (backbone, tasks, cell)")
    ap.add_argument("--n", type=int, default=64, help="examples in the batch")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per example")
    ap.add_argument("--batch-size", type=int, default=64, help="examples decoded together")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random model and the sampled z")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg = config_for_command(a.configfile)
    bench_model = build_bench_model(cfg["data"]["tasks"], cfg["backbone"], cfg["lora"], cfg["cell"], a.seed)
    res = run(bench_model, a.n, a.max_new_tokens, a.batch_size, a.seed)
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(
            f"decode benchmark: {res['examples']} examples, <= {res['max_new_tokens']} new tokens, "
            f"{res['generated_tokens']} tokens, {res['threads']} threads, model {res['model']}"
        )
        print(f"  batched KV cache: {res['kv_cache_tokens_per_s']:9.1f} tokens/s ({res['kv_cache_s']:.2f} s)")
        print(f"  naive loop:       {res['naive_tokens_per_s']:9.1f} tokens/s ({res['naive_s']:.2f} s)")
        print(f"  speedup: {res['speedup']:.1f}x   outputs identical: {res['identical']}")
    if not res["identical"]:
        print(f"MISMATCH on examples {res['mismatched_examples']}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
