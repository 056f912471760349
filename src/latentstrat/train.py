"""Disentangle trainer: one cell per call (design sections 4-5, stage 4, docs/design.md).

Per step: one posterior pass (z ~ q, reparameterized) and one router+generator pass; b comes
from the reference stage's tokens.parquet (never recomputed); batches are task-mixed
(data.task_mixed_batches). The batch order is a pure function of (seed, epoch) and the z noise
of (seed, step), so a resumed run replays exactly what an uninterrupted one does.

Validation (step 0 before any update, every eval_every steps, at the end) on a fixed subset of
the validation split (the first `val_probe_per_task` examples of each task):
- every reconstruction family, KL, active objective, KL/active, diagnostics, beta_t (z ~ q with
  a fixed noise draw, so successive evaluations differ only by the weights);
- posterior probe: mu_q(x, y_true) -> true strategy (unambiguous examples), per task and mean;
- router probes: router-sampled z -> the strategy the generator follows under that z. Decoding
  every example at every evaluation is too slow, so "follows" is scored, not decoded: the
  strategy whose canonical trace has the highest likelihood under p(y|x,z) (examples whose best
  trace is shared by several strategies are left out). The evaluate stage decodes.
- answer accuracy / strategy match on `val_decode_per_task` decoded examples per task;
- per task: mean token count, example / token share, share of the summed loss, share of the
  gradient norm of the active objective (one validation batch per task, equal sizes).
"""
from __future__ import annotations

import hashlib
import json
import math
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from latentstrat import data, host
from latentstrat import objective as obj
from latentstrat.config import STEP0_FILES, TRAIN_FILES, dump_json, init_id, parse_family
from latentstrat.decode import generate
from latentstrat.io import atomic_path, read_parquet, write_parquet
from latentstrat.metrics import HISTORY_COLUMNS, LOSS_METRIC_OF, derive
from latentstrat.model import build_model, device_for
from latentstrat.objective import forward_losses
from latentstrat.probes import linear_probe
from latentstrat.progress import Progress
from latentstrat.reference import load_b
from latentstrat.tasks import TASKS

GRAD_SHARE_ROWS = 16  # rows per task of the validation gradient-norm share
CHECKPOINT = "last.pt"
# forward_losses key -> history metric name
LOSS_NAMES = {**LOSS_METRIC_OF, "posterior_variance": "posterior_variance",
              "router_marginal_kl_to_prior": "router_marginal_kl_to_prior", "total": "total_loss"}


class NonFiniteLoss(RuntimeError):
    """A NaN/inf loss term; names the cell, the step and the term."""


class Preempted(SystemExit):
    """SIGTERM received: a checkpoint was written; exit non-zero so the scheduler reruns."""


# ----------------------------------------------------------------------------- inputs


def cell_scales(b_val, train_df: pd.DataFrame, aggregation: str, family: str) -> dict:
    n_bar = float(train_df.n_supervised.mean())
    s_ref, t_ref = obj.reference_scales(b_val, aggregation, parse_family(family).alpha, n_bar)
    return {"S_ref": s_ref, "T_ref": t_ref, "n_bar": n_bar}


# ----------------------------------------------------------------------------- losses


def check_finite(losses: dict, cell_id: str, step: int) -> None:
    for key in ("raw", "dist_norm", "tokcc", "active", "kl", "posterior_variance", "router_marginal_kl_to_prior", "total"):
        v = losses[key]
        bad = ~torch.isfinite(v.detach()) if v.ndim else ~torch.isfinite(v.detach().reshape(1))
        if bool(bad.any()):
            raise NonFiniteLoss(f"cell {cell_id}: step {step}: loss term {LOSS_NAMES[key]} is non-finite "
                                f"({v.detach().float().mean().item()}); last good checkpoint kept")


def step_noise(seed: int, step: int, shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(int(seed) * 1_000_003 + int(step)))


def batch_at(task_idx, batch_size: int, seed: int, step: int) -> list[int]:
    """The rows of training step `step`: its epoch's task-mixed batches (data.task_mixed_batches)
    are a pure function of (seed, epoch), so a resumed run replays the same batches."""
    per_epoch = math.ceil(len(task_idx) / batch_size)
    epoch = step // per_epoch
    return data.task_mixed_batches(task_idx, batch_size, np.random.default_rng([int(seed), int(epoch)]))[step % per_epoch]


def grad_clip_for(tcfg: dict, aggregation: str, family: str, scales: dict) -> float:
    """The gradient-norm clipping threshold of a cell: `train.grad_clip` is one number for every
    aggregation or a mapping aggregation -> number (0 = no clipping). With `train.grad_clip_unit:
    zfree_objective` the number is in units of the cell's z-free objective
    (objective.zfree_objective: S_ref for `raw`, 1 for the normalized families), so a `sum` cell,
    whose raw loss is ~n_bar times a `mean` cell's, is held to the same relative threshold and
    both arms clip at comparable rates; `absolute` takes the number as is. The report shows how
    often it bound."""
    c = tcfg["grad_clip"]
    if isinstance(c, dict):
        if aggregation not in c:
            raise ValueError(f"config key train.grad_clip: no threshold for token aggregation {aggregation!r} (have {sorted(c)})")
        c = c[aggregation]
    unit = obj.zfree_objective(family, scales) if tcfg["grad_clip_unit"] == "zfree_objective" else 1.0
    return float(c) * unit


def batch_stats(cell_id: str, tasks: list[str], steps: list[dict], clip: float, step: int,
                history: list[dict]) -> list[dict]:
    """History rows for the training steps since the previous checkpoint row, from the per-step
    records the loop keeps (`steps`: the pre-clip gradient norm and the batch's rows per task):
    the batches' task mix, the mean pre-clip gradient norm, the fraction of steps whose norm was
    clipped, and the threshold itself."""
    prev = max([h["step"] for h in history if h["metric"] == "clipped_fraction"] + [0])
    counts = np.sum([s["task_rows"] for s in steps[prev:step]], axis=0)
    norms = np.asarray([s["grad_norm"] for s in steps[prev:step]])
    rows = [dict(cell_id=cell_id, step=step, task="all", metric="grad_norm_preclip", value=float(norms.mean())),
            dict(cell_id=cell_id, step=step, task="all", metric="clipped_fraction",
                 value=float((norms > clip).mean()) if clip > 0 else 0.0),
            dict(cell_id=cell_id, step=step, task="all", metric="grad_clip", value=clip)]
    rows += [dict(cell_id=cell_id, step=step, task=t, metric="batch_task_share", value=float(counts[k] / counts.sum()))
             for k, t in enumerate(tasks)]
    return rows


# ----------------------------------------------------------------------------- validation


def validation_subset(df: pd.DataFrame, per_task: int) -> list[int]:
    """Row indices: the first `per_task` examples (by example_id) of each task."""
    rows = []
    for _, g in df.groupby("task", sort=True):
        rows += g.sort_values("example_id").index[:per_task].tolist()
    return rows


def _probe(X, y, cfg) -> tuple[float, float]:
    """(CV accuracy, chance level: the majority-class rate of the probed examples)."""
    if len(y) == 0:
        return math.nan, math.nan
    r = linear_probe(np.asarray(X), np.asarray(y), folds=cfg["probes"]["folds"], seed=cfg["probes"]["seed"],
                     shuffled_control=False)
    return float(r.accuracy), float(r.chance)


@torch.no_grad()
def scored_strategies(model, tokenizer, df: pd.DataFrame, rows: list[int], z: torch.Tensor, batch_size: int) -> list[str | None]:
    """Per row: the strategy whose canonical trace is most likely under p(y|x,z), or None when
    the best trace is shared by several strategies."""
    cand, owner = [], []
    for k, r in enumerate(rows):
        task, x = df.task[r], df.x[r]
        traces: dict[str, list[str]] = {}
        for s in TASKS[task].strategies:
            traces.setdefault(TASKS[task].render(x, s), []).append(s)
        for y, strategies in traces.items():
            cand.append({"task": task, "x": x, "y": y})
            owner.append((k, strategies))
    cdf = pd.DataFrame(cand)
    enc = data.encode(cdf, tokenizer, model.z_slots)
    dev = next(model.parameters()).device
    scores = np.zeros(len(cdf))
    for s in range(0, len(cdf), batch_size):
        idx = list(range(s, min(len(cdf), s + batch_size)))
        b = data.collate(enc, idx).to(dev)
        zz = z[[owner[i][0] for i in idx]].to(dev)
        logits, _, _ = model.generator(b.gen_ids, b.gen_mask, zz, b.z_open_pos, b.z_slot_pos, sup_pos=b.gen_sup_pos)
        nll = (obj.token_nll(logits, b.sup_ids) * b.sup_mask).sum(1)
        scores[idx] = -nll.cpu().numpy()
    best: dict[int, tuple[float, list[str]]] = {}
    for i, (k, strategies) in enumerate(owner):
        if k not in best or scores[i] > best[k][0]:
            best[k] = (scores[i], strategies)
    return [best[k][1][0] if len(best[k][1]) == 1 else None for k in range(len(rows))]


GAUSSIANS = ("mu_q", "logvar_q", "mu_r", "logvar_r")


@torch.no_grad()
def validate(model, tokenizer, cfg, cell, scales, val, step: int, measured: dict | None = None) -> list[dict]:
    """History rows for one evaluation (`val`: from `prepare_validation`): the losses over the
    whole validation split, the probes, the decoded subset and the per-task shares.
    `measured`: the model's own measurements (`measure_model`) when they were taken elsewhere:
    the shared step-0 validation of every cell starting from this model (`step0_validation`)."""
    was_training = model.training
    model.eval()
    rows = val["rows"]
    sub = val["df"].loc[rows]
    if measured is None:
        measured = measure_model(model, tokenizer, cfg, val, int(cell["seed"]))
    metrics, per_row = validation_losses(measured["passes"], val, cell, scales, step)
    metrics.update(measured["metrics"])
    metrics["matched_router_score"] = derive(metrics)["matched_router_score"]
    per_task = {t: dict(m) for t, m in measured["per_task"].items()}
    for t, m in per_task.items():
        if "final_answer_accuracy" in m:
            m["matched_router_score"] = derive(m)["matched_router_score"]
    grad = _task_grad_norms(model, val["enc"], val["b"], val["df"], rows, cell, scales, step, val,
                            next(model.parameters()).device)
    task_shares(sub, per_row["active"][torch.as_tensor(rows)].numpy().astype(np.float64), grad, per_task)
    if was_training:
        model.train()
    cid = cell["cell_id"]
    out = [dict(cell_id=cid, step=step, task="all", metric=k, value=float(v)) for k, v in metrics.items()]
    for t in sorted(per_task):
        out += [dict(cell_id=cid, step=step, task=t, metric=k, value=float(v)) for k, v in per_task[t].items()]
    return out


@torch.no_grad()
def measure_model(model, tokenizer, cfg, val, seed: int) -> dict:
    """What a validation measures of the model alone, whatever the cell's objective: the passes
    over the whole split (`validation_passes`), the probes and the decoded subset's metrics
    (overall in `metrics`, per task in `per_task`)."""
    was_training = model.training
    model.eval()
    tasks = sorted(val["df"].loc[val["rows"]].task.unique())
    per_task: dict[str, dict] = {t: {} for t in tasks}
    with model.merged():
        passes = validation_passes(model, val)
        on_subset = {k: passes[k][torch.as_tensor(val["rows"])] for k in GAUSSIANS}  # in `rows` order
        metrics = probe_metrics(model, tokenizer, cfg, val, on_subset, per_task)
        overall, decoded_by_task = _decoded_metrics(model, tokenizer, val["df"], val["decode_rows"], cfg, seed)
    metrics.update(overall)
    for t in tasks:
        per_task[t].update(decoded_by_task.get(t, {}))
    if was_training:
        model.train()
    return {"passes": passes, "metrics": metrics, "per_task": per_task}


def validation_passes(model, val) -> dict:
    """objective.forward_passes over the whole validation split, z ~ q with the fixed noise
    draw, in the split's row order: `l` (per row, a float32 array of its n_supervised token
    NLLs) and the Gaussians [N, D]."""
    df, enc = val["df"], val["enc"]
    bs = val["batch_size"]
    dev = next(model.parameters()).device
    acc: dict[str, list] = {k: [] for k in GAUSSIANS}
    l_rows: list = [None] * len(df)
    order = sorted(range(len(df)), key=lambda r: enc.lengths[r])  # length-grouped, deterministic
    for s in range(0, len(df), bs):
        idx = order[s:s + bs]
        batch = data.collate(enc, idx).to(dev)
        out = obj.forward_passes(model, batch, val["eps"][idx])
        l, n = out["l"].float().cpu().numpy(), batch.sup_mask.sum(1).tolist()
        for j, r in enumerate(idx):
            l_rows[r] = l[j, :n[j]].copy()
        for k in GAUSSIANS:
            acc[k].append(out[k].float().cpu())
    back = torch.empty(len(df), dtype=torch.long)
    back[torch.as_tensor(order)] = torch.arange(len(df))
    return {"l": l_rows, **{k: torch.cat(v)[back] for k, v in acc.items()}}


def _padded(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row 1-d arrays -> ([N, L_max] float32 zero-padded, [N, L_max] mask)."""
    t = [torch.tensor(np.asarray(r, dtype=np.float32)) for r in rows]
    values = torch.nn.utils.rnn.pad_sequence(t, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(x)) for x in t], batch_first=True)
    return values, mask


def validation_losses(passes: dict, val, cell, scales, step: int) -> tuple[dict, dict]:
    """J's terms over the whole validation split (the rows S_ref and T_ref are measured on, so a
    model equal to the reference scores exactly 1) from its passes: (history metrics, per-row
    tensors in the split's row order)."""
    l, mask = _padded(passes["l"])
    b, _ = _padded(val["b"])
    out = obj.losses({**passes, "l": l}, b, mask, cell, scales, step)
    r = {k: out[k].mean().item() for k in ("raw", "dist_norm", "tokcc", "active", "kl")}
    base = derive({"reconstruction_loss": r["raw"], "distribution_normalized_reconstruction_loss": r["dist_norm"],
                   "tokcc_reconstruction_loss": r["tokcc"], "kl_prior_loss": r["kl"],
                   "active_reconstruction_objective": r["active"]})
    metrics = {k: base[k] for k in ("reconstruction_loss", "distribution_normalized_reconstruction_loss",
                                     "tokcc_reconstruction_loss", "kl_prior_loss", "active_reconstruction_objective",
                                     "kl_over_active_reconstruction", "inferred_zfree_reference_scale")}
    metrics.update(posterior_variance=out["posterior_variance"].item(),
                   router_marginal_kl_to_prior=out["router_marginal_kl_to_prior"].item(),
                   beta_t=out["beta_t"], total_loss=out["total"].item())
    return metrics, {k: out[k] for k in ("raw", "dist_norm", "tokcc", "active", "kl")}


def probe_metrics(model, tokenizer, cfg, val, on_subset: dict, per_task: dict) -> dict:
    """Posterior probe (mu_q -> true strategy, unambiguous rows) and router probes (router-sampled
    z -> the strategy scored as followed) per task into `per_task`; their means and the global
    router probe returned."""
    rows, df = val["rows"], val["df"]
    sub = df.loc[rows]
    z_router = on_subset["mu_r"] + torch.exp(0.5 * on_subset["logvar_r"]) * val["router_eps"]
    followed = scored_strategies(model, tokenizer, df, rows, z_router, val["batch_size"])
    mu_q, zr = on_subset["mu_q"].numpy(), z_router.numpy()
    amb, task_arr, strat = sub.ambiguous.to_numpy(), sub.task.to_numpy(), sub.strategy.to_numpy()
    fol = np.array([f if f is not None else "" for f in followed], dtype=object)
    for t in per_task:
        m = (task_arr == t) & ~amb
        per_task[t]["posterior_probe"], per_task[t]["posterior_probe_chance"] = _probe(mu_q[m], strat[m], cfg)
        m2 = (task_arr == t) & (fol != "")
        per_task[t]["within_task_router_probe"], per_task[t]["within_task_router_probe_chance"] = _probe(zr[m2], fol[m2], cfg)
    out = {}
    for k in ("posterior_probe", "within_task_router_probe"):
        for key in (k, f"{k}_chance"):
            # the chance level averaged over the tasks the probe itself covers
            vals = [per_task[t][key] for t in per_task if np.isfinite(per_task[t][k])]
            out[key] = float(np.mean(vals)) if vals else math.nan
    g = fol != ""
    out["global_router_probe"], out["global_router_probe_chance"] = _probe(
        zr[g], np.array([f"{a}:{b}" for a, b in zip(task_arr[g], fol[g])]), cfg)
    return out


def task_shares(sub: pd.DataFrame, active: np.ndarray, grad: dict, per_task: dict) -> None:
    """Per task (over the probe subset: equal examples per task): mean token count, example /
    token share, share of the summed active objective and of the gradient norm."""
    n_sup = sub.n_supervised.to_numpy().astype(float)
    task_arr = sub.task.to_numpy()
    gsum = sum(grad.values())
    for t in per_task:
        m = task_arr == t
        per_task[t].update(token_count_mean=float(n_sup[m].mean()), example_share=float(m.mean()),
                           token_share=float(n_sup[m].sum() / n_sup.sum()),
                           loss_share=float(active[m].sum() / active.sum()) if active.sum() else math.nan,
                           grad_norm_share=grad[t] / gsum if gsum > 0 else math.nan)


def _decoded_metrics(model, tokenizer, df, rows, cfg, seed: int) -> tuple[dict, dict]:
    """Answer accuracy and strategy-match rate of router-sampled greedy generations on the
    decoded subset: (overall, {task: per-task})."""
    if not rows:
        return {"final_answer_accuracy": math.nan, "strategy_match_rate": math.nan}, {}
    sub = df.loc[rows]
    gen = generate(model, tokenizer, sub.x.tolist(), max_new_tokens=cfg["evaluate"]["max_new_tokens"],
                   batch_size=cfg["train"]["val_batch_size"], seed=seed, progress=False)
    correct = np.array([TASKS[t].final_answer_correct(x, y) for t, x, y in zip(sub.task, sub.x, gen.texts)], dtype=float)
    matched = np.array([len(TASKS[t].matching_strategies(x, y)) > 0 for t, x, y in zip(sub.task, sub.x, gen.texts)], dtype=float)
    task_arr = sub.task.to_numpy()
    by_task = {t: {"final_answer_accuracy": float(correct[task_arr == t].mean()),
                   "strategy_match_rate": float(matched[task_arr == t].mean())} for t in np.unique(task_arr)}
    return {"final_answer_accuracy": float(correct.mean()), "strategy_match_rate": float(matched.mean())}, by_task


def _task_grad_norms(model, enc, b_val, df, rows, cell, scales, step, val, dev) -> dict[str, float]:
    """Per task: gradient norm of the mean active objective on one validation batch of that
    task (GRAD_SHARE_ROWS rows each, equal across tasks)."""
    params = model.trainable_parameters()
    by_task: dict[str, list[int]] = {}
    for r in rows:
        by_task.setdefault(df.task[r], []).append(r)
    size = min(GRAD_SHARE_ROWS, min(len(v) for v in by_task.values()))
    out = {}
    for t, rs in sorted(by_task.items()):
        batch = data.collate(enc, rs[:size], b_val).to(dev)
        with torch.enable_grad():
            o = forward_losses(model, batch, cell, scales, step, val["eps"][rs[:size]])
            grads = torch.autograd.grad(o["active"].mean(), params, allow_unused=True)
        out[t] = math.sqrt(sum(float(g.float().pow(2).sum()) for g in grads if g is not None))
    return out


def prepare_validation(cfg, cell, tokenizer, val_df, b_val, latent_dim: int, z_slots: int) -> dict:
    """The fixed validation inputs of every evaluation: the split (losses), the probe subset
    `rows`, the decoded subset, and one noise draw per row for z ~ q and z ~ router."""
    val_df = val_df.reset_index(drop=True)
    rows = validation_subset(val_df, cfg["train"]["val_probe_per_task"])
    gen = torch.Generator().manual_seed(int(cell["seed"]) + 17)
    eps = torch.randn((len(val_df), latent_dim), generator=gen)
    router_eps = torch.randn((len(val_df), latent_dim), generator=gen)[rows]
    return {"df": val_df, "enc": data.encode(val_df, tokenizer, z_slots), "b": b_val, "rows": rows,
            "batch_size": int(cfg["train"]["val_batch_size"]),
            "eps": eps, "router_eps": router_eps,
            "decode_rows": validation_subset(val_df, cfg["train"]["val_decode_per_task"])}


# ----------------------------------------------------------------------------- shared step 0


def step0_fingerprint(model, cfg, val) -> str:
    """What a step-0 validation is a function of: every weight of the model as built (names,
    dtypes, shapes, bytes), the validation split, its noise draws and the settings that shape
    the probes and decodes."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{t.numel()}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    settings = {"train": {k: cfg["train"][k] for k in ("val_probe_per_task", "val_decode_per_task")},
                "probes": cfg["probes"], "max_new_tokens": cfg["evaluate"]["max_new_tokens"]}
    h.update(json.dumps(settings, sort_keys=True, default=str).encode())
    h.update(val["df"][["task", "example_id", "strategy", "x", "y"]].to_json(orient="values").encode())
    for k in ("eps", "router_eps"):
        h.update(val[k].numpy().tobytes())
    return h.hexdigest()


def save_step0(measured: dict, fingerprint: str, init: dict, val_df: pd.DataFrame, out_dir) -> None:
    """The step-0 measurements (`measure_model`) as STEP0_FILES in `out_dir`."""
    out_dir = Path(out_dir)
    p = measured["passes"]
    cols = {"task": val_df.task.tolist(), "example_id": val_df.example_id.tolist(), "l": p["l"]}
    cols.update({k: list(p[k].numpy()) for k in GAUSSIANS})
    write_parquet(pd.DataFrame(cols), out_dir / STEP0_FILES["passes"])
    # [name, value] pairs: the history keeps the order the metrics were measured in
    dump_json({"fingerprint": fingerprint, "init": init, "metrics": list(measured["metrics"].items()),
               "per_task": {t: list(m.items()) for t, m in measured["per_task"].items()}},
              out_dir / STEP0_FILES["measured"])


def load_step0(step0_dir, fingerprint: str, val_df: pd.DataFrame) -> dict:
    """The shared step-0 measurements in `step0_dir`, checked to be of this very model, split and
    settings (`step0_fingerprint`): a mismatch is an error naming the folder."""
    d = Path(step0_dir)
    meta = json.loads((d / STEP0_FILES["measured"]).read_text())
    if meta.get("fingerprint") != fingerprint:
        raise ValueError(f"step-0 validation {d} was measured on another model, validation split or settings than "
                         f"this cell starts from (fingerprint {str(meta.get('fingerprint'))[:12]} != {fingerprint[:12]}); "
                         f"delete the folder to measure it again")
    df = read_parquet(d / STEP0_FILES["passes"], what="step-0 validation passes")
    if df.task.tolist() != val_df.task.tolist() or df.example_id.tolist() != val_df.example_id.tolist():
        raise ValueError(f"step-0 validation {d / STEP0_FILES['passes']}: its rows are not the validation split's")
    passes = {"l": [np.asarray(v, dtype=np.float32) for v in df.l]}
    passes.update({k: torch.from_numpy(np.stack(df[k].to_numpy()).astype(np.float32)) for k in GAUSSIANS})
    return {"passes": passes, "metrics": dict(meta["metrics"]), "per_task": {t: dict(m) for t, m in meta["per_task"].items()}}


def step0_validation(cfg: dict, init: dict, data_dir, entangle_dir, out_dir, threads: int | None = None) -> str:
    """The step-0 validation that every cell starting from the model `init` (config.INIT_KEYS:
    the settings that decide a cell's model as built) shares: measured once here, read by each
    cell's trainer after it checks that its own model is this one. Returns the fingerprint."""
    torch.set_num_threads(int(threads or cfg["resources"]["threads"]))
    tokenizer = data.load_tokenizer(data_dir)
    val_df = data.load_split(data_dir, "validation").reset_index(drop=True)
    model = build_model(cfg, init, tokenizer, entangle_dir, data.added_token_ids(data_dir)).to(device_for(cfg))
    val = prepare_validation(cfg, init, tokenizer, val_df, None, int(init["latent_dim"]), int(init["z_slots"]))
    fingerprint = step0_fingerprint(model, cfg, val)
    measured = measure_model(model, tokenizer, cfg, val, int(init["seed"]))
    save_step0(measured, fingerprint, init, val_df, out_dir)
    print(f"step-0 validation of {init_id(init)}: fingerprint {fingerprint[:12]}, "
          f"posterior probe {measured['metrics']['posterior_probe']:.3f}, "
          f"answer accuracy {measured['metrics']['final_answer_accuracy']:.3f}")
    return fingerprint


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(path, model, opt, step: int, history: list[dict], extra: dict) -> None:
    """weights_only-loadable dict, written atomically (the previous one survives a crash)."""
    state = {"trainable": {k: v.cpu().clone() for k, v in model.trainable_state_dict().items()},
             "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(), "step": int(step),
             "history": {c: [h[c] for h in history] for c in HISTORY_COLUMNS}, **extra}
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
        log(f"checkpoint {path} is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            f"moved aside to {aside.name}, starting from step 0")
        return None


def run_fingerprint(cfg: dict, cell: dict, data_dir, entangle_dir) -> str:
    """What a checkpoint must have been written for to be resumed: the cell's settings, the
    config sections that shape its training, and the bytes of the data and the entangled model
    it starts from. A changed config or a rebuilt base gives a new fingerprint, so a stale
    checkpoint in the cell directory is never resumed (Slurm preemption keeps it equal)."""
    h = hashlib.sha256()
    sections = {k: cfg.get(k) for k in ("base", "data", "backbone", "entangle", "lora", "train")}
    h.update(json.dumps({"cell": cell, **sections}, sort_keys=True, default=str).encode())
    model_dir = Path(entangle_dir) / "model"  # every file: a sharded checkpoint has several
    files = [Path(data_dir) / "train.parquet"] + (sorted(model_dir.iterdir()) if model_dir.is_dir() else [])
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------- the stage


def train_cell(cfg: dict, cell: dict, data_dir, entangle_dir, reference_dir, out_dir, threads: int | None = None,
               step0_dir=None) -> dict:
    """Train one cell; write its adapters and heads (model.LatentStrategyModel.save_trained),
    history.parquet, summary.json. Resumes from
    out_dir/checkpoints/last.pt. `step0_dir`: the shared step-0 validation of the cell's init
    (`step0_validation`), else the cell measures its model at step 0 itself. Returns the
    summary."""
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    torch.set_num_threads(int(threads or cfg["resources"]["threads"]))
    out_dir = Path(out_dir)
    cid = cell["cell_id"]
    tcfg = cfg["train"]
    seed = int(cell["seed"])
    # inputs first: clear errors before any model work
    tokenizer = data.load_tokenizer(data_dir)
    train_df = data.load_split(data_dir, "train")
    val_df = data.load_split(data_dir, "validation")
    b_train = load_b(reference_dir, train_df)
    b_val = load_b(reference_dir, val_df)
    scales = cell_scales(b_val, train_df, cell["token_aggregation"], cell["reconstruction_family"])

    dev = device_for(cfg)
    model = build_model(cfg, cell, tokenizer, entangle_dir, data.added_token_ids(data_dir)).to(dev)
    if tcfg["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=tcfg["lr"], weight_decay=tcfg["weight_decay"])
    enc = data.encode(train_df, tokenizer, int(cell["z_slots"]))
    val = prepare_validation(cfg, cell, tokenizer, val_df, b_val, int(cell["latent_dim"]), int(cell["z_slots"]))

    ckpt_path = out_dir / "checkpoints" / CHECKPOINT
    fingerprint = run_fingerprint(cfg, cell, data_dir, entangle_dir)
    step, history, wall, tokens = 0, [], 0.0, 0
    # per step taken (checkpointed): pre-clip gradient norm and the batch's rows per task
    step_records: list[dict] = []
    clip = grad_clip_for(tcfg, cell["token_aggregation"], cell["reconstruction_family"], scales)
    ck = read_checkpoint(ckpt_path, log=lambda m: print(f"[{cid}] {m}", flush=True))
    if ck is not None and ck.get("cell_id") != cid:
        raise ValueError(f"checkpoint {ckpt_path} belongs to cell {ck.get('cell_id')!r}, not {cid!r}")
    if ck is not None and ck.get("fingerprint") != fingerprint:
        print(f"[{cid}] checkpoint {ckpt_path} was written for another config, data or entangled model "
              f"(fingerprint {str(ck.get('fingerprint'))[:12]} != {fingerprint[:12]}): starting from step 0")
        ck = None
    if ck is not None:
        model.load_trainable(ck["trainable"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["torch_rng"])
        step, wall, tokens = ck["step"], ck["wall_time_s"], ck["train_tokens"]
        step_records = list(ck.get("step_records", []))
        history = [dict(zip(HISTORY_COLUMNS, v)) for v in zip(*(ck["history"][c] for c in HISTORY_COLUMNS))]
        print(f"[{cid}] resumed from step {step}")
    stop = {"flag": False}
    prev_handler = signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("flag", True))

    def checkpoint():
        save_checkpoint(ckpt_path, model, opt, step, history,
                        {"cell_id": cid, "fingerprint": fingerprint, "wall_time_s": wall, "train_tokens": tokens,
                         "step_records": step_records})

    progress = Progress(cid, tcfg["steps"], step)
    try:
        model.train()
        if step == 0 and not history:
            measured = None
            if step0_dir is not None:
                measured = load_step0(step0_dir, step0_fingerprint(model, cfg, val), val["df"])
                print(f"[{cid}] step 0: the model measured in {step0_dir} (the same weights, split and settings)", flush=True)
            history += validate(model, tokenizer, cfg, cell, scales, val, 0, measured)
        while step < tcfg["steps"]:
            t0 = time.perf_counter()
            idx = batch_at(enc.task_idx, tcfg["batch_size"], seed, step)
            batch = data.collate(enc, idx, b_train).to(dev)
            losses = forward_losses(model, batch, cell, scales, step, step_noise(seed, step, (len(idx), model.latent_dim)))
            check_finite(losses, cid, step + 1)
            opt.zero_grad(set_to_none=True)
            losses["total"].backward()
            # the norm before clipping (inf = no clipping: the norm is measured, never applied)
            gnorm = torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), clip if clip > 0 else math.inf)
            step_records.append({"grad_norm": float(gnorm),
                                 "task_rows": np.bincount(batch.task_idx.cpu().numpy(), minlength=len(enc.tasks)).tolist()})
            opt.step()
            step += 1
            wall += time.perf_counter() - t0
            n_tok = int(batch.gen_mask.sum() + batch.post_mask.sum())
            tokens += n_tok
            progress.update(step, float(losses["total"].detach()), n_tok)
            if step % tcfg["eval_every"] == 0 or step == tcfg["steps"]:
                history += validate(model, tokenizer, cfg, cell, scales, val, step)
                history += batch_stats(cid, enc.tasks, step_records, clip, step, history)
            if step % tcfg["checkpoint_every"] == 0 or stop["flag"]:
                checkpoint()
            if stop["flag"]:
                raise Preempted(143)
    finally:
        signal.signal(signal.SIGTERM, prev_handler)

    model.save_trained(out_dir)
    write_parquet(pd.DataFrame(history, columns=HISTORY_COLUMNS), out_dir / TRAIN_FILES["history"])
    summary = {"cell_id": cid, "steps": step, "wall_time_s": wall, "train_tokens": tokens,
               "tokens_per_s": tokens / wall if wall > 0 else math.nan, "threads": torch.get_num_threads(), **scales,
               "config_hash": fingerprint[:16], "started_at": started_at,
               "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **host.provenance(str(dev))}
    dump_json(summary, out_dir / TRAIN_FILES["summary"])
    checkpoint()  # the final state, so a rerun after a lost output resumes at the end
    return summary
