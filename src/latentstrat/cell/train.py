"""Disentangle trainer: one cell per call (design sections 4-5, stage 4, docs/design.md): the
training loop and its checkpoints.

Per step: one posterior pass (z ~ q, reparameterized) and one router+generator pass
(objective.forward_losses); b comes from the reference stage's tokens.parquet and the scales
S_ref, T_ref, n_bar from its scales.json (reference.load_b, objective.Objective.for_cell: never
recomputed, the same numbers the evaluate stage reads); batches are task-mixed
(batching.task_mixed_batches). The batch order is a pure function of (seed, epoch) and the z noise
of (seed, step), the seed being the cell's training seed (cells.training_seed: shared by the two
arms of a pair), so a resumed run replays exactly what an uninterrupted one does.

The model is validated at step 0 (before any update; shared by the cells of one init:
latentstrat.cell.step0), every `train.eval_every` steps and at the end (latentstrat.cell.validation). A
checkpoint (`checkpoints/last.pt`) is written every `train.checkpoint_every` steps, on SIGTERM
(then the job exits non-zero so the scheduler reruns it) and at the end; a run resumes from it
when it was written for the same cell, config, data and entangled model (`run_fingerprint`).
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from latentstrat import batching, encoding
from latentstrat.base.reference import load_b, load_scales
from latentstrat.cell.step0 import load_step0, step0_fingerprint
from latentstrat.cell.validation import ValidationSettings, prepare_validation, validate
from latentstrat.cells import Cell, as_cell, cell_training_seed
from latentstrat.families import TERMS
from latentstrat.io import atomic_path, dump_json, write_parquet
from latentstrat.metrics import HISTORY_COLUMNS, LOSS_METRIC_OF
from latentstrat.modeling import backbone
from latentstrat.modeling.backbone import device_for, device_of
from latentstrat.modeling.model import build_model
from latentstrat.modeling.objective import Objective, forward_losses
from latentstrat.modeling.optim import CellOptimizer
from latentstrat.paths import DATA_FILES, PROGRESS_FILE, TRAIN_FILES, BaseFolders
from latentstrat.runtime import host
from latentstrat.runtime.progress import Progress
from latentstrat.stages import TRAIN_SECTIONS

if TYPE_CHECKING:
    from latentstrat.jobs import Job

CHECKPOINT = "last.pt"
# forward_losses key -> history metric name
LOSS_NAMES = {
    **LOSS_METRIC_OF,
    "posterior_variance": "posterior_variance",
    "router_marginal_kl_to_prior": "router_marginal_kl_to_prior",
    "total": "total_loss",
}


class NonFiniteLoss(RuntimeError):
    """A NaN/inf loss term; names the cell, the step and the term."""


class Preempted(SystemExit):
    """SIGTERM received: a checkpoint was written; exit non-zero so the scheduler reruns."""


# ----------------------------------------------------------------------------- steps


# the loss terms every step records on the device and checks for NaN / inf when they are read
RECORDED = (*TERMS, "active", "kl", "posterior_variance", "router_marginal_kl_to_prior", "total")
# the step's values are read back to the host every LOG_EVERY steps (and before every validation,
# checkpoint and the end): between those reads the step reads nothing back (tests/test_step.py)
LOG_EVERY = 50
# on an accelerator (and with `train.compile`), widths are padded up to a multiple of this (a few
# static shapes; the pads are never read); on the CPU every batch keeps its own width
PAD_MULTIPLE = 16


def step_noise(seed: int, step: int, shape, device="cpu") -> torch.Tensor:
    """The z noise of training step `step`: standard normal from a generator on `device`
    seeded by (seed, step), so a resumed run replays it; drawn where it is used."""
    g = torch.Generator(device=device).manual_seed(int(seed) * 1_000_003 + int(step))
    return torch.randn(shape, generator=g, device=device)


class EpochBatches:
    """The rows of each training step: its epoch's task-mixed batches
    (batching.task_mixed_batches) are a pure function of (seed, epoch), so a resumed run replays
    the same batches; an epoch's batches are drawn once."""

    def __init__(self, task_idx, batch_size: int, seed: int):
        self.task_idx, self.batch_size, self.seed = task_idx, batch_size, int(seed)
        self.per_epoch = math.ceil(len(task_idx) / batch_size)
        self.epoch, self.batches = None, []

    def __call__(self, step: int) -> list[int]:
        epoch = step // self.per_epoch
        if epoch != self.epoch:
            rng = np.random.default_rng([self.seed, int(epoch)])
            self.epoch, self.batches = epoch, batching.task_mixed_batches(self.task_idx, self.batch_size, rng)
        return self.batches[step % self.per_epoch]


def batch_at(task_idx, batch_size: int, seed: int, step: int) -> list[int]:
    """The rows of training step `step` (one step's `EpochBatches`)."""
    return EpochBatches(task_idx, batch_size, seed)(step)


def optimizer(params, lr: float, weight_decay: float) -> CellOptimizer:
    """The cell's AdamW (modeling.optim.CellOptimizer: fused where the device has the kernel,
    float32 masters for lower-precision weights)."""
    return CellOptimizer(params, lr, weight_decay)


def train_step(model, opt: CellOptimizer, objective: Objective, batch, eps, step: int, clip: float) -> torch.Tensor:
    """One update of J (objective.forward_losses) on `batch` with the z noise `eps`, the gradient
    clipped at `clip` (0: measured, not clipped). It reads nothing back to the host: it returns
    the step's record on the device, the batch sums of the `RECORDED` terms and the pre-clip
    gradient norm (`read_records` checks and reads it)."""
    losses = forward_losses(model, batch, objective, step, eps)
    opt.zero_grad(set_to_none=True)
    losses["total"].backward()
    opt.gather()
    grads = [p.grad for p in opt.params if p.grad is not None]
    gnorm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if clip > 0:
        torch.nn.utils.clip_grads_with_norm_(opt.params, clip, gnorm, foreach=True)
    opt.step()
    return torch.stack([*(losses[k].detach().float().sum() for k in RECORDED), gnorm.float()])


def read_records(records: list, first_step: int, cell_id: str) -> np.ndarray:
    """The device records of the steps `first_step + 1 ...` (`train_step`) on the host, one
    read: [steps, RECORDED + grad norm] (batch sums; `total` and the norm are scalars). A NaN /
    inf term is a NonFiniteLoss naming the cell, the first such step and the term; the steps
    after it updated the weights with it, so no checkpoint is written from them."""
    rows = torch.stack(records).cpu().numpy().astype(np.float64)
    for j, row in enumerate(rows):
        bad = [k for k, v in zip(RECORDED, row) if not math.isfinite(v)]
        if bad:
            raise NonFiniteLoss(
                f"cell {cell_id}: step {first_step + j + 1}: loss term {LOSS_NAMES[bad[0]]} is non-finite "
                f"({row[RECORDED.index(bad[0])]}); last good checkpoint kept"
            )
    return rows


def grad_clip_for(tcfg: dict, objective: Objective) -> float:
    """The gradient-norm clipping threshold of a cell: `train.grad_clip` is one number for every
    aggregation or a mapping aggregation -> number (0 = no clipping). With `train.grad_clip_unit:
    zfree_objective` the number is in units of the cell's z-free objective
    (Objective.zfree: S_ref for `raw`, 1 for the normalized families), so a `sum` cell,
    whose raw loss is ~n_bar times a `mean` cell's, is held to the same relative threshold and
    both arms clip at comparable rates; `absolute` takes the number as is. The report shows how
    often it bound."""
    c, aggregation = tcfg["grad_clip"], objective.aggregation
    if isinstance(c, dict):
        if aggregation not in c:
            raise ValueError(
                f"config key train.grad_clip: no threshold for token aggregation {aggregation!r} (have {sorted(c)})"
            )
        c = c[aggregation]
    unit = objective.zfree() if tcfg["grad_clip_unit"] == "zfree_objective" else 1.0
    return float(c) * unit


def batch_stats(
    cell_id: str, tasks: list[str], steps: list[dict], clip: float, step: int, history: list[dict]
) -> list[dict]:
    """History rows for the training steps since the previous checkpoint row, from the per-step
    records the loop keeps (`steps`: the pre-clip gradient norm and the batch's rows per task):
    the batches' task mix, the mean pre-clip gradient norm, the fraction of steps whose norm was
    clipped, and the threshold itself."""
    prev = max([h["step"] for h in history if h["metric"] == "clipped_fraction"] + [0])
    counts = np.sum([s["task_rows"] for s in steps[prev:step]], axis=0)
    norms = np.asarray([s["grad_norm"] for s in steps[prev:step]])
    rows = [
        dict(cell_id=cell_id, step=step, task="all", metric="grad_norm_preclip", value=float(norms.mean())),
        dict(
            cell_id=cell_id,
            step=step,
            task="all",
            metric="clipped_fraction",
            value=float((norms > clip).mean()) if clip > 0 else 0.0,
        ),
        dict(cell_id=cell_id, step=step, task="all", metric="grad_clip", value=clip),
    ]
    rows += [
        dict(cell_id=cell_id, step=step, task=t, metric="batch_task_share", value=float(counts[k] / counts.sum()))
        for k, t in enumerate(tasks)
    ]
    return rows


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(path, model, opt, step: int, history: list[dict], extra: dict) -> None:
    """weights_only-loadable dict, written atomically (the previous one survives a crash)."""
    state = {
        "trainable": {k: v.cpu().clone() for k, v in model.trainable_state_dict().items()},
        "optimizer": opt.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "step": int(step),
        "history": {c: [h[c] for h in history] for c in HISTORY_COLUMNS},
        **extra,
    }
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(state, tmp)


def load_checkpoint(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def read_checkpoint(path: Path, log=print) -> dict | None:
    """The checkpoint at `path`, or None. An unreadable one (truncated, random bytes, not a
    weights-only checkpoint) is named, moved aside to `<name>.corrupt-<time>` and the cell
    starts from step 0: it is never unpickled with arbitrary code allowed, and a rerun does not
    fail on it again."""
    if not path.exists():
        return None
    try:
        return load_checkpoint(path)
    except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is handled the same way
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        path.rename(aside)
        log(
            f"checkpoint {path} is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            f"moved aside to {aside.name}, starting from step 0"
        )
        return None


def run_fingerprint(shaping: dict, cell: dict, data_dir, entangle_dir) -> str:
    """What a checkpoint must have been written for to be resumed: the cell's settings, the
    config sections that shape its training (`shaping`: the train stage's,
    stages.TRAIN_SECTIONS), and the bytes of the data and the entangled model it starts from. A changed
    config or a rebuilt base gives a new fingerprint, so a stale checkpoint in the cell
    directory is never resumed (Slurm preemption keeps it equal)."""
    h = hashlib.sha256()
    seeded = {"cell": cell, "training_seed": cell_training_seed(cell), **shaping}
    h.update(json.dumps(seeded, sort_keys=True, default=str).encode())
    model_dir = Path(entangle_dir) / "model"  # every file: a sharded checkpoint has several
    files = [Path(data_dir) / DATA_FILES["train"]] + (sorted(model_dir.iterdir()) if model_dir.is_dir() else [])
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- the stage


@dataclass(frozen=True, eq=False)
class CellSetup:
    """What a cell's training loop reads and never changes: the `train` section and the cell,
    its objective J and gradient-clip threshold, the tokenizer, the encoded train split with its
    reference NLLs, the validation inputs (validation.prepare_validation) and the folder it
    trains into (its progress file: paths.PROGRESS_FILE)."""

    train_cfg: dict
    cell: Cell
    objective: Objective
    clip: float
    tokenizer: Any
    train: encoding.Encoded
    b_train: list
    val: dict
    out_dir: Path | None = None


@dataclass
class RunState:
    """Where a cell's training stands: the optimizer steps taken, the history rows so far, the
    training seconds and tokens, and per step taken the pre-clip gradient norm and the batch's
    rows per task (`step_records`), and every machine it trained on (`hosts`: one segment per
    start on another host or code, from the step it started at). A checkpoint holds it; `resume`
    restores it."""

    step: int = 0
    history: list = field(default_factory=list)
    wall: float = 0.0
    tokens: int = 0
    step_records: list = field(default_factory=list)
    hosts: list = field(default_factory=list)

    def started_here(self, dev) -> None:
        """Record this start's machine and code (host_segment) unless the last segment is the same."""
        seg = host_segment(self.step, dev)
        last = self.hosts[-1] if self.hosts else None
        if last is None or {k: v for k, v in last.items() if k != "from_step"} != {
            k: v for k, v in seg.items() if k != "from_step"
        }:
            self.hosts.append(seg)


# what a training segment records of the machine and code it ran on (a resumed cell may have moved)
SEGMENT_KEYS = ("host", "cpu", "cpu_capability", "device", "torch_version", "code_hash", "code_version")


def host_segment(step: int, dev) -> dict:
    """The machine and code of a training segment that starts at `step`."""
    prov = host.provenance(str(dev))
    return {"from_step": int(step), **{k: prov[k] for k in SEGMENT_KEYS}}


def run_summary(cell: Cell, run, objective, fingerprint: str, started_at: str, dev) -> dict:
    """A trained cell's summary.json: its steps, wall time and tokens, the objective's scales,
    the config hash and the provenance of the host and code."""
    wall, tokens = run.wall, run.tokens
    return {
        "cell_id": cell.cell_id,
        "training_seed": cell.training_seed,
        "steps": run.step,
        "wall_time_s": wall,
        "train_tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else math.nan,
        "threads": torch.get_num_threads(),
        **objective.scales,
        "config_hash": fingerprint[:16],
        "started_at": started_at,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **host.provenance(str(dev)),
        "hosts": run.hosts,
    }


def train_cell(
    sections, cell: Cell | dict, base: BaseFolders, out_dir, threads: int | None = None, step0_dir=None
) -> dict:
    """Train one cell (a Cell, or its `to_json`) on `base` (its data, entangled model and
    reference folders) with the train stage's config sections (`sections`: jobs.Sections, or a
    whole config); write its adapters and heads (model.LatentStrategyModel.save_trained),
    history.parquet, summary.json. Resumes from out_dir/checkpoints/last.pt. `step0_dir`: the
    shared step-0 validation of the cell's init (step0.step0_validation), else the cell
    measures its model at step 0 itself. Returns the summary."""
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tcfg, resources = sections["train"], sections["resources"]
    torch.set_num_threads(int(threads or resources["threads"]))
    out_dir, cell = Path(out_dir), as_cell(cell)
    cid = cell.cell_id
    data_dir, entangle_dir, reference_dir = base.data, base.entangle, base.reference
    if reference_dir is None:
        raise ValueError(f"train {cid}: the base has no reference folder (its b and scales); run the reference stage")
    # inputs first: clear errors before any model work
    tokenizer = encoding.load_tokenizer(data_dir)
    train_df = encoding.load_split(data_dir, "train")
    val_df = encoding.load_split(data_dir, "validation")
    b_train = load_b(reference_dir, train_df)
    b_val = load_b(reference_dir, val_df)
    objective = Objective.for_cell(cell.settings, load_scales(reference_dir))

    dev = device_for(resources)
    added = encoding.added_token_ids(data_dir)
    model = build_model(sections["backbone"], sections["lora"], cell.work_json(), tokenizer, entangle_dir, added)
    model = model.to(dev)
    if tcfg["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    backbone.COMPILE = bool(tcfg["compile"])
    opt = optimizer(model.trainable_parameters(), tcfg["lr"], tcfg["weight_decay"])
    s = cell.settings
    enc = encoding.encode(train_df, tokenizer, s.z_slots)
    settings = ValidationSettings.of(tcfg, sections["evaluate"], sections["probes"])
    val = prepare_validation(settings, cell.training_seed, tokenizer, val_df, b_val, s.latent_dim, s.z_slots)

    setup = CellSetup(tcfg, cell, objective, grad_clip_for(tcfg, objective), tokenizer, enc, b_train, val, out_dir)

    ckpt_path = out_dir / "checkpoints" / CHECKPOINT
    shaping = {k: sections.get(k) for k in TRAIN_SECTIONS}
    fingerprint = run_fingerprint(shaping, cell.work_json(), data_dir, entangle_dir)
    run = resume(ckpt_path, model, opt, cid, fingerprint)
    run.started_here(dev)

    def checkpoint():
        save_checkpoint(
            ckpt_path,
            model,
            opt,
            run.step,
            run.history,
            {
                "cell_id": cid,
                "fingerprint": fingerprint,
                "wall_time_s": run.wall,
                "train_tokens": run.tokens,
                "step_records": run.step_records,
                "hosts": run.hosts,
            },
        )

    stop = {"flag": False}
    prev_handler = signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("flag", True))
    try:
        model.train()
        if run.step == 0 and not run.history:
            measured = step0_measured(model, val, cid, step0_dir)
            run.history += validate(model, tokenizer, cell, objective, val, 0, measured)
        training_loop(model, opt, setup, run, checkpoint, stop)
    finally:
        signal.signal(signal.SIGTERM, prev_handler)

    model.save_trained(out_dir)
    write_parquet(pd.DataFrame(run.history, columns=HISTORY_COLUMNS), out_dir / TRAIN_FILES["history"])
    summary = run_summary(cell, run, objective, fingerprint, started_at, dev)
    dump_json(summary, out_dir / TRAIN_FILES["summary"])
    checkpoint()  # the final state, so a rerun after a lost output resumes at the end
    return summary


def resume(ckpt_path: Path, model, opt, cid: str, fingerprint: str) -> RunState:
    """The run's state: from the checkpoint at `ckpt_path` when it was written for this cell and
    `fingerprint` (weights, optimizer and torch RNG restored), else a fresh start."""
    ck = read_checkpoint(ckpt_path, log=lambda m: print(f"[{cid}] {m}", flush=True))
    if ck is not None and ck.get("cell_id") != cid:
        raise ValueError(f"checkpoint {ckpt_path} belongs to cell {ck.get('cell_id')!r}, not {cid!r}")
    if ck is not None and ck.get("fingerprint") != fingerprint:
        print(
            f"[{cid}] checkpoint {ckpt_path} was written for another config, data or entangled model "
            f"(fingerprint {str(ck.get('fingerprint'))[:12]} != {fingerprint[:12]}): starting from step 0"
        )
        ck = None
    if ck is not None and set(ck["trainable"]) != set(model.trainable_state_dict()):
        print(
            f"[{cid}] checkpoint {ckpt_path} holds another model layer's weights (written by another version "
            f"of latentstrat): starting from step 0"
        )
        ck = None
    if ck is None:
        return RunState()
    model.load_trainable(ck["trainable"])
    opt.load_state_dict(ck["optimizer"])
    torch.set_rng_state(ck["torch_rng"])
    run = RunState(
        step=ck["step"],
        wall=ck["wall_time_s"],
        tokens=ck["train_tokens"],
        step_records=list(ck.get("step_records", [])),
        hosts=list(ck.get("hosts", [])),
        history=[dict(zip(HISTORY_COLUMNS, v)) for v in zip(*(ck["history"][c] for c in HISTORY_COLUMNS))],
    )
    print(f"[{cid}] resumed from step {run.step}")
    return run


def step0_measured(model, val: dict, cid: str, step0_dir) -> dict | None:
    """The shared step-0 measurements of this very model (step0.load_step0), or None without
    `step0_dir`: the cell then measures its model itself."""
    if step0_dir is None:
        return None
    measured = load_step0(step0_dir, step0_fingerprint(model, val), val["df"])
    print(f"[{cid}] step 0: the model measured in {step0_dir} (the same weights, split and settings)", flush=True)
    return measured


def training_loop(model, opt, setup: CellSetup, run: RunState, checkpoint, stop: dict) -> None:
    """The updates from `run.step` to `train.steps`, advancing `run` in place: the steps'
    records read back every `LOG_EVERY` steps and before every validation, checkpoint and the
    end (`read_records`: a non-finite loss stops the cell there); validation and batch
    statistics every `eval_every` steps and at the end, `checkpoint()` every `checkpoint_every`
    steps and when `stop["flag"]` (SIGTERM) is set, then Preempted."""
    tcfg, cid, seed, enc = setup.train_cfg, setup.cell.cell_id, setup.cell.training_seed, setup.train
    dev = device_of(model)
    rows_of = EpochBatches(enc.task_idx, tcfg["batch_size"], seed)
    multiple = 1 if dev.type == "cpu" and not tcfg["compile"] else PAD_MULTIPLE
    progress = Progress(cid, tcfg["steps"], run.step, path=setup.out_dir / PROGRESS_FILE if setup.out_dir else None)
    pending: list = []  # (device record, rows per task) of the steps not read yet
    t0 = time.perf_counter()
    while run.step < tcfg["steps"]:
        step = run.step
        batch = batching.collate(enc, rows_of(step), setup.b_train, multiple=multiple).to(dev)
        eps = step_noise(seed, step, (len(batch), model.latent_dim), dev)
        record = train_step(model, opt, setup.objective, batch, eps, step, setup.clip)
        pending.append((record, np.bincount(batch.task_rows, minlength=len(enc.tasks)).tolist()))
        run.step = step = step + 1
        n_tok = batch.tokens()
        run.tokens += n_tok
        evaluate = step % tcfg["eval_every"] == 0 or step == tcfg["steps"]
        save = step % tcfg["checkpoint_every"] == 0 or stop["flag"]
        if evaluate or save or step % LOG_EVERY == 0:
            rows = read_records([r for r, _ in pending], step - len(pending), cid)
            run.step_records += [{"grad_norm": float(r[-1]), "task_rows": t} for r, (_, t) in zip(rows, pending)]
            progress.add_losses(rows[:, RECORDED.index("total")])
            pending = []
            now = time.perf_counter()
            run.wall, t0 = run.wall + now - t0, now
        progress.update(step, None, n_tok)
        if evaluate:
            run.history += validate(model, setup.tokenizer, setup.cell, setup.objective, setup.val, step)
            run.history += batch_stats(cid, enc.tasks, run.step_records, setup.clip, step, run.history)
            t0 = time.perf_counter()
        if save:
            checkpoint()
            t0 = time.perf_counter()
        if stop["flag"]:
            raise Preempted(143)


def run(job: Job) -> None:
    """The train rule's job: train one cell into the folder of its outputs."""
    train_cell(
        job.config,
        job.cell,
        job.base(),
        out_dir=job.folder("summary"),
        threads=job.threads,
        step0_dir=job.folder("step0_measured"),
    )
