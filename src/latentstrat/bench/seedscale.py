"""Seed-scale check: one cell of the cluster config on Qwen2.5-0.5B's architecture, here.

    python -m latentstrat.bench seedscale [--configfile config/qwen25-05b.yaml] [--device cpu|cuda]
        [--batch-size 4] [--steps 2] [--threads 2] [--layers N]

Builds Qwen2.5-0.5B from its published configuration (QWEN25_05B: 24 layers, hidden size 896,
14 query heads over 2 key-value heads, a 151,936-token vocabulary, tied embeddings) with random
weights (nothing is downloaded), in the config's `backbone.dtype`, and wraps it as a cell does:
model.LatentStrategyModel with the config's LoRA (two peft adapters, r, alpha, target modules),
router and posterior heads and z projection at the config's latent_dim. On records of the
embedded tasks (the word-level tokenizer's ids lie inside the vocabulary), it runs:
- `--steps` train steps (2 or more) of the trainer's objective (objective.forward_losses with the
  cell's family and beta, b from the same backbone before its adapters, the trainer's AdamW with
  float32 masters for the bf16 adapters, clipping at 1),
  checking finite losses and non-zero adapter gradients; the step time is the median of the steps
  after the first (the first pays for allocations and kernel selection);
- one validation pass (the objective on held-out records, no gradient);
- a 16-token greedy decode with a chosen z (decode.decode_batch, the one decode core).
It prints the parameter counts (frozen, adapters, heads), the peak memory, the analytic FLOPs of
the cell step (`step_flops`) and the measured throughput; docs/performance.md turns those into GPU
time per cell. `--layers` keeps fewer of the 24 layers (a smaller, faster check of the same
shapes; the counts then say so), `--hidden` a narrower model of the same depth. `--count-step`
adds the trainer's step against the library step it replaced (bench.step: kernel ops, host
syncs, host ms per step, graph breaks, outputs); `--hidden 128 --batch-size 8 --layout padded`
counts the GPU path's step at a host-bound shape on a CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from latentstrat import batching, encoding
from latentstrat.base import data
from latentstrat.base.reference import reference_nll
from latentstrat.bench import step as step_bench
from latentstrat.cell.train import batch_at, optimizer, step_noise
from latentstrat.config import config_for_command
from latentstrat.modeling import objective as obj
from latentstrat.modeling.backbone import build_backbone, device_of
from latentstrat.modeling.decode import decode_batch, encode_prompts
from latentstrat.modeling.model import HEAD_PREFIXES, LatentStrategyModel
from latentstrat.modeling.objective import Objective, forward_losses
from latentstrat.runtime import host

# Qwen/Qwen2.5-0.5B's config.json as published (architecture only: the weights here are random)
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": False,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN25_05B_PARAMETERS = 494_032_768  # the published model's count (tied embeddings counted once)


def parameter_counts(model) -> dict:
    """Frozen backbone, LoRA adapters (both) and the latent model's heads + z projection."""
    counts = {"frozen": 0, "adapters": 0, "heads": 0}
    for name, p in model.named_parameters():
        if name.startswith(HEAD_PREFIXES):
            counts["heads"] += p.numel()
        elif ".lora_" in name:
            counts["adapters"] += p.numel()
        else:
            counts["frozen"] += p.numel()
    return counts


def step_flops(arch: dict, counts: dict, tokens: int, supervised: int) -> float:
    """Model FLOPs of one cell step over `tokens` (generator records + posterior inputs) of
    which `supervised` are predicted: per token, forward 2 N (N: the layers' matmul weights)
    plus backward 2 N for the activations' gradients (LoRA trains no frozen weight: no weight
    gradients), plus 6 x the adapters' own parameters; per supervised token, the output
    projection forward and backward, 4 x hidden x vocabulary. Attention's score FLOPs are left
    out (records of about 100 tokens)."""
    n = arch["num_hidden_layers"] * layer_matmul_params(arch)
    return (4 * n + 6 * counts["adapters"]) * tokens + 4 * arch["hidden_size"] * arch["vocab_size"] * supervised


def layer_matmul_params(arch: dict) -> int:
    h, i = arch["hidden_size"], arch["intermediate_size"]
    kv = h // arch["num_attention_heads"] * arch["num_key_value_heads"]
    return h * h + 2 * h * kv + h * h + 3 * h * i  # q, k and v, o, gate / up / down


def peak_memory_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def records(batch_size: int):
    """A train and a held-out split of the embedded tasks and their word-level tokenizer."""
    df = data.generate(
        {
            "seed": 0,
            "tasks": ["sorting_algorithms", "grid_pathfinding", "multidigit_addition", "linear_equations"],
            "train_per_task": max(2, batch_size),
            "validation_per_task": 1,
            "test_per_task": 1,
        }
    )
    tok = encoding.record_tokenizer(data.build_tokenizer(encoding.render_record(x, y) for x, y in zip(df.x, df.y)))
    return df[df.split == "train"].reset_index(drop=True), df[df.split == "validation"].reset_index(drop=True), tok


def train_steps(model, objective, enc, b_train, lr: float, batch_size: int, steps: int):
    """`steps` train steps of the cell's objective (AdamW, clipping at 1): per step the loss, the
    pre-clip gradient norm, the largest adapter gradient and the wall time; the last step's tokens
    and supervised tokens."""
    dev, latent_dim = device_of(model), model.latent_dim
    opt = optimizer(model.trainable_parameters(), lr, 0.01)
    model.train()
    losses, grad_norms, adapter_grads, step_s, tokens, supervised = [], [], [], [], 0, 0
    for step in range(steps):
        idx = batch_at(enc.task_idx, batch_size, 0, step)
        batch = batching.collate(enc, idx, b_train).to(dev)
        t = time.perf_counter()
        out = forward_losses(model, batch, objective, step, step_noise(0, step, (len(idx), latent_dim)))
        opt.zero_grad(set_to_none=True)
        out["total"].backward()
        adapter_grads.append(
            max(float(p.grad.abs().max()) for n, p in model.named_parameters() if ".lora_" in n and p.grad is not None)
        )
        opt.gather()
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(opt.params, 1.0)))
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t)
        losses.append(float(out["total"].detach()))
        tokens = int(batch.gen_mask.sum() + batch.post_mask.sum())
        supervised = int(batch.sup_mask.sum())
    return losses, grad_norms, adapter_grads, step_s, tokens, supervised


def architecture(layers: int | None, hidden: int | None) -> dict:
    """Qwen2.5-0.5B's configuration, with `layers` of its 24 layers and, given `hidden`, a
    narrower model of the same depth and head size (a host-bound shape for counting)."""
    arch = {**QWEN25_05B, "num_hidden_layers": layers or QWEN25_05B["num_hidden_layers"]}
    if hidden:
        arch.update(
            hidden_size=hidden,
            intermediate_size=4 * hidden,
            num_attention_heads=max(2, hidden // 64),
            num_key_value_heads=2,
        )
    return arch


def run(args) -> dict:
    cfg = config_for_command(args.configfile)
    cell_cfg, dtype = cfg["cell"], cfg["backbone"]["dtype"]
    dev = torch.device(args.device)
    torch.set_num_threads(args.threads)
    arch = architecture(args.layers, args.hidden)
    train_df, val_df, tok = records(args.batch_size)
    assert len(tok) <= arch["vocab_size"], "the tokenizer's ids must lie inside the vocabulary"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(arch))
        bcfg = {"source": "config_json", "name_or_path": d, "dtype": dtype}
        torch.manual_seed(0)
        t0 = time.perf_counter()
        backbone = build_backbone(bcfg).to(dev)
    build_s = time.perf_counter() - t0
    z_slots, latent_dim = int(cell_cfg["z_slots"]), int(cell_cfg["latent_dim"])
    enc, val = encoding.encode(train_df, tok, z_slots), encoding.encode(val_df, tok, z_slots)
    b_train, b_val = reference_nll(backbone, enc, args.batch_size), reference_nll(backbone, val, args.batch_size)
    model = LatentStrategyModel(backbone, latent_dim, z_slots, "lora", cfg["lora"]).to(dev)
    counts = parameter_counts(model)
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.trainable_parameters()})
    cell = {
        "reconstruction_family": "dist_norm",
        "token_aggregation": cell_cfg["token_aggregation"],
        "beta": 0.01,
        "beta_schedule": "constant",
        "posterior_variance_weight": 0.0,
        "router_marginal_kl_weight": 0.0,
    }
    n_bar = float(train_df.n_supervised.mean())
    s_ref, t_ref = obj.reference_scales(b_val, cell["token_aggregation"], 0.25, n_bar)
    objective = Objective.with_scales(cell, {"S_ref": s_ref, "T_ref": t_ref, "n_bar": n_bar})
    losses, grad_norms, adapter_grads, step_s, tokens, supervised = train_steps(
        model, objective, enc, b_train, cfg["train"]["lr"], args.batch_size, args.steps
    )
    model.eval()
    with torch.no_grad():
        vb = batching.collate(val, list(range(len(val))), b_val).to(dev)
        val_loss = float(forward_losses(model, vb, objective, 2, step_noise(1, 0, (len(val), latent_dim)))["total"])
        prompts = encode_prompts(tok, list(val_df.x[:2]), z_slots)
        z = torch.randn(2, latent_dim, generator=torch.Generator().manual_seed(1)).to(dev)
        t = time.perf_counter()
        generated = decode_batch(model, tok, prompts.prompt, prompts.slot_pos, z, 16)
        decode_s = time.perf_counter() - t
    flops = step_flops(arch, counts, tokens, supervised)
    stepped = None
    if args.count_step:
        model.train()
        stepped = step_bench.compare(model, objective, (enc, b_train), args.batch_size, 1e-4, kind=args.layout)
    return {
        "step": stepped,
        "host": host.cpu_label() if dev.type == "cpu" else torch.cuda.get_device_name(dev),
        "device": str(dev),
        "threads": args.threads,
        "layers": arch["num_hidden_layers"],
        "hidden": arch["hidden_size"],
        "backbone_dtype": dtype,
        "trainable_dtypes": dtypes,
        "parameters": counts,
        "backbone_parameters": counts["frozen"],
        "published_parameters": QWEN25_05B_PARAMETERS if not (args.layers or args.hidden) else None,
        "build_s": build_s,
        "losses": losses,
        "grad_norms": grad_norms,
        "adapter_grad_max": adapter_grads,
        "validation_loss": val_loss,
        "decoded_tokens": [len(g) for g in generated],
        "decode_s": decode_s,
        "step_tokens": tokens,
        "step_supervised_tokens": supervised,
        "batch_size": args.batch_size,
        "step_s": step_s,
        "step_median_s": statistics.median(step_s[1:]),
        "tokens_per_s": tokens / statistics.median(step_s[1:]),
        "step_flops": flops,
        "achieved_flops": flops / statistics.median(step_s[1:]),
        "peak_memory_mb": peak_memory_mb(dev),
    }


def render(r: dict) -> str:
    c = r["parameters"]
    pub = f" (published Qwen2.5-0.5B: {r['published_parameters']:,})" if r["published_parameters"] else ""
    return "\n".join(
        [
            f"host: {r['host']}, {r['device']}, {r['threads']} threads; {r['layers']} layers, backbone "
            f"{r['backbone_dtype']}, adapters and heads {'/'.join(r['trainable_dtypes'])}",
            f"parameters: backbone (frozen) {c['frozen']:,}{pub}; adapters {c['adapters']:,}; heads + z "
            f"projection {c['heads']:,}",
            f"train steps: loss {r['losses'][0]:.4f} ... {r['losses'][-1]:.4f}; pre-clip gradient norm "
            f"{r['grad_norms'][0]:.3g} ... {r['grad_norms'][-1]:.3g}; largest adapter gradient "
            f"{min(r['adapter_grad_max']):.3g} or more",
            f"validation loss {r['validation_loss']:.4f}; decode: {r['decoded_tokens']} tokens in "
            f"{r['decode_s']:.1f} s",
            f"step: {r['step_tokens']} tokens ({r['step_supervised_tokens']} supervised, "
            f"{r['batch_size']} examples) in "
            f"{r['step_median_s']:.3f} s (median of {len(r['step_s']) - 1} after the first) = "
            f"{r['tokens_per_s']:,.0f} tokens/s; {r['step_flops'] / 1e12:.3f} TFLOP "
            f"-> {r['achieved_flops'] / 1e9:.1f} GFLOP/s",
            f"peak memory: {r['peak_memory_mb']:,.0f} MB ({'GPU allocated' if r['device'] == 'cuda' else 'RSS'})",
            *(step_bench.render(r["step"]) if r["step"] else []),
        ]
    )


def check(r: dict) -> list[str]:
    """What must hold for the check to pass: finite losses, adapters that get gradients, tokens."""
    bad = []
    if not all(math.isfinite(x) for x in [*r["losses"], r["validation_loss"], *r["grad_norms"]]):
        bad.append(f"non-finite loss or gradient norm: {r['losses']}, {r['validation_loss']}, {r['grad_norms']}")
    if not all(g > 0 for g in r["adapter_grad_max"]):
        bad.append(f"adapters got no gradient: {r['adapter_grad_max']}")
    if not all(n > 0 for n in r["decoded_tokens"]):
        bad.append(f"the decode returned no token: {r['decoded_tokens']}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.bench seedscale", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument(
        "--configfile", default="config/qwen25-05b.yaml", help="the cluster collection config whose cell is measured"
    )
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--batch-size", type=int, default=4, help="examples per step")
    ap.add_argument("--steps", type=int, default=2, help="train steps (2 or more); timed: those after the first")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--layers", type=int, default=None, help="keep this many of the 24 layers")
    ap.add_argument("--hidden", type=int, default=None, help="a narrower model (hidden size; MLP 4x, 64-wide heads)")
    ap.add_argument(
        "--count-step",
        action="store_true",
        help="also count the trainer's step against the library step (ops, syncs, host ms, graph breaks)",
    )
    ap.add_argument(
        "--layout", default=None, choices=["packed", "padded"], help="the trainer step's layout in the step count"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the numbers to this JSON file")
    a = ap.parse_args(argv)
    if a.steps < 2:
        ap.error("--steps must be 2 or more (the first step is not timed)")
    r = run(a)
    print(render(r))
    if a.out:
        a.out.write_text(json.dumps(r, indent=2, default=float))
    bad = check(r)
    for b in bad:
        print(f"FAILED: {b}")
    return 1 if bad else 0
