"""The entangle stage's training step: one update on the z-free NLL (`train_step`: AdamW from
`make_optimizer`, grad clip GRAD_CLIP, a data-parallel rank's share of the batch from
`rank_share`) and the settings that make it fast on this host (`step_settings`: autocast and
torch.compile; `choose_step_settings`: `auto` resolved by timing the candidates of
`step_candidates`, docs/entangle.md). The stage's loop is `entangle.train_entangled`.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch

from latentstrat import batching, encoding
from latentstrat.modeling.backbone import device_of
from latentstrat.modeling.objective import zfree_token_nll
from latentstrat.runtime import host, parallel

GRAD_CLIP = 1.0


@dataclass(frozen=True, eq=False)
class Records:
    """What the entangled model trains and validates on: the encoded train split, the encoded
    validation split (None in the data-parallel workers, which do not validate), one grouping
    length per train row (`encoding.strategy_free_lengths`: batches group rows of similar length)
    and, when each epoch draws one strategy per train input, the rows of each input's
    strategies (`strategy_alternatives`; `train` then encodes those rows)."""

    train: encoding.Encoded
    val: encoding.Encoded | None
    group_lengths: list[float]
    alternatives: list[list[int]] | None = None


def make_optimizer(model, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (betas 0.9 / 0.95); weight decay on matrices only."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )


def autocast_for(model, dtype: torch.dtype):
    """Mixed precision for a low-precision backbone dtype (weights stay float32 for AdamW)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_of(model).type, dtype=dtype)


def train_step(
    model,
    opt,
    batch: batching.Batch | None,
    step_nll=zfree_token_nll,
    amp_dtype: torch.dtype = torch.float32,
    n_supervised: int | None = None,
    world: int = 1,
):
    """One update on the mean NLL per supervised token of the batch; returns (loss, grad norm).
    Data parallel (`world` > 1, `latentstrat.runtime.parallel`): `batch` is this rank's share of the
    global batch (None: an empty share) and `n_supervised` the global batch's supervised token
    count; the gradients and the loss are summed across ranks before clipping, so every rank
    takes the same update."""
    opt.zero_grad(set_to_none=True)
    if batch is None:
        loss = torch.zeros((), device=device_of(model))
    else:
        with autocast_for(model, amp_dtype):
            nll = step_nll(model, batch)
        loss = nll.sum() / (batch.sup_mask.sum() if n_supervised is None else n_supervised)
        loss.backward()
    if world > 1:
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        loss = loss.detach().reshape(1)
        parallel.all_reduce_sum([p.grad for p in params] + [loss])
        loss = loss[0]
    if not torch.isfinite(loss):
        raise FloatingPointError(f"entangle: non-finite training loss {loss.item()}")
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    opt.step()
    return loss, gnorm


def rank_share(enc: encoding.Encoded, idx: list[int], rank: int, world: int, device):
    """This rank's part of the global batch `idx` (rows rank::world; None if none), the global
    batch's supervised-token count (None in one process: `train_step` counts its batch) and its
    real (non-pad) tokens."""
    share = idx[rank::world]
    batch = batching.collate(enc, share).to(device) if share else None
    n_supervised = sum(len(enc.sup_ids[i]) for i in idx) if world > 1 else None
    return batch, n_supervised, sum(enc.lengths[i] for i in idx)


def step_settings(ecfg: dict, backbone_dtype: torch.dtype = torch.float32):
    """The training step's loss function and autocast dtype, per `entangle.compile` and
    `entangle.autocast` (a bfloat16 backbone always trains under bf16 autocast). Dynamic shapes:
    batches differ in length, and one compiled graph serves them all."""
    amp_dtype = torch.bfloat16 if ecfg["autocast"] == "bfloat16" else backbone_dtype
    step_nll = torch.compile(zfree_token_nll, dynamic=True) if ecfg["compile"] else zfree_token_nll
    return step_nll, amp_dtype


SPEED_KEYS = ("autocast", "attention", "compile", "processes")
PLAIN = {"autocast": "none", "attention": "sdpa", "compile": False}
TRIAL_BUDGET_S = 60.0
TRIAL_WARMUP, TRIAL_STEPS = 3, 8
MIN_GAIN = 1.05  # a candidate must beat the plain float32 step by this factor to be chosen


def step_candidates(ecfg: dict, device: torch.device) -> list[dict]:
    """The step settings worth timing on this host, plain float32 first. Settings the config
    gives explicitly (not `auto`) are kept in every candidate."""
    fixed = {k: ecfg[k] for k in PLAIN if ecfg[k] != "auto"}
    if device.type != "cpu":  # on a GPU: SDPA (flash) attention, no compile; a bf16 backbone autocasts anyway
        return [{**PLAIN, **fixed}]
    fast = None
    compiler = host.has_cxx_compiler()
    if host.native_bf16():  # bf16 matmuls in hardware: bf16 autocast, eager attention (SDPA's bf16 backward is slow)
        fast = {"autocast": "bfloat16", "attention": "eager", "compile": compiler}
    elif compiler:  # no native bf16: emulated bf16 runs at ~0.66x of float32, so only compile is worth a try
        fast = {"autocast": "none", "attention": "sdpa", "compile": True}
    out = [{**PLAIN, **fixed}]
    if fast is not None and {**fast, **fixed} not in out:
        out.append({**fast, **fixed})
    return out


def time_step(
    model,
    enc: encoding.Encoded,
    batches: list[list[int]],
    settings: dict,
    ecfg: dict,
    backbone_dtype: torch.dtype,
    world: int,
) -> float:
    """Tokens/s of rank 0's share of `batches` with `settings`, on a copy of `model` (the model
    itself is untouched), after TRIAL_WARMUP untimed steps (compilation happens there)."""
    trial = copy.deepcopy(model)
    trial.set_attn_implementation(settings["attention"])
    trial.train()
    opt = make_optimizer(trial, ecfg["lr"], ecfg["weight_decay"])
    step_nll, amp = step_settings({**ecfg, **settings}, backbone_dtype)
    dev = device_of(trial)
    tokens, elapsed = 0, 0.0
    for k, idx in enumerate(batches):
        batch, _, _ = rank_share(enc, idx, 0, world, dev)
        t0 = time.perf_counter()
        train_step(trial, opt, batch, step_nll, amp)
        if k >= TRIAL_WARMUP:
            elapsed += time.perf_counter() - t0
            tokens += int(batch.gen_mask.sum())
    torch._dynamo.reset()
    return tokens / max(elapsed, 1e-9)


def choose_step_settings(
    ecfg: dict, model, records: Records, device: torch.device, threads: int, backbone_dtype: torch.dtype, log=print
) -> tuple[dict, dict]:
    """Resolve `auto` speed settings (autocast, attention, compile, processes) for this host.

    processes: 2 one-thread processes on a CPU with >= 2 threads (bit-reproducible, and on 2
    cores as fast as one 2-thread process or faster), else 1. The rest: the candidates of
    `step_candidates` (a capability probe: bf16 only with native bf16), each timed for a few
    steps on real batches within TRIAL_BUDGET_S; a candidate is chosen only when it beats plain
    float32 by MIN_GAIN, so the choice is never slower than plain float32. Returns (the
    resolved entangle settings, a record of the choice and its measured tokens/s)."""
    auto = [k for k in SPEED_KEYS if ecfg[k] == "auto"]
    resolved = dict(ecfg)
    record = {"auto": auto, "host": host.describe(), "trial": []}
    if ecfg["processes"] == "auto":
        resolved["processes"] = 2 if device.type == "cpu" and threads >= 2 else 1
    world = resolved["processes"]
    candidates = step_candidates(ecfg, device)
    if len(candidates) == 1 or not [k for k in auto if k != "processes"]:
        resolved.update(candidates[0] if [k for k in auto if k != "processes"] else {})
        record["chosen"] = {k: resolved[k] for k in SPEED_KEYS}
        return resolved, record
    rng = np.random.default_rng(ecfg["seed"] + 1)
    epochs = (
        b
        for _ in itertools.count()
        for b in batching.epoch_batches(records.group_lengths, ecfg["batch_size"], rng, records.alternatives)
    )
    batches = list(itertools.islice(epochs, TRIAL_WARMUP + TRIAL_STEPS))
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // world))  # one rank's share of the cores, as in training
    t0 = time.time()
    try:
        for cand in candidates:
            if record["trial"] and time.time() - t0 > TRIAL_BUDGET_S:
                log(f"entangle: step trial budget ({TRIAL_BUDGET_S:.0f} s) spent; not timing {cand}")
                break
            tps = time_step(model, records.train, batches, cand, ecfg, backbone_dtype, world)
            record["trial"].append({**cand, "tokens_per_s": tps})
            log(f"entangle: step trial {cand}: {tps:,.0f} tokens/s per process")
    finally:
        torch.set_num_threads(prev_threads)
    plain = record["trial"][0]["tokens_per_s"]
    best = max(record["trial"], key=lambda r: r["tokens_per_s"])
    pick = best if best["tokens_per_s"] >= MIN_GAIN * plain else record["trial"][0]
    resolved.update({k: pick[k] for k in PLAIN})
    record.update(
        chosen={k: resolved[k] for k in SPEED_KEYS},
        speedup_vs_plain=pick["tokens_per_s"] / plain,
        trial_s=time.time() - t0,
    )
    log(
        f"entangle: step settings {record['chosen']} ({record['speedup_vs_plain']:.2f}x the plain float32 step, "
        f"{host.cpu_model()}, native bf16: {host.native_bf16()})"
    )
    return resolved, record
