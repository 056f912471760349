"""Entangle stage: train the z-free (entangled) model p(y|x) on the task mixture, then check that
it is a real multi-strategy model (latentstrat.base.quality; design sections 3 and 5.2,
docs/design.md). This module is the stage and its training loop; the training step and its
speed settings are latentstrat.base.entangle_step.

    python -m latentstrat.base.entangle --configfile config/config.yaml [--threads N]

Records are the latent layout with a neutral slot, `<bos> <x> .. </x> <z> [Z]*P </z> <y> .. </y>
<eos>` (P = entangle.z_slots; no z is written into the slot), so the slot tokens are the
entangled model's own and a cell starts as this model (docs/design.md, "Initialization"); the
loss is the mean NLL over the supervised tokens (y tokens, `</y>`, `<eos>`). The embedded
default trains from scratch; a pretrained backbone is fine-tuned; `entangle.mode: skip` uses the
backbone as is; `entangle.mode: shipped` installs the entangled model shipped in the repository
for this base (latentstrat.base.shipped) and reruns the quality checks on this host.
AdamW, linear warmup then cosine decay to lr x entangle.min_lr_ratio, grad clip 1.0,
length-grouped batches (batching.epoch_batches), seeded.
With `backbone.dtype: bfloat16` the weights train in float32 under bf16 autocast and are saved
in bf16. The training step's speed settings (the default's CPU step, docs/entangle.md):
`entangle.autocast: bfloat16` (bf16 matmuls, float32 weights and saved model),
`entangle.attention: eager` (for the step only), `entangle.compile: true` (torch.compile),
`entangle.processes: 2` (each batch split between two 1-thread processes, `latentstrat.runtime.parallel`).
With `entangle.ema_decay` the saved model is a moving average of the weights.

Writes to `out_dir`:
- `model/`            save_pretrained dir (loads with `backbone.load_entangled`)
- `history.parquet`   step, task ("all" or a task), metric, value
- `quality.json`      per task: answer accuracy, strategy-match rate and strategy TV of samples
                      at temperature 1 on validation inputs, thresholds, pass/fail; training summary
- `quality.parquet`   the same checks as a table (task, check, value, threshold, passed)
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from latentstrat import batching, encoding
from latentstrat.base import shipped
from latentstrat.base.entangle_step import (
    Records,
    choose_step_settings,
    make_optimizer,
    rank_share,
    step_settings,
    train_step,
)
from latentstrat.base.quality import write_quality
from latentstrat.config import Base
from latentstrat.io import dump_json, write_parquet
from latentstrat.metrics import ENTANGLE_HISTORY_COLUMNS
from latentstrat.modeling.backbone import (
    DTYPES,
    build_backbone,
    count_params,
    device_for,
    device_of,
    load_entangled,
    write_model_extras,
)
from latentstrat.modeling.objective import zfree_token_nll
from latentstrat.paths import DATA_FILES, ENTANGLE_FILES
from latentstrat.runtime import host, parallel
from latentstrat.tasks import TASKS

if TYPE_CHECKING:
    from latentstrat.jobs import Job

LOG_EVERY = 25  # train-loss history interval (steps)
N_EVALS = 10  # validation-loss evaluations over the run (+ step 0 and the end)


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


# ----------------------------------------------------------------------------- validation


@torch.no_grad()
def validation_loss(model, encoded: encoding.Encoded, batch_size: int) -> dict[str, float]:
    """Per-task and overall ("all") mean NLL per supervised token."""
    was_training = model.training
    model.eval()
    tot = torch.zeros(len(encoded.tasks), dtype=torch.float64)
    cnt = torch.zeros(len(encoded.tasks), dtype=torch.float64)
    for _, batch in batching.split_batches(encoded, batch_size, device_of(model)):
        nll = zfree_token_nll(model, batch).double().sum(1).cpu()
        n = batch.sup_mask.sum(1).double().cpu()
        tot.index_add_(0, batch.task_idx.cpu(), nll)
        cnt.index_add_(0, batch.task_idx.cpu(), n)
    model.train(was_training)
    out = {t: float(tot[i] / cnt[i]) for i, t in enumerate(encoded.tasks) if cnt[i] > 0}
    out["all"] = float(tot.sum() / cnt.sum())
    return out


def validation_rows(
    model, encoded: encoding.Encoded, batch_size: int, step: int, metric: str = "validation_loss"
) -> list[dict]:
    """`validation_loss` as history rows of `step`."""
    return [
        dict(step=step, task=task, metric=metric, value=v)
        for task, v in validation_loss(model, encoded, batch_size).items()
    ]


# ----------------------------------------------------------------------------- training


def ema_update(average: list[torch.Tensor], params: list[torch.Tensor], ema_decay: float, step: int) -> None:
    """The moving average after update `step`: decay min(ema_decay, (1 + step) / (10 + step))."""
    weight = 1 - min(ema_decay, (1 + step) / (10 + step))
    with torch.no_grad():
        for a, p in zip(average, params):
            a.lerp_(p, weight)


def new_window() -> dict:
    """The running sums of the train-loss history rows since the last LOG_EVERY row."""
    return {"loss": 0.0, "gnorm": 0.0, "n": 0, "tokens": 0, "t": time.time()}


def window_rows(window: dict, done: int, steps: int, lr: float, t0: float, log=print) -> list[dict]:
    """The history rows of the window ending at step `done` (train loss, grad norm, lr, speed,
    elapsed time); logs a line and starts a new window."""
    dt = time.time() - window["t"]
    loss = window["loss"] / window["n"]
    rows = [
        dict(step=done, task="all", metric=metric, value=float(value))
        for metric, value in (
            ("train_loss", loss),
            ("grad_norm", window["gnorm"] / window["n"]),
            ("lr", lr),
            ("tokens_per_s", window["tokens"] / max(dt, 1e-9)),
            ("elapsed_s", time.time() - t0),
        )
    ]
    elapsed = time.time() - t0
    eta = elapsed / done * (steps - done)
    log(
        f"entangle step {done}/{steps}: loss {loss:.4f} lr {lr:.2e} "
        f"{window['tokens'] / max(dt, 1e-9):.0f} tok/s, elapsed {elapsed:.0f}s ETA {eta:.0f}s"
    )
    window.update(new_window())
    return rows


def train_entangled(
    model,
    records: Records,
    ecfg: dict,
    log=print,
    backbone_dtype: torch.dtype = torch.float32,
    rank: int = 0,
    world: int = 1,
):
    """Train `model` (float32 weights) in place on the z-free `records`, with the step of
    `entangle_step.step_settings` (autocast, compile; validation runs uncompiled in float32).
    With `records.alternatives`, each epoch draws one strategy per train input. Data
    parallel (`world` > 1, inside `parallel.workers`): every rank draws the same global batches
    and trains on rows rank::world of each; only rank 0 validates and keeps the history.
    Returns (history rows, training summary).

    With `entangle.ema_decay` set, rank 0 keeps an exponential moving average of the weights
    (`ema_update`, a Polyak average over the last ~1 / (1 - ema_decay) steps) and `model` ends
    holding it: the validation losses during training are the iterate's (`validation_loss`),
    the end's are the average's (`validation_loss_ema`, the saved model)."""
    if len(records.group_lengths) != len(records.train):
        raise ValueError(f"entangle: {len(records.group_lengths)} group lengths for {len(records.train)} train rows")
    steps, bs = ecfg["steps"], ecfg["batch_size"]
    history = validation_rows(model, records.val, 2 * bs, 0) if rank == 0 else []
    model.train()
    params = list(model.parameters())
    average = [p.detach().clone() for p in params] if ecfg["ema_decay"] and rank == 0 else None
    step_nll, amp_dtype = step_settings(ecfg, backbone_dtype)
    t0 = time.time()
    tokens = training_loop(model, records, ecfg, (step_nll, amp_dtype), average, history, log, (rank, world))
    wall = time.time() - t0
    if world > 1:
        parallel.check_identical(params, "entangle")
    final_metric = "validation_loss"
    if average is not None:  # the model becomes the average (what is saved and sampled)
        with torch.no_grad():
            for a, p in zip(average, params):
                p.copy_(a)
        final_metric = "validation_loss_ema"
        history += validation_rows(model, records.val, 2 * bs, steps, final_metric)
        log(f"entangle: weight average (ema_decay {ecfg['ema_decay']}): validation loss {history[-1]['value']:.4f}")
    model.eval()
    summary = dict(
        resample_strategies=records.alternatives is not None,
        steps=steps,
        batch_size=bs,
        lr=ecfg["lr"],
        autocast=str(amp_dtype).removeprefix("torch."),
        compiled=bool(ecfg["compile"]),
        processes=world,
        warmup_steps=ecfg["warmup_steps"],
        wall_s=wall,
        train_tokens=tokens,
        tokens_per_s=tokens / max(wall, 1e-9),
        ema_decay=ecfg["ema_decay"],
        final_validation_loss=final_losses(history, final_metric, steps),
        final_validation_loss_iterate=final_losses(history, "validation_loss", steps),
    )
    return history, summary


def final_losses(history: list[dict], metric: str, step: int) -> dict[str, float]:
    """task -> value of `metric` at `step`."""
    return {r["task"]: r["value"] for r in history if r["metric"] == metric and r["step"] == step}


def training_loop(
    model, records: Records, ecfg: dict, step_fn: tuple, average, history: list[dict], log, shard: tuple[int, int]
) -> int:
    """The `entangle.steps` updates of `train_entangled` (`step_fn`: its loss function and
    autocast dtype; `shard`: this process's rank and the number of processes); rank 0 appends
    the train-loss and validation rows to `history`. Returns the tokens trained on."""
    rank, world = shard
    dev = device_of(model)
    steps, bs, lr, warmup = ecfg["steps"], ecfg["batch_size"], ecfg["lr"], ecfg["warmup_steps"]
    opt = make_optimizer(model, lr, ecfg["weight_decay"])
    rng = np.random.default_rng(ecfg["seed"])
    eval_steps = {0, steps} | {round(steps * k / N_EVALS) for k in range(1, N_EVALS)}
    params = list(model.parameters())
    batches = iter(())
    t0, tokens, window = time.time(), 0, new_window()
    for step in range(steps):
        idx = next(batches, None)
        if idx is None:  # new epoch
            batches = batching.epoch_batches(records.group_lengths, bs, rng, records.alternatives)
            idx = next(batches)
        batch, n_supervised, n_tok = rank_share(records.train, idx, rank, world, dev)
        cur_lr = lr_at(step, lr, warmup, steps, ecfg["min_lr_ratio"])
        for g in opt.param_groups:
            g["lr"] = cur_lr
        try:
            loss, gnorm = train_step(model, opt, batch, *step_fn, n_supervised, world)
        except FloatingPointError as e:
            raise FloatingPointError(f"{e} at step {step}") from None
        if average is not None:
            ema_update(average, params, ecfg["ema_decay"], step)
        tokens += n_tok
        window.update(
            loss=window["loss"] + loss.item(),
            gnorm=window["gnorm"] + float(gnorm),
            n=window["n"] + 1,
            tokens=window["tokens"] + n_tok,
        )
        done = step + 1
        if rank != 0:
            continue
        if done % LOG_EVERY == 0 or done == steps:
            history += window_rows(window, done, steps, cur_lr, t0, log)
        if done in eval_steps:
            history += validation_rows(model, records.val, 2 * bs, done)
            log(f"entangle step {done}: validation loss {history[-1]['value']:.4f}")
    return tokens


# ----------------------------------------------------------------------------- stage


def _check_inputs(data_dir: Path) -> None:
    for name in [DATA_FILES[s] for s in encoding.SPLITS] + [DATA_FILES["tokenizer"]]:
        if not (data_dir / name).exists():
            raise FileNotFoundError(f"entangle: input {data_dir / name} does not exist (run the data stage)")


def _check_compiler(device: torch.device) -> None:
    """entangle.compile on CPU needs the C++ compiler torch.compile's inductor builds with: say so
    before any training, not at the first step."""
    error = host.cxx_compiler_error() if device.type == "cpu" else None
    if error:
        raise RuntimeError(
            f"config key entangle.compile: true, but torch.compile finds no C++ compiler on this "
            f"machine ({error}); install one (apt install g++) or set entangle.compile: false"
        )


def _skip(backbone_cfg: dict, out_dir: Path) -> dict:
    """entangle.mode skip: no model; an empty history and a quality record that says so."""
    report = dict(
        mode="skip",
        passed=None,
        backbone=backbone_cfg,
        note="entangle.mode skip: the backbone is used as is (cells with init: direct); "
        "no model is trained, copied or checked",
    )
    write_parquet(pd.DataFrame(columns=ENTANGLE_HISTORY_COLUMNS), out_dir / ENTANGLE_FILES["entangle_history"])
    dump_json(report, out_dir / ENTANGLE_FILES["quality"])
    return report


def _check_step_settings(ecfg: dict, device: torch.device) -> None:
    """Settings that cannot run on this device fail before any work."""
    if ecfg["processes"] != "auto" and ecfg["processes"] > 1 and device.type != "cpu":
        raise ValueError(
            f"entangle.processes is {ecfg['processes']}: data parallelism over processes is for "
            f"the CPU step; on {device.type} set entangle.processes: 1"
        )
    if ecfg["compile"] is True:
        _check_compiler(device)


def run_entangle(sections, data_dir, out_dir, threads: int = 1, log=print, shipped_dir=None) -> dict:
    """The entangle stage (see module doc), with its config sections (`sections`: jobs.Sections,
    or a whole config). Returns the quality report."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    base, resources = Base.of(sections), sections["resources"]
    ecfg = base.entangle
    code = host.code_version()  # the code that starts the run is the code that trains
    torch.set_num_threads(int(threads))
    if base.mode == "shipped":
        return install_shipped(base, resources, data_dir, out_dir, shipped_dir, log)
    if base.mode == "skip":
        return _skip(base.backbone, out_dir)
    _check_inputs(data_dir)
    device = device_for(resources)
    _check_step_settings(ecfg, device)
    tokenizer = encoding.load_tokenizer(data_dir)
    train_df, val_df = (encoding.load_split(data_dir, s) for s in ("train", "validation"))
    alternatives = None
    if ecfg["resample_strategies"]:
        # the data's strategy labels are uniform and independent of x: drawing them afresh each
        # epoch keeps the model from memorizing which strategy a train input happened to get
        # (docs/entangle.md), so its strategy prior stays the data's on unseen inputs
        rows_df, alternatives = strategy_alternatives(train_df)
    else:
        rows_df = train_df
    train_enc = encoding.encode(rows_df, tokenizer, ecfg["z_slots"])
    group_lengths = encoding.strategy_free_lengths(rows_df)
    val_enc = encoding.encode(val_df, tokenizer, ecfg["z_slots"])

    torch.manual_seed(ecfg["seed"])
    dtype = DTYPES[base.backbone["dtype"]]
    model = build_backbone(base.backbone, tokenizer, encoding.added_token_ids(data_dir))
    model = model.to(device=device, dtype=torch.float32)
    records = Records(train_enc, val_enc, group_lengths, alternatives)
    ecfg, choice = choose_step_settings(ecfg, model, replace(records, val=None), device, int(threads), dtype, log)
    attention = model.config._attn_implementation
    model.set_attn_implementation(ecfg["attention"])  # for the training step only (docs/entangle.md)
    log(
        f"entangle: {base.backbone['source']} backbone, {count_params(model):,} parameters, "
        f"{len(train_df)} train examples, {ecfg['steps']} steps x {ecfg['batch_size']}, device {device}, "
        f"{threads} threads"
        + (f" in {ecfg['processes']} processes" if ecfg["processes"] > 1 else "")
        + f", autocast {ecfg['autocast']}, attention {ecfg['attention']}"
        + (", compiled" if ecfg["compile"] else "")
    )
    # with entangle.processes > 1, data parallel over CPU processes that split the threads
    world = ecfg["processes"]
    history, summary = parallel.run(
        world,
        int(threads),
        train_entangled,
        (model,),
        dict(records=replace(records, val=None), ecfg=ecfg, backbone_dtype=dtype),
        rank0_kwargs=dict(records=records, log=log),
    )
    model.set_attn_implementation(attention)
    summary.update(
        parameters=count_params(model),
        threads=int(threads),
        device=str(device),
        torch_threads=max(1, int(threads) // world),
        attention=ecfg["attention"],
        step_choice=choice,
        code=code,
    )
    model.to(dtype).save_pretrained(out_dir / "model.tmp")  # saved in the backbone's dtype
    # tokenizer files and model card
    write_model_extras(out_dir / "model.tmp", tokenizer, base)
    _replace_dir(out_dir / "model.tmp", out_dir / "model")
    write_parquet(pd.DataFrame(history, columns=ENTANGLE_HISTORY_COLUMNS), out_dir / ENTANGLE_FILES["entangle_history"])

    return write_quality(model, tokenizer, val_df, train_df, ecfg, out_dir, log, mode="train", training=summary)


def install_shipped(base: Base, resources: dict, data_dir: Path, out_dir: Path, shipped_dir, log=print) -> dict:
    """entangle.mode shipped: verify and install the shipped entangled model (latentstrat.base.shipped),
    then run the quality checks on this host (on the device `resources` give)."""
    if shipped_dir is None:
        raise ValueError("entangle.mode shipped: no shipped base folder given")
    _check_inputs(data_dir)
    t0 = time.time()
    prov = shipped.install(shipped_dir, base, data_dir, out_dir)
    log(
        f"entangle: installed the shipped entangled model {shipped_dir} (trained with code "
        f"{prov['trained'].get('code_version')} on {prov['trained'].get('cpu')}; checksums, recipe and data "
        f"fingerprint verified in {time.time() - t0:.1f} s); quality checks on this host:"
    )
    model = load_entangled(out_dir, dtype=base.backbone["dtype"]).to(device_for(resources))
    tokenizer = encoding.load_tokenizer(data_dir)
    train_df, val_df = (encoding.load_split(data_dir, s) for s in ("train", "validation"))
    return write_quality(
        model,
        tokenizer,
        val_df,
        train_df,
        base.entangle,
        out_dir,
        log,
        mode="shipped",
        shipped=prov,
        host=host.describe(),
    )


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


def run(job: Job) -> None:
    """The entangle rule's job: train (or install the shipped) entangled model into the folder of
    its outputs."""
    shipped = job.input.get("shipped")
    run_entangle(
        job.config,
        job.folder("tokenizer"),
        job.folder("quality"),
        job.threads,
        shipped_dir=Path(shipped).parent if shipped else None,
    )


def main(argv=None) -> None:
    from latentstrat.config import config_for_command
    from latentstrat.paths import Paths

    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.base.entangle", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", required=True, help="collection config YAML")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: resources.threads)")
    ap.add_argument("--data-dir", help="data stage folder (default: the config's)")
    ap.add_argument("--out", help="output folder (default: the config's entangle dir)")
    args = ap.parse_args(argv)
    cfg = config_for_command(args.configfile)
    paths = Paths.from_config(cfg)
    report = run_entangle(
        cfg,
        args.data_dir or paths.data_dir,
        args.out or paths.entangle_dir,
        args.threads or cfg["resources"]["threads"],
    )
    print(f"quality passed: {report['passed']}")


if __name__ == "__main__":
    main()
