"""Train-step benchmark: the trainer's step against a naive step, in one process.

    python -m latentstrat.bench train [--steps 10] [--batch-size 32] [--threads 2] ...
    python -m latentstrat.bench train --config-json qwen2.5-0.5b/config.json --dtype bfloat16 --device cuda

Trainer step: the cell trainer's (latentstrat.modeling.objective.forward_losses on train.batch_at's
task-mixed batches with train.step_noise's z noise, AdamW; without the gradient clipping): one
posterior pass + one router/generator pass through the fast pass (backbone.hidden_at: packed
over the real tokens on a CPU, padded without an attention mask on a GPU), b read from a table
computed once, logits only at supervised positions. Naive step: three separate passes of
transformers' padded forward (posterior, generator with full logits, and a z-free reference
pass recomputing b every step), every batch padded to the longest sequence of the dataset,
random batches. Both optimize the same objective (active reconstruction + beta x KL of CELL;
its penalty weights are 0) on the same train split, not on the same batches. Also timed: the
trainer's step with transformers' padded passes instead of packed ones and under bf16 autocast
(which the trainer does not use), and the no-grad pass of validation and evaluation on merged
adapters against the LoRA layers. Last, the trainer's whole step (train.train_step) against the
library step it replaced (bench.step: kernel ops, host syncs and host ms per step, graph
breaks, and both steps' outputs from the same weights).

The trainer's and the naive step are timed in alternating rounds (`--rounds`, `--steps` each);
the speedup is the median of the rounds' ratios, printed with their range.

Tokens/s counts the real (non-pad) tokens of the two trained passes (generator record +
posterior input) per second, the same numerator for both, so the ratio is the speedup in
examples/s. Achieved FLOP/s uses model FLOPs = 6 x backbone parameters x those tokens (the
usual 6ND count: forward 2ND + backward 4ND, even though LoRA skips the frozen weights'
gradients); peak = a measured matmul (fp32 on CPU, the model dtype on GPU).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import numpy as np
import torch

from latentstrat import batching, encoding
from latentstrat.base import data
from latentstrat.base.reference import reference_nll
from latentstrat.bench import step as step_bench
from latentstrat.cell.train import batch_at, step_noise
from latentstrat.modeling import objective as obj
from latentstrat.modeling.backbone import build_backbone
from latentstrat.modeling.model import LatentStrategyModel
from latentstrat.modeling.objective import Objective, forward_losses
from latentstrat.runtime import host

CELL = {
    "reconstruction_family": "dist_tokcc_0.05_0.95",
    "token_aggregation": "sum",
    "beta": 0.1,
    "beta_schedule": "constant",
    "posterior_variance_weight": 0.0,
    "router_marginal_kl_weight": 0.0,
}


def matmul_peak(device, dtype, n: int, reps: int = 10) -> float:
    """Best FLOP/s of an n x n matmul."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 2):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def pad_to(batch: batching.Batch, widths: dict, pad_id: int) -> batching.Batch:
    """Right-pad a batch's sequences to fixed widths (the dataset's longest)."""
    out = dict(batch.__dict__)
    for ids, mask in (("gen_ids", "gen_mask"), ("post_ids", "post_mask")):
        extra = widths[ids] - out[ids].shape[1]
        out[ids] = torch.nn.functional.pad(out[ids], (0, extra), value=pad_id)
        out[mask] = torch.nn.functional.pad(out[mask], (0, extra), value=0)
    return batching.Batch(**out)


def naive_losses(model, entangled, batch, objective: Objective, eps):
    """Three passes: z-free reference (b recomputed), posterior, generator (full logits)."""
    with torch.no_grad():
        zfree_logits = entangled(input_ids=batch.gen_ids, attention_mask=batch.gen_mask).logits
        rows = torch.arange(len(batch))[:, None]
        b = obj.token_nll(zfree_logits[rows, batch.gen_sup_pos], batch.sup_ids)
    mu_q, logvar_q = model.posterior(batch.post_ids, batch.post_mask)
    z = mu_q + torch.exp(0.5 * logvar_q) * eps
    logits, mu_r, logvar_r = model.generator(batch.gen_ids, batch.gen_mask, z, batch.z_open_pos, batch.z_slot_pos)
    nll = obj.token_nll(logits[rows, batch.gen_sup_pos], batch.sup_ids)
    o = objective
    rec = obj.reconstruction(nll, b, batch.sup_mask, o.family, o.aggregation, o.scales)
    return rec["active"] + o.beta * obj.gaussian_kl(mu_q, logvar_q, mu_r, logvar_r).mean()


def add_data_and_model_args(ap, examples_per_task: int) -> None:
    """The options both step benchmarks share: which tasks, how many examples, the embedded model."""
    ap.add_argument(
        "--tasks",
        default="sorting_algorithms,grid_pathfinding,multidigit_addition,linear_equations,"
        "base_conversion,list_reversal",
        help="comma-separated tasks of the benchmark's data",
    )
    ap.add_argument("--examples-per-task", type=int, default=examples_per_task, help="training examples per task")
    ap.add_argument("--hidden", type=int, default=128, help="embedded model: hidden size")
    ap.add_argument("--intermediate", type=int, default=512, help="embedded model: MLP size")
    ap.add_argument("--layers", type=int, default=4, help="embedded model: layers")
    ap.add_argument("--heads", type=int, default=4, help="embedded model: attention heads")
    ap.add_argument("--kv-heads", type=int, default=2, help="embedded model: key/value heads")


def train_split_and_tokenizer(args):
    """A fresh train split of `args.tasks` and a tokenizer built on it."""
    df = data.generate(
        {
            "seed": 0,
            "tasks": args.tasks.split(","),
            "train_per_task": args.examples_per_task,
            "validation_per_task": 1,
            "test_per_task": 1,
        }
    )
    df = df[df.split == "train"].reset_index(drop=True)
    tok = encoding.record_tokenizer(data.build_tokenizer(encoding.render_record(x, y) for x, y in zip(df.x, df.y)))
    return df, tok


def embedded_backbone_cfg(args, dtype: str) -> dict:
    return {
        "source": "embedded",
        "dtype": dtype,
        "embedded": {
            "hidden_size": args.hidden,
            "intermediate_size": args.intermediate,
            "num_hidden_layers": args.layers,
            "num_attention_heads": args.heads,
            "num_key_value_heads": args.kv_heads,
            "max_position_embeddings": 512,
        },
    }


def build(args):
    df, tok = train_split_and_tokenizer(args)
    if args.config_json:
        bcfg = {"source": "config_json", "name_or_path": args.config_json, "dtype": args.dtype}
    else:
        bcfg = embedded_backbone_cfg(args, args.dtype)
    torch.manual_seed(0)
    entangled = build_backbone(bcfg, tok)
    return df, tok, bcfg, entangled


def time_steps(step_fn, n_steps: int, warmup: int, device) -> tuple[float, int]:
    for i in range(warmup):
        step_fn(i)
    _sync(device)
    t, tokens = time.perf_counter(), 0
    for i in range(warmup, warmup + n_steps):
        tokens += step_fn(i)
    _sync(device)
    return time.perf_counter() - t, tokens


def setup(args, device):
    """The frozen entangled model, the latent model on a copy of it, its optimizer, the encoded
    train split, b computed once up front (what the reference stage stores) and the objective with its scales."""
    df, tok, bcfg, entangled = build(args)
    entangled = entangled.to(device).eval()
    for p in entangled.parameters():
        p.requires_grad_(False)
    model = LatentStrategyModel(copy.deepcopy(entangled), args.latent_dim, 1, args.adaptation, {"r": 8}).to(device)
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=1e-4)
    enc = encoding.encode(df, tok)
    b = reference_nll(entangled, enc, args.batch_size)
    n_bar = float(df.n_supervised.mean())
    s_ref, t_ref = obj.reference_scales(b, CELL["token_aggregation"], 0.25, n_bar)
    objective = Objective.with_scales(CELL, {"S_ref": s_ref, "T_ref": t_ref, "n_bar": n_bar})
    return bcfg, entangled, model, opt, enc, b, objective


def time_eval_passes(model, enc, b, objective, args, device) -> tuple[tuple[float, int], tuple[float, int]]:
    """The no-grad pass of validation and evaluation (the adapters have moved by now), timed on
    the LoRA layers and on merged copies of the backbone (model.merged(), the copies made inside
    the timed block, as a validation makes them): ((seconds, tokens) LoRA, (seconds, tokens) merged)."""

    @torch.no_grad()
    def eval_pass(i):
        idx = batch_at(enc.task_idx, args.batch_size, 0, i)
        batch = batching.collate(enc, idx, b).to(device)
        forward_losses(model, batch, objective, i, step_noise(0, i, (len(idx), args.latent_dim)))
        return int(batch.gen_mask.sum() + batch.post_mask.sum())

    model.eval()
    lora = time_steps(eval_pass, args.steps, args.warmup, device)
    with torch.no_grad():
        t0 = time.perf_counter()
        with model.merged():
            t_merge = time.perf_counter() - t0
            t_merged, tok_merged = time_steps(eval_pass, args.steps, args.warmup, device)
    return lora, (t_merged + t_merge, tok_merged)


def alternating_rounds(model, trainer_step, naive_step, args, device) -> list:
    """The trainer's and the naive step, timed in alternating rounds: a machine's speed drifts
    (other tenants of a VM), and a ratio of two back-to-back timings moves with it. Per round
    ((seconds, tokens) of the trainer's steps, the same of the naive steps)."""
    rounds = []
    for r in range(args.rounds):
        fast_r = time_steps(trainer_step, args.steps, args.warmup if r == 0 else 0, device)
        # the naive step runs transformers' padded passes: with the packed pass on, its padding to
        # the dataset's longest record would be stripped from every per-token layer again, and
        # the "naive" step would share the trainer's main optimization (it read 1.09x that way)
        with step_bench.library(model):
            naive_r = time_steps(naive_step, args.steps, args.warmup if r == 0 else 0, device)
        rounds.append((fast_r, naive_r))
    return rounds


def padded_and_bf16(trainer_step, args, device) -> tuple:
    """The trainer's step with transformers' padded passes instead of packed ones, and under bf16
    autocast: what the cell trainer's choices are measured against on this host."""
    with step_bench.layout("transformers"):
        padded = time_steps(trainer_step, args.steps, args.warmup, device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        bf16 = time_steps(trainer_step, args.steps, args.warmup, device)
    return padded, bf16


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    bcfg, entangled, model, opt, enc, b, objective = setup(args, device)
    n_params = sum(p.numel() for p in entangled.parameters())
    model.train()
    widths = {"gen_ids": max(enc.lengths), "post_ids": max(map(len, enc.post_ids))}
    rng = np.random.default_rng(0)

    def update(loss):
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def trainer_step(i):
        idx = batch_at(enc.task_idx, args.batch_size, 0, i)
        batch = batching.collate(enc, idx, b).to(device)
        update(forward_losses(model, batch, objective, i, step_noise(0, i, (len(idx), args.latent_dim)))["total"])
        return int(batch.gen_mask.sum() + batch.post_mask.sum())

    def naive_step(i):
        idx = rng.choice(len(enc), size=args.batch_size, replace=False).tolist()
        batch = pad_to(batching.collate(enc, idx), widths, enc.pad_id).to(device)
        eps = step_noise(0, i, (len(idx), args.latent_dim)).to(device)
        update(naive_losses(model, entangled, batch, objective, eps))
        return int(batch.gen_mask.sum() + batch.post_mask.sum())

    rounds = alternating_rounds(model, trainer_step, naive_step, args, device)
    t_fast, tok_fast = (sum(x) for x in zip(*(f for f, _ in rounds)))
    t_naive, tok_naive = (sum(x) for x in zip(*(n for _, n in rounds)))
    # the ratio reported is the median of the rounds' ratios; tokens/s are over all rounds
    ratios = sorted((tf_tok / tf) / (tn_tok / tn) for (tf, tf_tok), (tn, tn_tok) in rounds)
    (t_padded, tok_padded), (t_bf16, tok_bf16) = padded_and_bf16(trainer_step, args, device)
    (t_lora_eval, tok_lora_eval), (t_merged_eval, tok_merged_eval) = time_eval_passes(
        model, enc, b, objective, args, device
    )
    stepped = step_bench.compare(model, objective, (enc, b), args.batch_size, 1e-4, kind=args.layout)
    peak_dtype = torch.float32 if device.type == "cpu" else model.dtype_
    peak = matmul_peak(device, peak_dtype, args.matmul_n)
    fast, naive = tok_fast / t_fast, tok_naive / t_naive
    res = {
        "backbone": bcfg,
        "params": n_params,
        "device": str(device),
        "threads": args.threads,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "host": host.describe(),
        "trainer_tokens_per_s": fast,
        "naive_tokens_per_s": naive,
        "speedup": statistics.median(ratios),
        "speedup_rounds": ratios,
        "padded_tokens_per_s": tok_padded / t_padded,
        "bf16_autocast_tokens_per_s": tok_bf16 / t_bf16,
        "eval_lora_tokens_per_s": tok_lora_eval / t_lora_eval,
        "eval_merged_tokens_per_s": tok_merged_eval / t_merged_eval,
        "trainer_flops_per_s": 6 * n_params * fast,
        "matmul_peak_flops_per_s": peak,
        "peak_dtype": str(peak_dtype).replace("torch.", ""),
        "mfu_vs_matmul_peak": 6 * n_params * fast / peak,
        "flops_note": "model FLOPs = 6 x backbone params x real tokens of the two trained passes",
        "step": stepped,
    }
    if args.peak_flops:
        res["mfu_vs_nominal_peak"] = 6 * n_params * fast / args.peak_flops
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.bench train", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    add_data_and_model_args(ap, examples_per_task=64)
    ap.add_argument("--config-json", help="random init from this config JSON (e.g. a Qwen2.5-0.5B config.json)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="backbone weights' dtype")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument(
        "--adaptation", default="lora", choices=["lora", "full", "frozen"], help="what of the backbone trains"
    )
    ap.add_argument("--latent-dim", type=int, default=64, help="size of z")
    ap.add_argument("--batch-size", type=int, default=32, help="examples per step")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the trainer's and the naive step")
    ap.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--matmul-n", type=int, default=1024, help="size of the matmul that measures the host's peak")
    ap.add_argument(
        "--peak-flops", type=float, default=None, help="nominal device peak (e.g. 989e12 for H100/H200 bf16 dense)"
    )
    ap.add_argument(
        "--layout",
        default=None,
        choices=["packed", "padded"],
        help="the trainer step's layout in the step count (default: the device's; padded = the GPU path's)",
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    res = run(args)
    if args.json:
        print(json.dumps(res, indent=2, default=str))
        return 0
    h = res["host"]
    flags = f" ({', '.join(h['bf16_flags'])})" if h["bf16_flags"] else ""
    print(f"host: {h['cpu']} ({h['cpu_capability']}), native bf16: {h['native_bf16']}{flags}")
    print(
        f"backbone: {res['params'] / 1e6:.2f}M params, {res['device']}, {res['threads']} threads, "
        f"batch {res['batch_size']}"
    )
    fast = res["trainer_tokens_per_s"]
    print(f"trainer step (float32, packed passes):  {fast:9.0f} tokens/s")
    print(
        f"  transformers' padded passes:          {res['padded_tokens_per_s']:9.0f} tokens/s  "
        f"(packed: {fast / res['padded_tokens_per_s']:.2f}x)"
    )
    print(
        f"  under bf16 autocast (not used):       {res['bf16_autocast_tokens_per_s']:9.0f} tokens/s  "
        f"({res['bf16_autocast_tokens_per_s'] / fast:.2f}x the trainer step)"
    )
    print(f"naive step:                             {res['naive_tokens_per_s']:9.0f} tokens/s")
    merged, lora = res["eval_merged_tokens_per_s"], res["eval_lora_tokens_per_s"]
    print(
        f"no-grad pass (validation, evaluation), merged adapters: {merged:9.0f} tokens/s  "
        f"(LoRA layers {lora:.0f} tokens/s: {merged / lora:.2f}x)"
    )
    lo, hi = min(res["speedup_rounds"]), max(res["speedup_rounds"])
    print(f"speedup:      {res['speedup']:.2f}x (median of {len(res['speedup_rounds'])} rounds, {lo:.2f}-{hi:.2f}x)")
    print(
        f"achieved:     {res['trainer_flops_per_s'] / 1e9:.2f} GFLOP/s (6 x params x tokens) = "
        f"{100 * res['mfu_vs_matmul_peak']:.1f}% of measured {res['peak_dtype']} matmul peak "
        f"{res['matmul_peak_flops_per_s'] / 1e9:.2f} GFLOP/s"
    )
    if "mfu_vs_nominal_peak" in res:
        print(f"MFU vs nominal peak: {100 * res['mfu_vs_nominal_peak']:.1f}%")
    print("\n".join(step_bench.render(res["step"])))
    return 0
