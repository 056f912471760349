"""Entangle stage: train the z-free (entangled) model p(y|x) on the task mixture and check that
it is a real multi-strategy model (design sections 3 and 5.2, docs/design.md).

    python -m latentstrat.entangle --config config/config.yaml [--threads N]

Records are the latent layout with a neutral slot, `<bos> <x> .. </x> <z> [Z]*P </z> <y> .. </y>
<eos>` (P = entangle.z_slots; no z is written into the slot), so the slot tokens are the
entangled model's own and a cell starts as this model (docs/design.md, "Initialization"); the
loss is the mean NLL over the supervised tokens (y tokens, `</y>`, `<eos>`). The embedded default trains from
scratch; a pretrained backbone is fine-tuned; `entangle.mode: skip` uses the backbone as is; `entangle.mode: shipped` installs the
entangled model shipped in the repository for this base (latentstrat.shipped) and reruns the
quality checks on this host.
AdamW, linear warmup then cosine decay to lr x entangle.min_lr_ratio, grad clip 1.0,
length-grouped batches, seeded.
With `backbone.dtype: bfloat16` the weights train in float32 under bf16 autocast and are saved
in bf16. The training step's speed settings (the default's CPU step, docs/entangle.md):
`entangle.autocast: bfloat16` (bf16 matmuls, float32 weights and saved model),
`entangle.attention: eager` (for the step only), `entangle.compile: true` (torch.compile),
`entangle.processes: 2` (each batch split between two 1-thread processes, `latentstrat.parallel`).
With `entangle.ema_decay` the saved model is a moving average of the weights.

Writes to `out_dir`:
- `model/`            save_pretrained dir (loads with `model.load_entangled`)
- `history.parquet`   step, task ("all" or a task), metric, value
- `quality.json`      per task: answer accuracy, strategy-match rate and strategy TV of samples
                      at temperature 1 on validation inputs, thresholds, pass/fail; training summary
- `quality.parquet`   the same checks as a table (task, check, value, threshold, passed)
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from latentstrat import data, host, parallel, shipped
from latentstrat.config import ENTANGLE_FILES, dump_json
from latentstrat.io import write_parquet
from latentstrat.metrics import ENTANGLE_HISTORY_COLUMNS
from latentstrat.model import (DTYPES, build_backbone, count_params, device_for, device_of, load_entangled,
                               write_model_extras)
from latentstrat.objective import zfree_token_nll
from latentstrat.quality import quality_table
from latentstrat.tasks import TASKS

# check name -> (config threshold key, direction): value must be >= (min) or <= (max) threshold
CHECKS = {
    "answer_accuracy": ("quality_min_answer_accuracy", "min"),
    "strategy_match_rate": ("quality_min_strategy_match", "min"),
    "strategy_tv": ("quality_max_strategy_tv", "max"),
}
TEMPERATURE = 1.0
GRAD_CLIP = 1.0
LOG_EVERY = 25  # train-loss history interval (steps)
N_EVALS = 10  # validation-loss evaluations over the run (+ step 0 and the end)


class QualityError(RuntimeError):
    """The entangled model failed a quality check and entangle.quality_enforce is true."""


# ----------------------------------------------------------------------------- helpers


def lr_at(step: int, lr: float, warmup: int, steps: int, min_ratio: float = 0.1) -> float:
    """Linear warmup over `warmup` steps, then cosine decay from lr to lr * min_ratio at `steps`."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def strategy_alternatives(train_df: pd.DataFrame) -> tuple[pd.DataFrame, list[list[int]]]:
    """Every strategy's trace of every train input: (rows with columns task, x, strategy, y;
    for each train example i, the row numbers of its alternatives, one per strategy). Drawing
    one uniformly is the data's own generating process (uniform labels), so a trace that two
    strategies share (an ambiguous input) comes up twice as often, as it does in the data."""
    rows, alternatives = [], []
    for task, x in zip(train_df.task, train_df.x):
        t = TASKS[task]
        alternatives.append(list(range(len(rows), len(rows) + len(t.strategies))))
        rows.extend(dict(task=task, x=x, strategy=s, y=t.render(x, s)) for s in t.strategies)
    return pd.DataFrame(rows, columns=["task", "x", "strategy", "y"]), alternatives


def epoch_batches(lengths: list[int], batch_size: int, rng, alternatives: list[list[int]] | None = None):
    """One epoch of length-grouped batches (lists of encoded row numbers). With `alternatives`
    (strategy resampling), each train example contributes one of its alternative rows, drawn
    uniformly afresh every epoch; else every row once."""
    if alternatives is None:
        return data.length_grouped_batches(lengths, batch_size, rng)
    picks = [alt[int(rng.integers(len(alt)))] for alt in alternatives]
    batches = data.length_grouped_batches([lengths[r] for r in picks], batch_size, rng)
    return ([picks[i] for i in b] for b in batches)


@torch.no_grad()
def validation_loss(model, encoded: data.Encoded, batch_size: int) -> dict[str, float]:
    """Per-task and overall ("all") mean NLL per supervised token."""
    was_training = model.training
    model.eval()
    dev = device_of(model)
    tot = torch.zeros(len(encoded.tasks), dtype=torch.float64)
    cnt = torch.zeros(len(encoded.tasks), dtype=torch.float64)
    order = sorted(range(len(encoded)), key=lambda i: encoded.lengths[i])
    for s in range(0, len(order), batch_size):
        batch = data.collate(encoded, order[s:s + batch_size]).to(dev)
        nll = zfree_token_nll(model, batch).double().sum(1).cpu()
        n = batch.sup_mask.sum(1).double().cpu()
        tot.index_add_(0, batch.task_idx.cpu(), nll)
        cnt.index_add_(0, batch.task_idx.cpu(), n)
    model.train(was_training)
    out = {t: float(tot[i] / cnt[i]) for i, t in enumerate(encoded.tasks) if cnt[i] > 0}
    out["all"] = float(tot.sum() / cnt.sum())
    return out


# ----------------------------------------------------------------------------- training


def autocast_for(model, dtype: torch.dtype):
    """Mixed precision for a low-precision backbone dtype (weights stay float32 for AdamW)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_of(model).type, dtype=dtype)


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


def time_step(model, enc: data.Encoded, batches: list[list[int]], settings: dict, ecfg: dict,
              backbone_dtype: torch.dtype, world: int) -> float:
    """Tokens/s of rank 0's share of `batches` with `settings`, on a copy of `model` (the model
    itself is untouched), after TRIAL_WARMUP untimed steps (compilation happens there)."""
    import copy

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


def choose_step_settings(ecfg: dict, model, enc: data.Encoded, group_lengths, device: torch.device, threads: int,
                         backbone_dtype: torch.dtype, alternatives=None, log=print) -> tuple[dict, dict]:
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
    epochs = (b for _ in itertools.count() for b in epoch_batches(group_lengths, ecfg["batch_size"], rng, alternatives))
    batches = list(itertools.islice(epochs, TRIAL_WARMUP + TRIAL_STEPS))
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // world))  # one rank's share of the cores, as in training
    t0 = time.time()
    try:
        for cand in candidates:
            if record["trial"] and time.time() - t0 > TRIAL_BUDGET_S:
                log(f"entangle: step trial budget ({TRIAL_BUDGET_S:.0f} s) spent; not timing {cand}")
                break
            tps = time_step(model, enc, batches, cand, ecfg, backbone_dtype, world)
            record["trial"].append({**cand, "tokens_per_s": tps})
            log(f"entangle: step trial {cand}: {tps:,.0f} tokens/s per process")
    finally:
        torch.set_num_threads(prev_threads)
    plain = record["trial"][0]["tokens_per_s"]
    best = max(record["trial"], key=lambda r: r["tokens_per_s"])
    pick = best if best["tokens_per_s"] >= MIN_GAIN * plain else record["trial"][0]
    resolved.update({k: pick[k] for k in PLAIN})
    record.update(chosen={k: resolved[k] for k in SPEED_KEYS}, speedup_vs_plain=pick["tokens_per_s"] / plain,
                  trial_s=time.time() - t0)
    log(f"entangle: step settings {record['chosen']} ({record['speedup_vs_plain']:.2f}x the plain float32 step, "
        f"{host.cpu_model()}, native bf16: {host.native_bf16()})")
    return resolved, record


def make_optimizer(model, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW (betas 0.9 / 0.95); weight decay on matrices only."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def train_step(model, opt, batch: data.Batch | None, step_nll=zfree_token_nll,
               amp_dtype: torch.dtype = torch.float32, n_supervised: int | None = None, world: int = 1):
    """One update on the mean NLL per supervised token of the batch; returns (loss, grad norm).
    Data parallel (`world` > 1, `latentstrat.parallel`): `batch` is this rank's share of the
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


def rank_share(enc: data.Encoded, idx: list[int], rank: int, world: int, device):
    """This rank's part of the global batch `idx` (rows rank::world; None if none), the global
    batch's supervised-token count (None in one process: `train_step` counts its batch) and its
    real (non-pad) tokens."""
    share = idx[rank::world]
    batch = data.collate(enc, share).to(device) if share else None
    n_supervised = sum(len(enc.sup_ids[i]) for i in idx) if world > 1 else None
    return batch, n_supervised, sum(enc.lengths[i] for i in idx)


def train_entangled(model, train_enc: data.Encoded, val_enc: data.Encoded, ecfg: dict, group_lengths: list[float],
                    log=print, backbone_dtype: torch.dtype = torch.float32,
                    alternatives: list[list[int]] | None = None, rank: int = 0, world: int = 1):
    """Train `model` (float32 weights) in place on the z-free records, with the step of
    `step_settings` (autocast, compile; validation runs uncompiled in float32). Batches group
    rows of similar `group_lengths` (one per row of `train_enc`; `data.strategy_free_lengths`).
    With `alternatives` (from `strategy_alternatives`; `train_enc` then encodes its rows), each
    epoch draws one strategy per train input. Data parallel (`world` > 1, inside
    `parallel.workers`): every rank draws the same global batches and trains on rows
    rank::world of each; only rank 0 validates and keeps the history. Returns (history rows,
    training summary).

    With `entangle.ema_decay` set, rank 0 keeps an exponential moving average of the weights
    (decay min(ema_decay, (1 + step) / (10 + step)), a Polyak average over the last
    ~1 / (1 - ema_decay) steps) and `model` ends holding it: the validation losses during
    training are the iterate's (`validation_loss`), the end's are the average's
    (`validation_loss_ema`, the saved model)."""
    if len(group_lengths) != len(train_enc):
        raise ValueError(f"entangle: {len(group_lengths)} group lengths for {len(train_enc)} train rows")
    dev = device_of(model)
    steps, bs, lr, warmup = ecfg["steps"], ecfg["batch_size"], ecfg["lr"], ecfg["warmup_steps"]
    opt = make_optimizer(model, lr, ecfg["weight_decay"])
    rng = np.random.default_rng(ecfg["seed"])
    eval_steps = {0, steps} | {round(steps * k / N_EVALS) for k in range(1, N_EVALS)}
    history: list[dict] = []

    def record_validation(step):
        for task, v in validation_loss(model, val_enc, 2 * bs).items():
            history.append(dict(step=step, task=task, metric="validation_loss", value=v))

    if rank == 0:
        record_validation(0)
    model.train()
    ema_decay = ecfg["ema_decay"]
    params = list(model.parameters())
    average = [p.detach().clone() for p in params] if ema_decay and rank == 0 else None
    step_nll, amp_dtype = step_settings(ecfg, backbone_dtype)
    batches = iter(())
    t0, tokens, tokens_window, t_window = time.time(), 0, 0, time.time()
    loss_window, gnorm_window, n_window = 0.0, 0.0, 0
    for step in range(steps):
        idx = next(batches, None)
        if idx is None:  # new epoch
            batches = epoch_batches(group_lengths, bs, rng, alternatives)
            idx = next(batches)
        batch, n_supervised, n_tok = rank_share(train_enc, idx, rank, world, dev)
        cur_lr = lr_at(step, lr, warmup, steps, ecfg["min_lr_ratio"])
        for g in opt.param_groups:
            g["lr"] = cur_lr
        try:
            loss, gnorm = train_step(model, opt, batch, step_nll, amp_dtype, n_supervised, world)
        except FloatingPointError as e:
            raise FloatingPointError(f"{e} at step {step}") from None
        if average is not None:
            weight = 1 - min(ema_decay, (1 + step) / (10 + step))
            with torch.no_grad():
                for a, p in zip(average, params):
                    a.lerp_(p, weight)
        tokens += n_tok
        tokens_window += n_tok
        loss_window += loss.item()
        gnorm_window += float(gnorm)
        n_window += 1
        done = step + 1
        if rank != 0:
            continue
        if done % LOG_EVERY == 0 or done == steps:
            dt = time.time() - t_window
            for metric, value in (("train_loss", loss_window / n_window), ("grad_norm", gnorm_window / n_window),
                                  ("lr", cur_lr), ("tokens_per_s", tokens_window / max(dt, 1e-9)),
                                  ("elapsed_s", time.time() - t0)):
                history.append(dict(step=done, task="all", metric=metric, value=float(value)))
            elapsed = time.time() - t0
            log(f"entangle step {done}/{steps}: loss {loss_window / n_window:.4f} lr {cur_lr:.2e} "
                f"{tokens_window / max(dt, 1e-9):.0f} tok/s, elapsed {elapsed:.0f}s ETA {elapsed / done * (steps - done):.0f}s")
            loss_window, gnorm_window, n_window, tokens_window, t_window = 0.0, 0.0, 0, 0, time.time()
        if done in eval_steps:
            record_validation(done)
            log(f"entangle step {done}: validation loss {history[-1]['value']:.4f}")
    wall = time.time() - t0
    if world > 1:
        parallel.check_identical(params, "entangle")
    final_metric = "validation_loss"
    if average is not None:  # the model becomes the average (what is saved and sampled)
        with torch.no_grad():
            for a, p in zip(average, params):
                p.copy_(a)
        final_metric = "validation_loss_ema"
        for task, v in validation_loss(model, val_enc, 2 * bs).items():
            history.append(dict(step=steps, task=task, metric=final_metric, value=v))
        log(f"entangle: weight average (ema_decay {ema_decay}): validation loss {history[-1]['value']:.4f}")
    model.eval()
    summary = dict(resample_strategies=alternatives is not None, steps=steps, batch_size=bs, lr=lr,
                   autocast=str(amp_dtype).removeprefix("torch."), compiled=bool(ecfg["compile"]), processes=world,
                   warmup_steps=warmup, wall_s=wall, train_tokens=tokens,
                   tokens_per_s=tokens / max(wall, 1e-9),
                   ema_decay=ema_decay,
                   final_validation_loss={r["task"]: r["value"] for r in history
                                          if r["metric"] == final_metric and r["step"] == steps},
                   final_validation_loss_iterate={r["task"]: r["value"] for r in history
                                                  if r["metric"] == "validation_loss" and r["step"] == steps})
    return history, summary


# ----------------------------------------------------------------------------- sampling


@torch.no_grad()
def sample_y(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int, seed: int,
             temperature: float = TEMPERATURE) -> list[str]:
    """Sample a y text for each prompt (`<bos> <x> .. </x> <z> [Z]*P </z> <y>` ids) at `temperature`, batched
    with left padding and a KV cache; a row stops at `<eos>`. Returns the decoded text before
    the first `</y>` / `<eos>` (data.decode_y). Deterministic given `seed` and the batch order."""
    vocab = tokenizer.get_vocab()
    pad, eos = vocab[data.PAD], vocab[data.EOS]
    dev = device_of(model)
    gen = torch.Generator().manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    texts = [""] * len(prompts)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        B, T = len(idx), max(len(prompts[i]) for i in idx)
        ids = torch.full((B, T), pad, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, T - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[r, T - len(prompts[i]):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        done = torch.zeros(B, dtype=torch.bool)
        new = []
        for _ in range(max_new_tokens):
            probs = torch.softmax(out.logits[:, -1].float().cpu() / temperature, -1)
            tok = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            tok = torch.where(done, torch.full_like(tok, pad), tok)
            new.append(tok)
            done |= tok == eos
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=dev)], 1)
            pos = pos[:, -1:] + 1
            out = model(input_ids=tok[:, None].to(dev), attention_mask=mask, position_ids=pos,
                        cache=out.cache, use_cache=True)
        gen_ids = torch.stack(new, 1).tolist()
        for r, i in enumerate(idx):
            texts[i] = data.decode_y(tokenizer, gen_ids[r])
    return texts


def prompts_from(encoded: data.Encoded) -> list[list[int]]:
    """The record cut after `<y>`: exactly the training layout."""
    return [ids[:p + encoded.z_slots + 3] for ids, p in zip(encoded.gen_ids, encoded.z_open_pos)]


# ----------------------------------------------------------------------------- quality


def strategy_distribution(match_sets, strategies) -> dict[str, float]:
    """Followed-strategy distribution over examples with >= 1 matching strategy. An example
    matching k strategies (an ambiguous trace) adds 1/k to each: a trace that several
    strategies produce is evidence for none of them in particular. None values: no match."""
    counts = {s: 0.0 for s in strategies}
    n = 0
    for m in match_sets:
        m = [s for s in m if s in counts]
        if not m:
            continue
        n += 1
        for s in m:
            counts[s] += 1.0 / len(m)
    return {s: (c / n if n else None) for s, c in counts.items()}


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def data_strategy_distributions(train_df: pd.DataFrame) -> dict[str, dict[str, float]]:
    """The data's strategy distribution per task (train split, true traces' matching sets)."""
    return {task: strategy_distribution(g.matching_strategies, TASKS[task].strategies)
            for task, g in train_df.groupby("task", sort=True)}


def quality_report(samples: pd.DataFrame, data_dist: dict[str, dict[str, float]], thresholds: dict) -> dict:
    """Per-task checks of temperature-1 samples.

    samples: columns task, x, y_generated. data_dist: task -> strategy -> probability.
    thresholds: entangle config keys of CHECKS. Returns {"passed", "thresholds", "tasks": {task:
    {"n", "passed", "checks": {check: {value, threshold, passed}}, "followed_distribution",
    "data_distribution", "n_matched"}}}.
    """
    missing = [c for c in ("task", "x", "y_generated") if c not in samples.columns]
    if missing:
        raise ValueError(f"quality_report: samples lack columns {missing}")
    tasks = {}
    for name, g in samples.groupby("task", sort=True):
        task = TASKS[name]
        if name not in data_dist:
            raise ValueError(f"quality_report: no data strategy distribution for task {name!r}")
        correct = [task.final_answer_correct(x, y) for x, y in zip(g.x, g.y_generated)]
        matches = [task.matching_strategies(x, y) for x, y in zip(g.x, g.y_generated)]
        matched = [m for m in matches if m]
        followed = strategy_distribution(matched, task.strategies)
        values = {"answer_accuracy": float(np.mean(correct)),
                  "strategy_match_rate": len(matched) / len(g),
                  # no matched sample: nothing follows the data's strategies -> maximal distance
                  "strategy_tv": total_variation(followed, data_dist[name]) if matched else 1.0}
        checks = {}
        for check, (key, direction) in CHECKS.items():
            v, thr = values[check], float(thresholds[key])
            checks[check] = dict(value=v, threshold=thr, direction=direction,
                                 passed=bool(v >= thr if direction == "min" else v <= thr))
        tasks[name] = dict(n=int(len(g)), n_matched=len(matched), checks=checks,
                           passed=all(c["passed"] for c in checks.values()),
                           followed_distribution=followed, data_distribution=data_dist[name])
    return dict(passed=bool(tasks) and all(t["passed"] for t in tasks.values()),
                thresholds={k: float(thresholds[k]) for k, _ in CHECKS.values()}, tasks=tasks)


def check_quality(model, tokenizer, val_df: pd.DataFrame, train_df: pd.DataFrame, ecfg: dict,
                  batch_size: int) -> tuple[dict, pd.DataFrame]:
    """Sample at temperature 1 on up to `quality_samples_per_task` validation inputs per task
    and run the checks (the test split is read by the evaluate stage only). Returns (report,
    samples)."""
    n = ecfg["quality_samples_per_task"]
    inputs = val_df.groupby("task", sort=True, group_keys=False).head(n).reset_index(drop=True)
    enc = data.encode(inputs, tokenizer, ecfg["z_slots"])
    max_new = int(max(train_df.n_supervised.max(), val_df.n_supervised.max())) + 8
    texts = sample_y(model, tokenizer, prompts_from(enc), max_new, batch_size, seed=ecfg["seed"])
    samples = inputs[["task", "example_id", "strategy", "x", "y"]].assign(y_generated=texts)
    report = quality_report(samples, data_strategy_distributions(train_df), ecfg)
    report.update(temperature=TEMPERATURE, samples_per_task=n, max_new_tokens=max_new)
    return report, samples


# ----------------------------------------------------------------------------- stage


def _check_inputs(data_dir: Path) -> None:
    for name in [f"{s}.parquet" for s in data.SPLITS] + ["tokenizer.json"]:
        if not (data_dir / name).exists():
            raise FileNotFoundError(f"entangle: input {data_dir / name} does not exist (run the data stage)")


def _check_compiler(device: torch.device) -> None:
    """entangle.compile on CPU needs the C++ compiler torch.compile's inductor builds with: say so
    before any training, not at the first step."""
    error = host.cxx_compiler_error() if device.type == "cpu" else None
    if error:
        raise RuntimeError(f"config key entangle.compile: true, but torch.compile finds no C++ compiler on this "
                           f"machine ({error}); install one (apt install g++) or set entangle.compile: false")


def run_entangle(cfg: dict, data_dir, out_dir, threads: int = 1, log=print, shipped_dir=None) -> dict:
    """The entangle stage (see module doc). Returns the quality report."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    ecfg = cfg["entangle"]
    code = host.code_version()  # the code that starts the run is the code that trains
    torch.set_num_threads(int(threads))
    if ecfg["mode"] == "shipped":
        return install_shipped(cfg, data_dir, out_dir, shipped_dir, log)
    if ecfg["mode"] == "skip":
        report = dict(mode="skip", passed=None, backbone=cfg["backbone"],
                      note="entangle.mode skip: the backbone is used as is (cells with init: direct); "
                           "no model is trained, copied or checked")
        write_parquet(pd.DataFrame(columns=ENTANGLE_HISTORY_COLUMNS), out_dir / ENTANGLE_FILES["entangle_history"])
        dump_json(report, out_dir / ENTANGLE_FILES["quality"])
        return report
    _check_inputs(data_dir)
    device = device_for(cfg)
    if ecfg["processes"] != "auto" and ecfg["processes"] > 1 and device.type != "cpu":
        raise ValueError(f"entangle.processes is {ecfg['processes']}: data parallelism over processes is for "
                         f"the CPU step; on {device.type} set entangle.processes: 1")
    if ecfg["compile"] is True:
        _check_compiler(device)
    tokenizer = data.load_tokenizer(data_dir)
    train_df, val_df = (data.load_split(data_dir, s) for s in ("train", "validation"))
    alternatives = None
    if ecfg["resample_strategies"]:
        # the data's strategy labels are uniform and independent of x: drawing them afresh each
        # epoch keeps the model from memorizing which strategy a train input happened to get
        # (docs/entangle.md), so its strategy prior stays the data's on unseen inputs
        rows_df, alternatives = strategy_alternatives(train_df)
    else:
        rows_df = train_df
    train_enc = data.encode(rows_df, tokenizer, ecfg["z_slots"])
    group_lengths = data.strategy_free_lengths(rows_df)
    val_enc = data.encode(val_df, tokenizer, ecfg["z_slots"])

    torch.manual_seed(ecfg["seed"])
    dtype = DTYPES[cfg["backbone"]["dtype"]]
    model = build_backbone(cfg["backbone"], tokenizer, data.added_token_ids(data_dir)).to(device=device, dtype=torch.float32)
    ecfg, choice = choose_step_settings(ecfg, model, train_enc, group_lengths, device, int(threads), dtype,
                                        alternatives, log)
    attention = model.config._attn_implementation
    model.set_attn_implementation(ecfg["attention"])  # for the training step only (docs/entangle.md)
    log(f"entangle: {cfg['backbone']['source']} backbone, {count_params(model):,} parameters, "
        f"{len(train_df)} train examples, {ecfg['steps']} steps x {ecfg['batch_size']}, device {device}, "
        f"{threads} threads" + (f" in {ecfg['processes']} processes" if ecfg["processes"] > 1 else "") + f", autocast {ecfg['autocast']}, attention {ecfg['attention']}"
        + (", compiled" if ecfg["compile"] else ""))
    # with entangle.processes > 1, data parallel over CPU processes that split the threads
    world = ecfg["processes"]
    history, summary = parallel.run(
        world, int(threads), train_entangled, (model, train_enc),
        dict(val_enc=None, ecfg=ecfg, group_lengths=group_lengths, backbone_dtype=dtype, alternatives=alternatives),
        rank0_kwargs=dict(val_enc=val_enc, log=log))
    model.set_attn_implementation(attention)
    summary.update(parameters=count_params(model), threads=int(threads), device=str(device),
                   torch_threads=max(1, int(threads) // world), attention=ecfg["attention"], step_choice=choice,
                   code=code)
    model.to(dtype).save_pretrained(out_dir / "model.tmp")  # saved in the backbone's dtype
    write_model_extras(out_dir / "model.tmp", tokenizer, cfg)  # tokenizer files and model card
    _replace_dir(out_dir / "model.tmp", out_dir / "model")
    write_parquet(pd.DataFrame(history, columns=ENTANGLE_HISTORY_COLUMNS), out_dir / ENTANGLE_FILES["entangle_history"])

    return write_quality(model, tokenizer, val_df, train_df, ecfg, out_dir, log, mode="train", training=summary)


def install_shipped(cfg: dict, data_dir: Path, out_dir: Path, shipped_dir, log=print) -> dict:
    """entangle.mode shipped: verify and install the shipped entangled model (latentstrat.shipped),
    then run the quality checks on this host."""
    if shipped_dir is None:
        raise ValueError("entangle.mode shipped: no shipped base folder given")
    _check_inputs(data_dir)
    t0 = time.time()
    prov = shipped.install(shipped_dir, cfg, data_dir, out_dir)
    log(f"entangle: installed the shipped entangled model {shipped_dir} (trained with code "
        f"{prov['trained'].get('code_version')} on {prov['trained'].get('cpu')}; checksums, recipe and data "
        f"fingerprint verified in {time.time() - t0:.1f} s); quality checks on this host:")
    model = load_entangled(out_dir, dtype=cfg["backbone"]["dtype"]).to(device_for(cfg))
    tokenizer = data.load_tokenizer(data_dir)
    train_df, val_df = (data.load_split(data_dir, s) for s in ("train", "validation"))
    return write_quality(model, tokenizer, val_df, train_df, cfg["entangle"], out_dir, log, mode="shipped",
                         shipped=prov, host=host.describe())


def write_quality(model, tokenizer, val_df, train_df, ecfg: dict, out_dir: Path, log=print, **record) -> dict:
    """Run the quality checks, write quality.json / quality.parquet / quality_samples.parquet
    (with `record` in quality.json), log them, and fail when they fail and are enforced."""
    t0 = time.time()
    report, samples = check_quality(model, tokenizer, val_df, train_df, ecfg, batch_size=2 * ecfg["batch_size"])
    report.update(quality_s=time.time() - t0, **record)
    dump_json(report, out_dir / ENTANGLE_FILES["quality"])
    write_parquet(quality_table(report), out_dir / "quality.parquet")
    write_parquet(samples, out_dir / "quality_samples.parquet")
    for task, r in report["tasks"].items():
        log(f"quality {task}: " + ", ".join(f"{c} {v['value']:.3f} ({'ok' if v['passed'] else 'FAIL'})"
                                            for c, v in r["checks"].items()))
    if not report["passed"] and ecfg["quality_enforce"]:
        failed = [f"{t}.{c}={v['value']:.3f}" for t, r in report["tasks"].items()
                  for c, v in r["checks"].items() if not v["passed"]]
        raise QualityError(f"entangle: quality checks failed ({', '.join(failed)}); report in {out_dir / 'quality.json'}")
    return report


def _replace_dir(tmp: Path, final: Path) -> None:
    """Swap a fully written directory into place (no half-written `model/`)."""
    import shutil

    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old)
    else:
        tmp.rename(final)


def main(argv=None) -> None:
    from latentstrat.config import Paths, load_config

    ap = argparse.ArgumentParser(prog="python -m latentstrat.entangle", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="collection config YAML")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: resources.threads)")
    ap.add_argument("--data-dir", help="data stage folder (default: the config's)")
    ap.add_argument("--out", help="output folder (default: the config's entangle dir)")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    paths = Paths.from_config(cfg)
    report = run_entangle(cfg, args.data_dir or paths.data_dir, args.out or paths.entangle_dir,
                          args.threads or cfg["resources"]["threads"])
    print(f"quality passed: {report['passed']}")


if __name__ == "__main__":
    main()
