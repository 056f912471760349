"""Metric definitions: the one place for names, labels and derived-metric formulas.

Every table and figure reads its names and labels from here (design section 6, docs/design.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    higher_is_better: bool | None  # None: neither (scales, diagnostics)
    description: str


_M = [
    Metric("chance_corrected_matched_router_score", "chance-corrected matched router score", True,
           "within_task_router_probe_corrected x strategy_match_rate: 0 when router z predicts the followed "
           "strategy no better than the majority class (a collapsed cell), the ranking metric"),
    Metric("matched_router_score", "matched router score", True,
           "within_task_router_probe x strategy_match_rate"),
    Metric("within_task_router_probe", "within-task router probe", True,
           "per task, CV accuracy of a linear probe from router-sampled z to the strategy the generation followed (unambiguous matches); mean over tasks"),
    Metric("global_router_probe", "global router probe", True,
           "one probe over all tasks from router-sampled z to task:strategy"),
    Metric("strategy_match_rate", "strategy-match rate", True,
           "fraction of generations whose trace matches at least one strategy"),
    Metric("posterior_probe", "posterior probe", True,
           "per task, CV accuracy from the posterior mean mu_q(x, y_true) to the true strategy; mean over tasks"),
    Metric("final_answer_accuracy", "final answer accuracy", True,
           "mean verifier result over router-sampled greedy generations"),
    Metric("reconstruction_loss", "reconstruction loss", False,
           "raw reconstruction: mean_i A_i(l)"),
    Metric("distribution_normalized_reconstruction_loss", "dist-normalized reconstruction", False,
           "base-relative reconstruction: raw / S_ref"),
    Metric("tokcc_reconstruction_loss", "tokcc reconstruction", False,
           "token-weighted concentration-corrected reconstruction: mean_i A_i(w*l) / T_ref"),
    Metric("kl_prior_loss", "KL to prior", False,
           "KL(q(z|x,y) || p_router(z|x)), summed over latent dims, mean over examples"),
    Metric("active_reconstruction_objective", "active reconstruction objective", False,
           "the reconstruction family this cell optimizes"),
    Metric("kl_over_active_reconstruction", "KL / active recon", None,
           "kl_prior_loss / active_reconstruction_objective"),
    Metric("inferred_zfree_reference_scale", "inferred z-free reference scale", None,
           "reconstruction_loss / distribution_normalized_reconstruction_loss = S_ref"),
    Metric("posterior_router_probe_gap", "posterior-router probe gap", None,
           "mean over the tasks both probes cover of posterior_probe - within_task_router_probe"),
]
METRICS: dict[str, Metric] = {m.name: m for m in _M}
# the order of the original study's "Metric Distributions" table
DISTRIBUTION_METRICS = list(METRICS)
# a training history (long format): the cell trainer's rows; the entangle stage's have no cell_id
HISTORY_COLUMNS = ["cell_id", "step", "task", "metric", "value"]
ENTANGLE_HISTORY_COLUMNS = HISTORY_COLUMNS[1:]
# objective.forward_losses key -> the metric (history, record and metrics-row column) it is
LOSS_METRIC_OF = {"raw": "reconstruction_loss", "dist_norm": "distribution_normalized_reconstruction_loss",
                  "tokcc": "tokcc_reconstruction_loss", "kl": "kl_prior_loss",
                  "active": "active_reconstruction_objective"}
LOSS_METRICS = list(LOSS_METRIC_OF.values())
PROBE_METRICS = ["within_task_router_probe", "global_router_probe", "posterior_probe"]
# what stands next to every probe number: chance (majority-class rate), shuffled-label control,
# chance-corrected accuracy (accuracy - chance) / (1 - chance), tasks covered
PROBE_CONTROLS = ("chance", "shuffled", "corrected", "tasks")

# diagnostics logged during training (weights default 0)
DIAGNOSTICS = {
    "posterior_variance": "posterior variance (mean exp(logvar_q))",
    "router_marginal_kl_to_prior": "router marginal KL to N(0, I)",
}
# per-task training-history metrics (task != "all")
PER_TASK_HISTORY = {
    "token_count_mean": "mean supervised tokens per example",
    "example_share": "share of examples",
    "token_share": "share of supervised tokens",
    "loss_share": "share of the summed (aggregated) reconstruction loss",
    "grad_norm_share": "share of gradient norm",
}


# how the trainer's validation history names its proxies when shown (dynamics tables, figures):
# the router probe there scores the followed strategy by likelihood, on a small subset
VALIDATION_LABELS = {
    "within_task_router_probe": "validation router probe (likelihood-scored)",
    "matched_router_score": "validation matched router score (likelihood-scored)",
    "posterior_probe": "validation posterior probe",
    "final_answer_accuracy": "validation answer accuracy (decoded subset)",
    "strategy_match_rate": "validation strategy-match rate (decoded subset)",
}


def history_label(name: str) -> str:
    """The label of a training-history metric: validation proxies by their own names."""
    return VALIDATION_LABELS.get(name, label(name))


def probe_label(name: str) -> str:
    """Labels for a metric or a probe control (`within_task_router_probe_chance` ->
    "within-task router probe: chance")."""
    for m in PROBE_METRICS:
        for c in PROBE_CONTROLS:
            if name == f"{m}_{c}":
                return f"{METRICS[m].label}: {'chance-corrected' if c == 'corrected' else c}"
    return label(name)


def label(name: str) -> str:
    if name in METRICS:
        return METRICS[name].label
    if name in DIAGNOSTICS:
        return DIAGNOSTICS[name]
    if name in PER_TASK_HISTORY:
        return PER_TASK_HISTORY[name]
    return name.replace("_", " ")


def _nan_if_missing(x) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return math.nan
    return x


def safe_ratio(a, b) -> float:
    a, b = _nan_if_missing(a), _nan_if_missing(b)
    if math.isnan(a) or math.isnan(b) or b == 0:
        return math.nan
    return a / b


def derive(row: dict) -> dict:
    """Add the derived metrics to a row that has the base metrics. Returns a new dict.

    The identities the tests check on every row live here and nowhere else.
    """
    out = dict(row)
    out["matched_router_score"] = _nan_if_missing(row.get("within_task_router_probe")) * _nan_if_missing(row.get("strategy_match_rate"))
    out["chance_corrected_matched_router_score"] = (_nan_if_missing(row.get("within_task_router_probe_corrected"))
                                                    * _nan_if_missing(row.get("strategy_match_rate")))
    if math.isnan(_nan_if_missing(row.get("posterior_router_probe_gap"))):  # else: computed over shared tasks
        out["posterior_router_probe_gap"] = _nan_if_missing(row.get("posterior_probe")) - _nan_if_missing(row.get("within_task_router_probe"))
    out["kl_over_active_reconstruction"] = safe_ratio(row.get("kl_prior_loss"), row.get("active_reconstruction_objective"))
    out["inferred_zfree_reference_scale"] = safe_ratio(row.get("reconstruction_loss"), row.get("distribution_normalized_reconstruction_loss"))
    return out


# ----------------------------------------------------------------------------- the per-cell row

BOOTSTRAP_FILE = "bootstrap.parquet"  # beside a cell's metrics.parquet
# probe table name -> metric name
PROBE_METRIC = {"within_task_router": "within_task_router_probe", "posterior": "posterior_probe",
                "global_router": "global_router_probe"}


def _probe_summary(probes, name: str) -> dict:
    """Mean accuracy / chance / shuffled / chance-corrected over the probe's 'ok' rows (one per
    task, or the global row); NaN when none is ok. `<metric>_tasks` counts the ok rows and
    `<metric>_task_list` names them."""
    m = PROBE_METRIC[name]
    ok = probes[(probes["probe"] == name) & (probes["status"] == "ok")]
    if ok.empty:
        return {m: math.nan, f"{m}_chance": math.nan, f"{m}_shuffled": math.nan, f"{m}_corrected": math.nan,
                f"{m}_tasks": 0, f"{m}_task_list": ""}
    return {m: float(ok["accuracy"].mean()), f"{m}_chance": float(ok["chance"].mean()),
            f"{m}_shuffled": float(ok["shuffled_accuracy"].mean()), f"{m}_corrected": float(ok["corrected"].mean()),
            f"{m}_tasks": int(len(ok)), f"{m}_task_list": ",".join(sorted(ok["task"]))}


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


# ----------------------------------------------------------------------------- intervals

N_BOOT = 1000  # bootstrap replicates per cell
BOOT_SEED = 20261201
# per-cell test metrics that get a 95% bootstrap interval (<metric>_ci_low / _ci_high)
BOOTSTRAP_METRICS = ["final_answer_accuracy", "strategy_match_rate", *LOSS_METRICS,
                     "within_task_router_probe", "within_task_router_probe_corrected", "posterior_probe",
                     "posterior_probe_corrected", "matched_router_score", "chance_corrected_matched_router_score",
                     "posterior_router_probe_gap"]


def resample_counts(task_sizes: dict, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """Per task, a [n_boot, n_t] matrix: how often each of the task's test examples (in record
    order) is drawn in each replicate, resampling within task. The draws depend only on (seed,
    task, n_t), so every cell evaluated on the same test examples gets the same replicates, and
    a difference of two cells' replicates is a paired bootstrap of their difference."""
    import zlib

    import numpy as np

    out = {}
    for task, n in task_sizes.items():
        rng = np.random.default_rng([seed, zlib.crc32(task.encode()), n])
        idx = rng.integers(0, n, size=(n_boot, n))
        counts = np.zeros((n_boot, n))
        np.add.at(counts, (np.arange(n_boot)[:, None], idx), 1)
        out[task] = counts
    return out


def bootstrap_replicates(records, probes, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """[n_boot, metric] replicates of the cell's test metrics (BOOTSTRAP_METRICS), test examples
    resampled within task. Probe accuracies resample the probes' out-of-fold predictions (the
    probes are not refit: the interval covers test-set sampling, not refitting); a replicate's
    chance level is its majority-class share, so the chance-corrected values move with it."""
    import numpy as np
    import pandas as pd

    tasks = sorted(records["task"].unique())
    by_task = {t: records[records["task"] == t] for t in tasks}
    C = resample_counts({t: len(g) for t, g in by_task.items()}, n_boot, seed)
    N = sum(len(g) for g in by_task.values())
    rep = {}

    def mean_of(values_by_task):
        return sum(C[t] @ np.asarray(v, dtype=float) for t, v in values_by_task.items()) / N

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
    rep["chance_corrected_matched_router_score"] = rep["within_task_router_probe_corrected"] * rep["strategy_match_rate"]
    shared = sorted(set(per_task["posterior"]) & set(per_task["within_task_router"]))
    rep["posterior_router_probe_gap"] = (np.nanmean([per_task["posterior"][t] - per_task["within_task_router"][t]
                                                     for t in shared], axis=0) if shared else np.full(n_boot, np.nan))
    return pd.DataFrame({m: rep[m] for m in BOOTSTRAP_METRICS})


def interval(replicates, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates (NaN replicates left out; NaN if none)."""
    import numpy as np

    v = np.asarray(replicates, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return math.nan, math.nan
    a = (1 - level) / 2 * 100
    lo, hi = np.percentile(v, [a, 100 - a])
    return float(lo), float(hi)


def cell_metrics_row(cell: dict, records, probes) -> dict:
    """One cell's metrics row from its evaluate records and probe tables (design section 6, docs/design.md).

    final_answer_accuracy = mean correct; strategy_match_rate = share of generations matching
    >= 1 strategy; probes = means over tasks of the 'ok' per-task probes (global: its row);
    losses = means of the per-example losses; derived metrics by `derive`.
    """
    from latentstrat.config import CELL_KEYS, beta_label, family_label

    row = {"cell_id": cell["cell_id"], "arm": cell["arm"], "role": cell["role"],
           **{k: cell[k] for k in CELL_KEYS},
           "family_label": family_label(cell["reconstruction_family"]), "beta_label": beta_label(cell["beta"])}
    row["final_answer_accuracy"] = float(records["correct"].astype(bool).mean())
    row["strategy_match_rate"] = float(records["matched_strategies"].map(len).gt(0).mean())
    for name in LOSS_METRICS:
        row[name] = float(records[name].astype(float).mean())
    for name in PROBE_METRIC:
        row.update(_probe_summary(probes, name))
    row["posterior_router_probe_gap"] = shared_task_gap(probes)
    row["followed_strategy_tv"], row["followed_strategy_tv_max"] = followed_strategy_tv(records)
    row = derive(row)
    row["n_test"] = int(len(records))
    row["n_tasks"] = int(records["task"].nunique())
    first = ["cell_id", "arm", "role", *CELL_KEYS, "family_label", "beta_label", *METRICS]
    return {k: row[k] for k in first + [k for k in row if k not in first]}


# the evaluate record columns the metrics read (evaluate.RECORD_COLUMNS has them all)
METRIC_RECORD_COLUMNS = ["cell_id", "task", "example_id", "strategy", "correct", "matched_strategies",
                         "followed_strategy", *LOSS_METRICS]
PROVENANCE = ["code_version", "code_commit", "code_dirty", "started_at", "finished_at", "host", "device"]


def write_cell_metrics(cfg: dict, cell: dict, records_path, probe_paths, out_path, bootstrap_path=None,
                       train_summary_path=None):
    """Check that records and probe tables belong to `cell` and cover its tasks, then write
    the one-row metrics.parquet (with 95% bootstrap intervals, `<metric>_ci_low/_ci_high`) and
    the bootstrap replicates (bootstrap.parquet beside it, or `bootstrap_path`). Returns the row
    as a DataFrame."""
    import pandas as pd

    from latentstrat.io import read_parquet, write_parquet
    from latentstrat.probes import read_probes

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
    for name, task_set in (("within_task_router", set(records["task"])), ("posterior", set(records["task"])),
                           ("global_router", {"global"})):
        missing = sorted(task_set - set(probes.loc[probes["probe"] == name, "task"]))
        if missing:
            raise ValueError(f"probe tables {[str(p) for p in probe_paths]} lack the {name} probe of {missing}")
    row = cell_metrics_row(cell, records, probes)
    if train_summary_path is not None:  # provenance: the code, host and times the cell trained with
        import json

        summary = json.loads(Path(train_summary_path).read_text())
        row.update({f"train_{k}": summary.get(k) for k in PROVENANCE})
    reps = bootstrap_replicates(records, probes)
    for m in BOOTSTRAP_METRICS:
        row[f"{m}_ci_low"], row[f"{m}_ci_high"] = interval(reps[m])
    df = pd.DataFrame([row])
    write_parquet(reps.astype("float32"), bootstrap_path or Path(out_path).with_name(BOOTSTRAP_FILE))
    write_parquet(df, out_path)
    return df
