"""Entangle-step benchmark: the config's step (its `auto` settings resolved on this host, as the
stage resolves them) against the plain float32 step, with the CPU model and its bf16 support.

    python -m latentstrat.bench entangle [--configfile config/config.yaml] [--steps 40] [--threads 2] ...

Both steps are `latentstrat.base.entangle_step.train_step` (z-free NLL per supervised token, AdamW, grad
clip) on the same strategy-mixed, length-grouped batches of the six tasks, each from the same
initial weights:
- plain step: float32, SDPA attention, eager PyTorch;
- configured step: the config's `entangle.autocast`, `.attention`, `.compile` and `.processes`
  (the default: bf16 autocast matmuls, eager attention (on CPU, SDPA's bf16 backward is ~4x
  slower), the forward + loss through torch.compile, whose compile time falls in the warmup
  steps and is printed separately, and two data-parallel processes of `--threads / 2` threads
  each, every one on half of each batch, with one gradient all-reduce per step).

Tokens/s counts real (non-pad) tokens. Achieved FLOP/s uses 6 x parameters x tokens; the peaks
are measured matmuls in float32 and bfloat16; the configured step is set against the peak of the
dtype its matmuls run in.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from latentstrat import batching, encoding
from latentstrat.base.entangle_step import Records, make_optimizer, rank_share, step_settings, train_step
from latentstrat.bench.train import (
    _sync,
    add_data_and_model_args,
    embedded_backbone_cfg,
    matmul_peak,
    train_split_and_tokenizer,
)
from latentstrat.modeling.backbone import build_backbone
from latentstrat.runtime import parallel


def time_variant(bcfg, tok, work: tuple, device, args, ecfg: dict, rank: int = 0, world: int = 1) -> dict:
    """Tokens/s of `train_step` with `ecfg`'s step settings. Data parallel (`world` > 1, inside
    `parallel.workers`): this rank trains on rows rank::world of each batch, as the stage does.
    `work`: the encoded records and the batches of row indices to step through."""
    enc, batches = work
    torch.manual_seed(0)
    model = build_backbone(bcfg, tok).to(device).train()
    model.set_attn_implementation(ecfg["attention"])
    opt = make_optimizer(model, 1e-3, 0.1)
    step_nll, amp = step_settings(ecfg)

    def step(i):
        batch, n_supervised, n_tokens = rank_share(enc, batches[i % len(batches)], rank, world, device)
        train_step(model, opt, batch, step_nll, amp, n_supervised, world)
        return n_tokens

    _sync(device)
    t = time.perf_counter()
    for i in range(args.warmup):
        step(i)
    _sync(device)
    warmup_s = time.perf_counter() - t
    t, tokens = time.perf_counter(), 0
    for i in range(args.warmup, args.warmup + args.steps):
        tokens += step(i)
    _sync(device)
    dt = time.perf_counter() - t
    return {
        "tokens_per_s": tokens / dt,
        "ms_per_step": 1000 * dt / args.steps,
        "warmup_s": warmup_s,
        "params": sum(p.numel() for p in model.parameters()),
    }


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    df, tok = train_split_and_tokenizer(args)
    bcfg = embedded_backbone_cfg(args, "float32")
    enc = encoding.encode(df, tok)
    batches = list(
        batching.length_grouped_batches(encoding.strategy_free_lengths(df), args.batch_size, np.random.default_rng(0))
    )
    from latentstrat.base.entangle_step import PLAIN, SPEED_KEYS, choose_step_settings
    from latentstrat.config import config_for_command
    from latentstrat.runtime import host

    ecfg = config_for_command(args.configfile)["entangle"]
    choice = None
    if any(ecfg[k] == "auto" for k in SPEED_KEYS):  # resolved on this host, as the stage does
        torch.manual_seed(0)
        model = build_backbone(bcfg, tok).to(device)
        records = Records(enc, None, encoding.strategy_free_lengths(df))
        ecfg, choice = choose_step_settings(
            ecfg, model, records, device, args.threads, torch.float32, log=lambda m: None
        )
    fast_cfg = {k: ecfg[k] for k in SPEED_KEYS}
    plain = time_variant(bcfg, tok, (enc, batches), device, args, PLAIN)
    # as the stage runs it: with processes > 1, the threads split between processes
    fast = parallel.run(
        fast_cfg["processes"], args.threads, time_variant, (bcfg, tok, (enc, batches), device, args, fast_cfg)
    )
    n = plain["params"]
    peak32 = matmul_peak(device, torch.float32, args.matmul_n)
    peak16 = matmul_peak(device, torch.bfloat16, args.matmul_n)
    fast_dtype = "bfloat16" if fast_cfg["autocast"] == "bfloat16" else "float32"  # the configured step's matmuls
    return {
        "params": n,
        "device": str(device),
        "host": host.describe(),
        "auto_choice": choice,
        "threads": args.threads,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "configured": fast_cfg,
        "plain": plain,
        "fast": fast,
        "speedup": fast["tokens_per_s"] / plain["tokens_per_s"],
        "matmul_peak_float32": peak32,
        "matmul_peak_bfloat16": peak16,
        "plain_mfu_vs_float32_peak": 6 * n * plain["tokens_per_s"] / peak32,
        "fast_matmul_dtype": fast_dtype,
        "fast_mfu_vs_its_peak": 6 * n * fast["tokens_per_s"] / (peak16 if fast_dtype == "bfloat16" else peak32),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.bench entangle", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", default="config/config.yaml", help="the entangle step settings to time")
    add_data_and_model_args(ap, examples_per_task=500)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--batch-size", type=int, default=64, help="examples per step")
    ap.add_argument("--steps", type=int, default=40, help="timed steps")
    ap.add_argument(
        "--warmup",
        type=int,
        default=20,
        help="untimed first steps: the compiled step compiles in them, and once more at the first batch "
        "over 4096 tokens",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--matmul-n", type=int, default=1024, help="size of the matmul that measures the host's peak")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    res = run(args)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    p, f = res["plain"], res["fast"]
    flags = ", ".join(res["host"]["bf16_flags"]) or "no bf16 flags"
    h = res["host"]
    print(f"host: {h['cpu']} ({h['cpu_capability']}), native bf16: {h['native_bf16']} ({flags})")
    print(
        f"backbone: {res['params'] / 1e6:.2f}M params, {res['device']}, {res['threads']} threads, "
        f"batch {res['batch_size']}, {res['steps']} timed steps"
    )
    if res["auto_choice"]:
        trial = ", ".join(
            f"{r['autocast']}/{r['attention']}/compile {r['compile']}: {r['tokens_per_s']:,.0f}"
            for r in res["auto_choice"]["trial"]
        )
        print(f"auto: chose {res['auto_choice']['chosen']} (trial tokens/s per process: {trial or 'none needed'})")
    c = res["configured"]
    print(f"plain step (float32, sdpa):   {p['tokens_per_s']:9.0f} tokens/s  {p['ms_per_step']:6.1f} ms/step")
    print(
        f"configured step (autocast {c['autocast']}, attention {c['attention']}, compile {c['compile']}, "
        f"processes {c['processes']}): "
        f"{f['tokens_per_s']:.0f} tokens/s  {f['ms_per_step']:.1f} ms/step"
        f"  (first {args.warmup} steps, compile included: {f['warmup_s']:.1f} s)"
    )
    print(f"speedup:      {res['speedup']:.2f}x")
    print(
        f"achieved:     plain {100 * res['plain_mfu_vs_float32_peak']:.1f}% of float32 matmul peak "
        f"{res['matmul_peak_float32'] / 1e9:.1f} GFLOP/s; configured {100 * res['fast_mfu_vs_its_peak']:.1f}% of its "
        f"{res['fast_matmul_dtype']} peak (bfloat16 matmul peak {res['matmul_peak_bfloat16'] / 1e9:.1f} GFLOP/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
