"""Cell-metrics stage: one cell's metrics row from its evaluate records and probe tables
(design section 6, docs/design.md), with 95% bootstrap intervals, written as the cell's
metrics.parquet and its bootstrap replicates (`write_cell_metrics`, the metrics rule). The
metric names, derived-metric formulas and the bootstrap's resampling are the registry's
(latentstrat.metrics).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from latentstrat.cell.probes import read_probes
from latentstrat.cells import CELL_KEYS, beta_label
from latentstrat.families import family_label
from latentstrat.io import read_parquet, write_parquet
from latentstrat.metrics import (
    ACTIVE_UNIT_VARIANCE,
    BOOT_SEED,
    BOOTSTRAP_FILE,
    BOOTSTRAP_METRICS,
    LOSS_METRICS,
    METRICS,
    N_BOOT,
    derive,
    interval,
    resample_counts,
)

# probe table name -> metric name
PROBE_METRIC = {
    "within_task_router": "within_task_router_probe",
    "posterior": "posterior_probe",
    "global_router": "global_router_probe",
}
# the evaluate record columns the metrics read (evaluate.RECORD_COLUMNS has them all)
METRIC_RECORD_COLUMNS = [
    "cell_id",
    "task",
    "example_id",
    "strategy",
    "correct",
    "matched_strategies",
    "followed_strategy",
    "router_mu",
    "posterior_mu",
    *LOSS_METRICS,
]
PROVENANCE = [
    "code_version",
    "code_commit",
    "code_dirty",
    "started_at",
    "finished_at",
    "host",
    "cpu",
    "cpu_capability",
    "device",
    "wall_time_s",
    "tokens_per_s",
]


def _probe_summary(probes, name: str) -> dict:
    """Mean accuracy / chance / shuffled / chance-corrected over the probe's 'ok' rows (one per
    task, or the global row); NaN when none is ok. `<metric>_tasks` counts the ok rows and
    `<metric>_task_list` names them."""
    m = PROBE_METRIC[name]
    ok = probes[(probes["probe"] == name) & (probes["status"] == "ok")]
    if ok.empty:
        return {
            m: math.nan,
            f"{m}_chance": math.nan,
            f"{m}_shuffled": math.nan,
            f"{m}_corrected": math.nan,
            f"{m}_tasks": 0,
            f"{m}_task_list": "",
        }
    return {
        m: float(ok["accuracy"].mean()),
        f"{m}_chance": float(ok["chance"].mean()),
        f"{m}_shuffled": float(ok["shuffled_accuracy"].mean()),
        f"{m}_corrected": float(ok["corrected"].mean()),
        f"{m}_tasks": int(len(ok)),
        f"{m}_task_list": ",".join(sorted(ok["task"])),
    }


def _information_summary(probes) -> dict:
    """router_information: the mean over tasks of the router_information rows' `information`
    (every task has one: a task where z says nothing reads 0, never NA, so both arms of a contrast
    average over the same tasks); `_tasks` counts them and `_task_list` names them."""
    ok = probes[(probes["probe"] == "router_information") & (probes["status"] == "ok")]
    return {
        "router_information": float(ok["information"].astype(float).mean()) if len(ok) else math.nan,
        "router_information_tasks": int(len(ok)),
        "router_information_task_list": ",".join(sorted(ok["task"])),
    }


def active_units(records) -> int:
    """Latent dimensions whose posterior mean minus router mean varies across the test inputs by
    more than ACTIVE_UNIT_VARIANCE (population variance): what z carries beyond what x decides."""
    d = np.stack(
        [np.asarray(q, float) - np.asarray(r, float) for q, r in zip(records["posterior_mu"], records["router_mu"])]
    )
    return int((d.var(axis=0) > ACTIVE_UNIT_VARIANCE).sum())


def followed_strategy_tv(records) -> tuple[float, float]:
    """(mean, max) over tasks of the total variation between the strategies the generations
    followed (those matching exactly one) and the true strategies of the same test examples:
    0 when the cell follows the data's mix, near 1 - 1/k when it collapses onto one strategy."""
    tvs = []
    for _, g in records.groupby("task", sort=True):
        followed = g["followed_strategy"].dropna()
        if followed.empty:
            tvs.append(1.0)  # nothing follows a strategy: as far from the data as it gets
            continue
        p = followed.value_counts(normalize=True)
        q = g["strategy"].value_counts(normalize=True)
        keys = set(p.index) | set(q.index)
        tvs.append(0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys))
    return (float(sum(tvs) / len(tvs)), float(max(tvs))) if tvs else (math.nan, math.nan)


def shared_task_gap(probes) -> float:
    """posterior - within-task router probe accuracy, averaged over the tasks where both probes
    ran: two means over different task sets would compare different tasks."""
    ok = probes[probes["status"] == "ok"]
    post = ok[ok["probe"] == "posterior"].set_index("task")["accuracy"]
    router = ok[ok["probe"] == "within_task_router"].set_index("task")["accuracy"]
    shared = sorted(set(post.index) & set(router.index))
    return float((post[shared] - router[shared]).mean()) if shared else math.nan


def _information_replicates(probes, by_task: dict, C: dict, n_boot: int) -> np.ndarray:
    """[n_boot] replicates of router_information: per task, the resampled test examples' bits
    (0 for those the probe did not see) summed, over the number drawn and the task's strategy
    entropy (the data's, fixed); mean over tasks."""
    ok = probes[(probes["probe"] == "router_information") & (probes["status"] == "ok")]
    per_task = []
    for _, pr in ok.iterrows():
        ids = by_task[pr["task"]]["example_id"].astype(str)
        bits = pd.Series(0.0, index=ids.to_numpy())
        bits.loc[[str(e) for e in pr["example_ids"]]] = np.asarray(pr["oof_bits"], dtype=float)
        w = C[pr["task"]]
        per_task.append((w @ bits.to_numpy()) / w.sum(1) / float(pr["strategy_entropy"]))
    return np.mean(per_task, axis=0) if per_task else np.full(n_boot, np.nan)


def bootstrap_replicates(records, probes, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """[n_boot, metric] replicates of the cell's test metrics (BOOTSTRAP_METRICS), test examples
    resampled within task. Probe accuracies resample the probes' out-of-fold predictions (the
    probes are not refit: the interval covers test-set sampling, not refitting); a replicate's
    chance level is its majority-class share, so the chance-corrected values move with it."""
    tasks = sorted(records["task"].unique())
    by_task = {t: records[records["task"] == t] for t in tasks}
    C = resample_counts({t: len(g) for t, g in by_task.items()}, n_boot, seed)
    N = sum(len(g) for g in by_task.values())
    rep = {}

    def mean_of(values_by_task):
        return sum(C[t] @ np.asarray(v, dtype=float) for t, v in values_by_task.items()) / N

    rep["router_information"] = _information_replicates(probes, by_task, C, n_boot)
    rep["final_answer_accuracy"] = mean_of({t: g["correct"].astype(bool) for t, g in by_task.items()})
    rep["strategy_match_rate"] = mean_of({t: g["matched_strategies"].map(len).gt(0) for t, g in by_task.items()})
    for m in LOSS_METRICS:
        rep[m] = mean_of({t: g[m].astype(float) for t, g in by_task.items()})
    per_task = {}
    for name in ("within_task_router", "posterior"):
        accs, corrs = {}, {}
        ok = probes[(probes["probe"] == name) & (probes["status"] == "ok")]
        for _, pr in ok.iterrows():
            t = pr["task"]
            pos_of = {e: i for i, e in enumerate(by_task[t]["example_id"].astype(str))}
            pos = np.array([pos_of[str(e)] for e in pr["example_ids"]], dtype=int)
            if len(pos) == 0:
                continue
            w = C[t][:, pos]  # [B, n_probe]
            total = w.sum(1)
            with np.errstate(invalid="ignore", divide="ignore"):
                acc = (w @ np.asarray(pr["oof_correct"], dtype=float)) / total
                labels = np.asarray(pr["labels"]).astype(str)
                chance = np.max([w[:, labels == c].sum(1) for c in np.unique(labels)], axis=0) / total
                corr = np.where(chance < 1, (acc - chance) / (1 - chance), np.nan)
            accs[t], corrs[t] = acc, corr
        per_task[name] = accs
        m = PROBE_METRIC[name]
        stack = lambda d: np.nanmean(np.stack(list(d.values())), axis=0) if d else np.full(n_boot, np.nan)  # noqa: E731
        with np.errstate(invalid="ignore"):
            rep[m], rep[f"{m}_corrected"] = stack(accs), stack(corrs)
    rep["matched_router_score"] = rep["within_task_router_probe"] * rep["strategy_match_rate"]
    shared = sorted(set(per_task["posterior"]) & set(per_task["within_task_router"]))
    rep["posterior_router_probe_gap"] = (
        np.nanmean([per_task["posterior"][t] - per_task["within_task_router"][t] for t in shared], axis=0)
        if shared
        else np.full(n_boot, np.nan)
    )
    return pd.DataFrame({m: rep[m] for m in BOOTSTRAP_METRICS})


def cell_metrics_row(cell: dict, records, probes) -> dict:
    """One cell's metrics row from its evaluate records and probe tables (design section 6, docs/design.md).

    final_answer_accuracy = mean correct; strategy_match_rate = share of generations matching
    >= 1 strategy; probes = means over tasks of the 'ok' per-task probes (global: its row);
    losses = means of the per-example losses; derived metrics by `derive`.
    """
    row = {
        "cell_id": cell["cell_id"],
        "arm": cell["arm"],
        "role": cell["role"],
        **{k: cell[k] for k in CELL_KEYS},
        "family_label": family_label(cell["reconstruction_family"]),
        "beta_label": beta_label(cell["beta"]),
    }
    row["final_answer_accuracy"] = float(records["correct"].astype(bool).mean())
    row["strategy_match_rate"] = float(records["matched_strategies"].map(len).gt(0).mean())
    for name in LOSS_METRICS:
        row[name] = float(records[name].astype(float).mean())
    row.update(_information_summary(probes))
    for name in PROBE_METRIC:
        row.update(_probe_summary(probes, name))
    row["active_units"] = active_units(records)
    row["posterior_router_probe_gap"] = shared_task_gap(probes)
    row["followed_strategy_tv"], row["followed_strategy_tv_max"] = followed_strategy_tv(records)
    row = derive(row)
    row["n_test"] = int(len(records))
    row["n_tasks"] = int(records["task"].nunique())
    first = ["cell_id", "arm", "role", *CELL_KEYS, "family_label", "beta_label", *METRICS]
    return {k: row[k] for k in first + [k for k in row if k not in first]}


def write_cell_metrics(
    cfg: dict, cell: dict, records_path, probe_paths, out_path, bootstrap_path=None, train_summary_path=None
):
    """Check that records and probe tables belong to `cell` and cover its tasks, then write
    the one-row metrics.parquet (with 95% bootstrap intervals, `<metric>_ci_low/_ci_high`) and
    the bootstrap replicates (bootstrap.parquet beside it, or `bootstrap_path`). Returns the row
    as a DataFrame."""
    records = read_parquet(records_path, "evaluate records", columns=METRIC_RECORD_COLUMNS)
    if records.empty:
        raise ValueError(f"evaluate records {records_path} have no rows")
    cid = cell["cell_id"]
    other = sorted(set(records["cell_id"]) - {cid})
    if other:
        raise ValueError(f"evaluate records {records_path} belong to cell {other[0]!r}, not {cid!r}")
    probes = read_probes(probe_paths)
    other = sorted(set(probes["cell_id"]) - {cid})
    if other:
        raise ValueError(f"probe tables {[str(p) for p in probe_paths]} include cell {other[0]!r}, not {cid!r}")
    for name, task_set in (
        ("within_task_router", set(records["task"])),
        ("router_information", set(records["task"])),
        ("posterior", set(records["task"])),
        ("global_router", {"global"}),
    ):
        missing = sorted(task_set - set(probes.loc[probes["probe"] == name, "task"]))
        if missing:
            raise ValueError(f"probe tables {[str(p) for p in probe_paths]} lack the {name} probe of {missing}")
    row = cell_metrics_row(cell, records, probes)
    if train_summary_path is not None:  # provenance: the code, host and times the cell trained with
        summary = json.loads(Path(train_summary_path).read_text())
        row.update({f"train_{k}": summary.get(k) for k in PROVENANCE})
    reps = bootstrap_replicates(records, probes)
    for m in BOOTSTRAP_METRICS:
        row[f"{m}_ci_low"], row[f"{m}_ci_high"] = interval(reps[m])
    df = pd.DataFrame([row])
    write_parquet(reps.astype("float32"), bootstrap_path or Path(out_path).with_name(BOOTSTRAP_FILE))
    write_parquet(df, out_path)
    return df
