"""Collection aggregate: per-cell metrics + histories -> the tables the report reads.

`aggregate_collection` loads the per-cell files named by the workflow; `aggregate_tables` does
the rest from DataFrames alone (the `python -m latentstrat.report` command uses it on summary
tables from elsewhere). Every table has a pure function below so it is unit-testable.

Conventions: the primary arm is the ablated arm (e.g. `sum`); a comparison arm is run here or
read from an external comparison summary table (columns in docs/comparison-table.md). Deltas
are primary minus comparison arm. Distributions use the population std (ddof=0, as the original study's
tables); across-seed std is the sample std (ddof=1).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from latentstrat import host, power
from latentstrat.config import CELL_KEYS, beta_label, expand_cells, external_arms, family_label, format_value
from latentstrat.io import write_parquet, write_text
from latentstrat.metrics import (BOOTSTRAP_FILE, DISTRIBUTION_METRICS, HISTORY_COLUMNS, METRICS, PROBE_METRICS, derive,
                                 interval, probe_label)

FAMILY_COL = "reconstruction_loss_family_label"
DELTA_METRICS = ["chance_corrected_matched_router_score", "matched_router_score", "final_answer_accuracy",
                 "active_reconstruction_objective"]
FALLBACK_METRIC = "matched_router_score"  # for summary tables that have no chance-corrected score
SHARE_METRICS = ["example_share", "token_share", "loss_share", "grad_norm_share"]
# dynamics summary: metric -> short name used in column names (seeds: base_relative_reconstruction)
DYNAMICS_METRICS = {
    "distribution_normalized_reconstruction_loss": "base_relative_reconstruction",
    "active_reconstruction_objective": "active_reconstruction_objective",
    "kl_prior_loss": "kl_prior_loss",
    "kl_over_active_reconstruction": "kl_over_active_reconstruction",
    # validation proxies get their own names: the router probe there scores which strategy the
    # generator follows by likelihood instead of decoding (train.validate), on a small subset
    "within_task_router_probe": "val_scored_router_probe",
    "posterior_probe": "val_posterior_probe",
    "matched_router_score": "val_scored_matched_router_score",
}
INIT_LABEL = "initialization"

# external comparison / summary tables (docs/comparison-table.md)
TABLE_REQUIRED = ["reconstruction_family", "beta", "token_aggregation", "beta_schedule", "matched_router_score"]


# ----------------------------------------------------------------------------- inputs


def validate_summary_table(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Check a comparison/summary table against docs/comparison-table.md; fill labels and derived metrics."""
    missing = [c for c in TABLE_REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"summary table {source} lacks required column {missing[0]!r} "
                         f"(required: {', '.join(TABLE_REQUIRED)}; see docs/comparison-table.md)")
    df = df.copy()
    for i, fam in enumerate(df["reconstruction_family"]):
        try:
            family_label(fam)
        except ValueError as e:
            raise ValueError(f"summary table {source}, column reconstruction_family, row {i}: {e}") from None
    for col in ["beta"] + [m for m in METRICS if m in df.columns]:
        bad = pd.to_numeric(df[col], errors="coerce").isna() & df[col].notna()
        if bad.any():
            raise ValueError(f"summary table {source}, column {col!r}, row {int(np.flatnonzero(bad)[0])}: not a number")
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["family_label"] = [family_label(f) for f in df["reconstruction_family"]]
    df["beta_label"] = [beta_label(b) for b in df["beta"]]
    df = _fill_derived(df)
    if "cell_id" not in df.columns:
        df["cell_id"] = [f"{source}#{i}" for i in range(len(df))]
    return df


def read_summary_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"summary table {path} does not exist")
    df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    return validate_summary_table(df, str(path))


def _fill_derived(df: pd.DataFrame) -> pd.DataFrame:
    """Derived metrics (metrics.derive) where the inputs exist and the column is absent/NaN."""
    df = df.copy()
    rows = [derive(r) for r in df.to_dict("records")]
    for name in ["matched_router_score", "chance_corrected_matched_router_score", "posterior_router_probe_gap",
                 "kl_over_active_reconstruction", "inferred_zfree_reference_scale"]:
        derived = pd.Series([r[name] for r in rows], index=df.index, dtype=float)
        if name in df.columns:
            df[name] = df[name].astype(float).fillna(derived)
        elif derived.notna().any():
            df[name] = derived
    return df


def load_cell_metrics(cfg: dict, metrics_paths: dict, upstream: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary of complete cells, collection_state of every expected cell). With `upstream`
    (cell id -> the files its metrics are computed from), a metrics file older than one of them
    (say evaluate records rewritten, or corrupted, after it) is not complete: its numbers
    describe outputs that are gone."""
    cells = expand_cells(cfg, validated=True)
    rows, state = [], []
    for c in cells:
        path = metrics_paths.get(c.cell_id)
        status, reason = "complete", ""
        newer = [Path(u) for u in (upstream or {}).get(c.cell_id, [])
                 if path is not None and Path(path).exists() and Path(u).exists()
                 and Path(u).stat().st_mtime > Path(path).stat().st_mtime]
        if path is None:
            status, reason = "incomplete", "no metrics path given"
        elif newer:
            status, reason = "incomplete", f"metrics file {path} is older than {newer[0]} (rerun the cell's jobs)"
        else:
            try:
                df = pd.read_parquet(path)
                if len(df) != 1:
                    raise ValueError(f"{len(df)} rows, expected 1")
                row = df.iloc[0].to_dict()
                if row.get("cell_id") != c.cell_id:
                    raise ValueError(f"cell_id {row.get('cell_id')!r} != expected {c.cell_id!r}")
                rows.append(row)
            except FileNotFoundError:
                status, reason = "incomplete", f"metrics file {path} missing"
            except Exception as e:  # unreadable / wrong content: the cell is incomplete, named
                status, reason = "incomplete", f"metrics file {path} unreadable: {e}"
        state.append({"cell_id": c.cell_id, "arm": c.arm, "role": c.role, "status": status, "reason": reason,
                      **{k: c.settings[k] for k in CELL_KEYS}})
    summary = pd.DataFrame(rows)
    if len(summary):
        summary = _fill_derived(summary)
    return summary, pd.DataFrame(state)


def load_bootstrap(paths: dict) -> dict:
    """cell id -> its bootstrap replicates (a cell without a readable file has no intervals)."""
    out = {}
    for cid, p in paths.items():
        try:
            out[cid] = pd.read_parquet(p)
        except Exception:  # noqa: BLE001 - missing or unreadable: that cell's intervals are NA
            continue
    return out


def load_histories(history_paths: dict) -> tuple[pd.DataFrame, list[str]]:
    frames, bad = [], []
    for cid, path in history_paths.items():
        try:
            df = pd.read_parquet(path)
            missing = [c for c in HISTORY_COLUMNS if c not in df.columns]
            if missing:
                raise ValueError(f"lacks columns {missing}")
            frames.append(df.assign(cell_id=cid))
        except Exception:
            bad.append(cid)
    hist = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=HISTORY_COLUMNS)
    return hist, bad


# ----------------------------------------------------------------------------- pure tables


def collection_state_counts(state: pd.DataFrame) -> pd.DataFrame:
    """Per arm: expected / complete / incomplete counts and the incomplete ids."""
    out = []
    for arm, g in state.groupby("arm", sort=False):
        inc = g[g.status != "complete"]
        out.append({"arm": arm, "role": g.role.iloc[0], "expected": len(g), "complete": int((g.status == "complete").sum()),
                    "incomplete": len(inc), "incomplete_cells": ", ".join(inc.cell_id)})
    return pd.DataFrame(out)


def setting_keys(df: pd.DataFrame) -> list[str]:
    """The cell settings a table records, except seed."""
    return [k for k in CELL_KEYS if k in df.columns and k != "seed"]


def seed_means(df: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (seeds averaged): metric means, `<metric>_std` (ddof=1), n_seeds."""
    if df.empty:
        return df
    keys = ["arm"] * ("arm" in df.columns) + setting_keys(df)
    metrics = [m for m in METRICS if m in df.columns]
    extra = [c for c in df.columns if c.endswith(("_chance", "_shuffled", "_corrected", "_tasks", "followed_strategy_tv",
                                                   "followed_strategy_tv_max")) or c in ("n_test", "n_tasks")]
    extra = [c for c in extra if pd.api.types.is_numeric_dtype(df[c])]
    ci = [c for c in df.columns if c.endswith(("_ci_low", "_ci_high"))]
    g = df.groupby(keys, sort=False, dropna=False)
    out = g[metrics + extra].mean().reset_index()
    std = g[metrics].std(ddof=1).reset_index(drop=True).add_suffix("_std")
    out = pd.concat([out, std], axis=1)
    out["n_seeds"] = g.size().values
    out["seeds"] = g["seed"].apply(lambda s: ",".join(format_value(v) for v in s)).values if "seed" in df.columns else ""
    out["cell_ids"] = g["cell_id"].apply(lambda s: ",".join(s)).values
    for c in ci:  # exact for one seed; replaced from the replicates (setting_intervals) for several
        out[c] = np.where(out["n_seeds"] == 1, g[c].first().values, np.nan)
    out["family_label"] = [family_label(f) for f in out["reconstruction_family"]]
    out["beta_label"] = [beta_label(b) for b in out["beta"]]
    return out


def setting_intervals(rows: pd.DataFrame, bootstrap: dict | None) -> pd.DataFrame:
    """For settings with several seeds: `<m>_ci_low/_ci_high` of the seed mean from the seeds'
    replicates (test-set noise), and `<m>_seed_ci_low/_high`, a t interval across seeds (seed
    noise)."""
    from scipy import stats

    rows = rows.copy()
    if rows.empty or "n_seeds" not in rows.columns:
        return rows
    for i, r in rows.iterrows():
        n = int(r["n_seeds"])
        if n < 2:
            continue
        reps = setting_replicates(r, bootstrap)
        for m in [m for m in METRICS if m in rows.columns]:
            if reps is not None and m in reps[1]:
                rows.loc[i, f"{m}_ci_low"], rows.loc[i, f"{m}_ci_high"] = interval(reps[0][:, reps[1].index(m)])
            sd = r.get(f"{m}_std", math.nan)
            if pd.notna(sd) and pd.notna(r[m]):
                half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
                rows.loc[i, f"{m}_seed_ci_low"], rows.loc[i, f"{m}_seed_ci_high"] = r[m] - half, r[m] + half
    return rows


def metric_distributions(rows: pd.DataFrame, metrics=None) -> pd.DataFrame:
    """min/mean/median/max/std (ddof=0) per metric over rows; metrics with no values are left out."""
    out = []
    names = []
    for m in metrics or DISTRIBUTION_METRICS:
        names.append(m)
        if m in PROBE_METRICS:  # chance, shuffled-label control and chance-corrected next to it
            names += [f"{m}_{c}" for c in ("chance", "shuffled", "corrected")]
    for m in names:
        if m not in rows.columns:
            continue
        v = rows[m].astype(float).dropna()
        if v.empty:
            continue
        out.append({"metric": m, "label": probe_label(m), "n": len(v), "min": v.min(),
                    "mean": v.mean(), "median": v.median(), "max": v.max(), "std": v.std(ddof=0)})
    return pd.DataFrame(out, columns=["metric", "label", "n", "min", "mean", "median", "max", "std"])


def pair_keys(primary: pd.DataFrame, comparison: pd.DataFrame, grid_axes) -> list[str]:
    """Keys that pair a primary row with a comparison row: the grid axes except aggregation."""
    return [k for k in grid_axes if k != "token_aggregation" and k in primary.columns and k in comparison.columns]


def _key(row, keys):
    return tuple(format_value(row[k]) for k in keys)


def arm_prefix(primary: pd.DataFrame, comparison: pd.DataFrame) -> tuple[str, str]:
    """Column prefixes: the arms' token aggregations (mean_/sum_) when they differ, else primary_/comparison_."""
    pa = set(primary["token_aggregation"]) if len(primary) else set()
    ra = set(comparison["token_aggregation"]) if len(comparison) else set()
    if len(pa) == 1 and len(ra) == 1 and pa != ra:
        return pa.pop(), ra.pop()
    return "primary", "comparison"


Z95 = 1.959963984540054


def row_se(row, m: str) -> float:
    """A row's standard error of metric m when no replicates are at hand: from its 95% interval
    (`<m>_ci_low/_ci_high`, normal approximation), else from its seeds (`<m>_std` / sqrt(n));
    NaN when the row carries neither."""
    lo, hi = row.get(f"{m}_ci_low", math.nan), row.get(f"{m}_ci_high", math.nan)
    if pd.notna(lo) and pd.notna(hi):
        return (float(hi) - float(lo)) / (2 * Z95)
    n, sd = row.get("n_seeds", 1), row.get(f"{m}_std", math.nan)
    if pd.notna(sd) and pd.notna(n) and n >= 2:
        return float(sd) / math.sqrt(float(n))
    return math.nan


def setting_replicates(row, bootstrap: dict | None):
    """Bootstrap replicates [n_boot, metric] of a setting row's metrics: its cell's, or the mean
    over its seeds' cells replicate by replicate; None when a cell has none."""
    if not bootstrap:
        return None
    ids = str(row.get("cell_ids", row.get("cell_id", ""))).split(",")
    reps = [bootstrap.get(i) for i in ids if i]
    if not reps or any(r is None for r in reps):
        return None
    return sum(r.to_numpy(dtype=float) for r in reps) / len(reps), list(reps[0].columns)


def common_cells(primary: pd.DataFrame, comparison: pd.DataFrame, grid_axes, arm: str,
                 metrics=DELTA_METRICS, bootstrap: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(common rows with comparison/primary values and deltas, primary rows without a match).

    Rows are setting-level (seed means). Delta = primary - comparison, with a 95% paired
    bootstrap interval (`delta_<m>_ci_low/_ci_high`) when both cells have replicates: the
    replicates resample the same test examples in both cells (metrics.resample_counts).
    """
    keys = pair_keys(primary, comparison, grid_axes)
    p_pre, r_pre = arm_prefix(primary, comparison)
    ref_index = {}
    for _, r in comparison.iterrows():
        ref_index.setdefault(_key(r, keys), r)
    rows, unmatched = [], []
    for _, p in primary.iterrows():
        r = ref_index.get(_key(p, keys))
        ident = {FAMILY_COL: p["family_label"], "beta_label": p["beta_label"]}
        if r is None:
            unmatched.append({"comparison_arm": arm, **ident, "primary_cell": p.get("cell_id", p.get("cell_ids")),
                              "reason": f"no {arm} row with " + ", ".join(f"{k}={format_value(p[k])}" for k in keys)})
            continue
        row = {"comparison_arm": arm, **ident}
        pr, rr = setting_replicates(p, bootstrap), setting_replicates(r, bootstrap)
        for m in metrics:
            rv, pv = float(r.get(m, math.nan)), float(p.get(m, math.nan))
            row[f"{r_pre}_{m}"], row[f"{p_pre}_{m}"], row[f"delta_{m}"] = rv, pv, pv - rv
            lo = hi = math.nan
            if pr is not None and rr is not None and m in pr[1]:
                k = pr[1].index(m)
                lo, hi = interval(pr[0][:, k] - rr[0][:, k])
            else:  # tables without replicates: from each side's own interval or its seeds
                se = math.hypot(row_se(p, m), row_se(r, m))
                if math.isfinite(se):
                    lo, hi = pv - rv - Z95 * se, pv - rv + Z95 * se
            row[f"delta_{m}_ci_low"], row[f"delta_{m}_ci_high"] = lo, hi
            if f"{m}_std" in p.index and p.get("n_seeds", 1) > 1:
                row[f"{p_pre}_{m}_std"] = p[f"{m}_std"]
        row["primary_cell"] = p.get("cell_ids", p.get("cell_id"))
        row["comparison_cell"] = r.get("cell_ids", r.get("cell_id"))
        rows.append(row)
    return pd.DataFrame(rows), pd.DataFrame(unmatched, columns=["comparison_arm", FAMILY_COL, "beta_label", "primary_cell", "reason"])


def verdict(lo: float, hi: float) -> str:
    """The sign of an effect from its 95% interval: negative / positive when the interval
    excludes 0, else cannot tell (also when there is no interval)."""
    if pd.isna(lo) or pd.isna(hi):
        return "cannot tell"
    return "negative" if hi < 0 else ("positive" if lo > 0 else "cannot tell")


ROUTER_SCORES = ("matched_router_score", "chance_corrected_matched_router_score")


def router_signal(row, above: dict | None) -> bool | None:
    """Does either cell of a common-cell row carry router structure above chance (its
    chance-corrected within-task router probe's 95% interval above 0)? None when unknown."""
    if above is None:
        return None
    ids = [i for col in ("primary_cell", "comparison_cell") for i in str(row.get(col, "")).split(",") if i]
    known = [above[i] for i in ids if i in above]
    return any(known) if known else None


def arm_contrasts(commons: dict, bootstrap: dict | None, metrics=DELTA_METRICS, above: dict | None = None) -> pd.DataFrame:
    """Per comparison arm and metric: the mean common-cell delta (primary - arm), its 95% paired
    bootstrap interval (replicates of the mean over cells), the verdict from it and the smallest
    difference that interval could detect (power.detectable_difference); plus how
    many single-cell deltas are negative / positive / cannot tell. A router-score delta between
    cells none of which has a router probe above chance (`above`: cell id -> bool) compares
    noise with noise: cannot tell, whatever its interval."""
    rows = []
    for arm, c in commons.items():
        if c is None or c.empty:
            continue
        for m in metrics:
            col = f"delta_{m}"
            if col not in c.columns:
                continue
            reps = []
            for _, r in c.iterrows():
                pr = setting_replicates({"cell_ids": r.get("primary_cell", "")}, bootstrap)
                rr = setting_replicates({"cell_ids": r.get("comparison_cell", "")}, bootstrap)
                if pr is None or rr is None or m not in pr[1]:
                    reps = None
                    break
                reps.append(pr[0][:, pr[1].index(m)] - rr[0][:, rr[1].index(m)])
            if reps:
                lo, hi = interval(np.nanmean(np.stack(reps), axis=0))
            else:  # independent cells: the mean's SE from each delta's interval
                ses = ((c[f"{col}_ci_high"] - c[f"{col}_ci_low"]) / (2 * Z95)).dropna()
                ok = c[col].notna() & c[f"{col}_ci_high"].notna()
                if ok.any() and len(ses) == int(ok.sum()):
                    se = math.sqrt(float((ses ** 2).sum())) / len(ses)
                    mu = float(c.loc[ok, col].mean())
                    lo, hi = mu - Z95 * se, mu + Z95 * se
                else:
                    lo = hi = math.nan
            signal = [router_signal(r, above) for _, r in c.iterrows()] if m in ROUTER_SCORES else [None] * len(c)
            each = [verdict(a, b) if s is not False else "cannot tell"
                    for a, b, s in zip(c.get(f"{col}_ci_low", pd.Series(dtype=float)),
                                       c.get(f"{col}_ci_high", pd.Series(dtype=float)), signal)]
            v, why = verdict(lo, hi), ""
            if m in ROUTER_SCORES and signal and all(s is False for s in signal):
                v, why = "cannot tell", "no cell of either arm has a router probe above chance"
            rows.append({"comparison_arm": arm, "metric": m, "n_cells": int(c[col].notna().sum()),
                         "mean_delta": float(c[col].mean()), "ci_low": lo, "ci_high": hi, "verdict": v, "why": why,
                         "detectable_delta": power.detectable_difference(lo, hi),
                         "router_signal_cells": sum(bool(s) for s in signal) if m in ROUTER_SCORES else None,
                         "cells_negative": each.count("negative"), "cells_positive": each.count("positive"),
                         "cells_cannot_tell": each.count("cannot tell")})
    return pd.DataFrame(rows, columns=["comparison_arm", "metric", "n_cells", "mean_delta", "ci_low", "ci_high", "verdict",
                                       "why", "detectable_delta", "router_signal_cells", "cells_negative", "cells_positive",
                                       "cells_cannot_tell"])


def differing_keys(p: pd.Series, r: pd.Series, ignore=("token_aggregation", "seed")) -> tuple[list[str], list[str]]:
    """(cell keys recorded on both rows whose values differ, cell keys the comparison does not record)."""
    diff, unknown = [], []
    for k in CELL_KEYS:
        if k in ignore:
            continue
        if k not in r.index or pd.isna(r[k]):
            unknown.append(k)
        elif k in p.index and format_value(p[k]) != format_value(r[k]):
            diff.append(k)
    return diff, unknown


def scale_table(primary: pd.DataFrame, comparisons: dict, commons: dict) -> pd.DataFrame:
    """Inferred z-free reference scale per arm (common cells for comparison arms) and primary/reference ratios."""
    col = "inferred_zfree_reference_scale"
    rows = []

    def stats(v):
        v = pd.Series(v, dtype=float).dropna()
        return {"n": len(v), "min": v.min(), "mean": v.mean(), "max": v.max(), "std": v.std(ddof=0)} if len(v) else None

    p_agg = _agg_name(primary)
    p_stats = stats(primary[col]) if col in primary.columns else None
    if p_stats:
        rows.append({"aggregation_mode": p_agg, "source": "primary arm", **p_stats})
    for arm, ref in comparisons.items():
        if col not in ref.columns:
            continue
        common = commons.get(arm)
        ids = set(common["comparison_cell"]) if common is not None and len(common) else set()
        key = "cell_ids" if "cell_ids" in ref.columns else "cell_id"
        sub = ref[ref[key].isin(ids)] if ids else ref.iloc[0:0]
        r_stats = stats(sub[col])
        if not r_stats:
            continue
        r_agg = _agg_name(ref)
        rows.append({"aggregation_mode": f"{r_agg}_reference_common_cells" + (f" ({arm})" if sum(_agg_name(r) == r_agg for r in comparisons.values()) > 1 else ""),
                     "source": arm, **r_stats})
        if p_stats:
            ratio = p_stats["mean"] / r_stats["mean"] if r_stats["mean"] else math.nan
            name = f"{p_agg}_over_{r_agg}_reference_ratio"
            if sum(_agg_name(r) == r_agg for r in comparisons.values()) > 1:
                name += f" ({arm})"
            rows.append({"aggregation_mode": name, "source": f"derived: primary / {arm}",
                         "n": 1, "min": ratio, "mean": ratio, "max": ratio, "std": 0.0})
    return pd.DataFrame(rows, columns=["aggregation_mode", "source", "n", "min", "mean", "max", "std"])


def _agg_name(df: pd.DataFrame) -> str:
    aggs = sorted(set(df["token_aggregation"])) if "token_aggregation" in df.columns and len(df) else []
    return "+".join(aggs) or "unknown"


def label_cells(df: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Join arm / family / beta labels / aggregation onto a table keyed by cell_id."""
    info = cells[["cell_id", "arm", "token_aggregation", "reconstruction_family", "beta"]].copy()
    if "seed" in cells.columns:
        info["seed"] = cells["seed"]
    info[FAMILY_COL] = [family_label(f) for f in info.reconstruction_family]
    info["beta_label"] = [beta_label(b) for b in info.beta]
    return df.merge(info, on="cell_id", how="left")


def checkpoint_label(step: int) -> str:
    return INIT_LABEL if int(step) == 0 else f"step {int(step)}"


def dynamics_summary(history_all: pd.DataFrame) -> pd.DataFrame:
    """Per cell: first/final step (step 0 labelled initialization), first/min/final per metric, max matched router."""
    rows = []
    for cid, g in history_all.groupby("cell_id", sort=False):
        first_step, final_step = int(g.step.min()), int(g.step.max())
        row = {"cell_id": cid, "first_checkpoint": checkpoint_label(first_step),
               "first_global_step": first_step, "final_global_step": final_step}
        for metric, short in DYNAMICS_METRICS.items():
            s = g[g.metric == metric].sort_values("step").set_index("step")["value"].astype(float).dropna()
            if s.empty:
                continue
            row[f"first_{short}"] = s.iloc[0]
            row[f"min_{short}"] = s.min()
            row[f"max_{short}"] = s.max()
            row[f"final_{short}"] = s.iloc[-1]
        rows.append(row)
    return pd.DataFrame(rows)


def per_task_checkpoints(history_task: pd.DataFrame, top_k: int) -> pd.DataFrame:
    """Per (task, cell): final and max matched router score, final answer accuracy; top_k cells per task."""
    rows = []
    for (task, cid), g in history_task.groupby(["task", "cell_id"], sort=False):
        r = g[g.metric == "matched_router_score"].sort_values("step")
        if r.empty:
            continue
        acc = g[g.metric == "final_answer_accuracy"].sort_values("step")
        rows.append({"task_name": task, "cell_id": cid, "final_val_scored_matched_router_score": r.value.iloc[-1],
                     "max_val_scored_matched_router_score": r.value.max(),
                     "step_of_max": int(r.step.iloc[int(np.argmax(r.value.values))]),
                     "final_val_decoded_answer_accuracy": acc.value.iloc[-1] if len(acc) else math.nan})
    df = pd.DataFrame(rows, columns=["task_name", "cell_id", "final_val_scored_matched_router_score",
                                     "max_val_scored_matched_router_score", "step_of_max",
                                     "final_val_decoded_answer_accuracy"])
    if df.empty:
        return df
    df = df.sort_values(["task_name", "max_val_scored_matched_router_score"], ascending=[True, False])
    return df.groupby("task_name", sort=False).head(top_k).reset_index(drop=True)


def derived_diagnostics(rows: pd.DataFrame) -> pd.DataFrame:
    cols = ["matched_router_score", "active_reconstruction_objective", "kl_prior_loss", "kl_over_active_reconstruction",
            "inferred_zfree_reference_scale", "posterior_router_probe_gap"]
    return _labelled(rows, cols)


def _labelled(rows: pd.DataFrame, cols) -> pd.DataFrame:
    out = pd.DataFrame({FAMILY_COL: rows["family_label"].values, "beta_label": rows["beta_label"].values})
    for c in cols:
        out[c] = rows[c].values if c in rows.columns else math.nan
        if f"{c}_std" in rows.columns and rows.get("n_seeds", pd.Series([1])).max() > 1:
            out[f"{c}_std"] = rows[f"{c}_std"].values
    out["cell_id"] = rows["cell_ids"].values if "cell_ids" in rows.columns else rows["cell_id"].values
    return out


def top_bottom(rows: pd.DataFrame, metric: str, k: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    cols = ["chance_corrected_matched_router_score", "matched_router_score", "within_task_router_probe",
            "within_task_router_probe_chance", "within_task_router_probe_shuffled", "within_task_router_probe_corrected",
            "strategy_match_rate", "followed_strategy_tv_max", "final_answer_accuracy", "reconstruction_loss",
            "kl_prior_loss"]
    cols = [metric, f"{metric}_ci_low", f"{metric}_ci_high"] + [c for c in cols if c != metric]
    cols += ["final_answer_accuracy_ci_low", "final_answer_accuracy_ci_high"]
    cols = [c for c in cols if c in rows.columns or not c.endswith(("_ci_low", "_ci_high"))]
    ranked = rows.dropna(subset=[metric]).sort_values(metric, ascending=False, kind="stable")
    bottom = rows.dropna(subset=[metric]).sort_values(metric, ascending=True, kind="stable")
    return _labelled(ranked.head(k), cols), _labelled(bottom.head(k), cols)


def task_shares(task, values) -> pd.Series:
    """Share of sum(values) per task (e.g. per-example aggregated losses A_i). Sums to 1."""
    s = pd.Series(np.asarray(values, dtype=float)).groupby(np.asarray(task)).sum()
    total = s.sum()
    if total == 0:
        raise ValueError("task_shares: values sum to 0")
    return s / total


def token_dominance(history_task: pd.DataFrame) -> pd.DataFrame:
    """Per aggregation, checkpoint (initialization / final) and task: mean shares over the cells of that aggregation.

    Shares are the trainer's per-task history metrics; `share_sum` per (aggregation, checkpoint,
    metric) is checked to be 1 and reported.
    """
    h = history_task[history_task.metric.isin(SHARE_METRICS)]
    if h.empty:
        return pd.DataFrame()
    rows = []
    for cid, g in h.groupby("cell_id", sort=False):
        first, last = g.step.min(), g.step.max()
        for which, step in (("initialization" if first == 0 else f"first (step {int(first)})", first), ("final", last)):
            snap = g[g.step == step].pivot_table(index="task", columns="metric", values="value", aggfunc="mean")
            mix = history_task[(history_task.cell_id == cid) & (history_task.metric == "batch_task_share")
                               & (history_task.step > 0)]  # the batches' mix over the whole run
            mix = mix.groupby("task").value.mean() if len(mix) else pd.Series(dtype=float)
            for task, r in snap.iterrows():
                rows.append({"cell_id": cid, "token_aggregation": g["token_aggregation"].iloc[0], "checkpoint": which,
                             "step": int(step), "task": task, **{m: r.get(m, math.nan) for m in SHARE_METRICS},
                             "batch_task_share": mix.get(task, math.nan)})
    per_cell = pd.DataFrame(rows)
    cols = SHARE_METRICS + ["batch_task_share"]
    out = (per_cell.groupby(["token_aggregation", "checkpoint", "task"], sort=False)[cols].mean(numeric_only=True)
           .reset_index())
    out["n_cells"] = per_cell.groupby(["token_aggregation", "checkpoint", "task"], sort=False).size().values
    return out


def gradient_clipping(history_all: pd.DataFrame) -> pd.DataFrame:
    """Per token aggregation: the clipping threshold, the mean pre-clip gradient norm and the
    fraction of training steps whose norm was clipped (over every cell and checkpoint window):
    whether the threshold bound, and for which aggregation."""
    h = history_all[history_all.metric.isin(["grad_norm_preclip", "clipped_fraction", "grad_clip"])]
    if h.empty:
        return pd.DataFrame(columns=["token_aggregation", "grad_clip", "grad_norm_preclip_mean", "clipped_fraction", "n_cells"])
    w = h.pivot_table(index=["cell_id", "step"], columns="metric", values="value").reset_index()
    w["token_aggregation"] = w.cell_id.map(dict(zip(history_all.cell_id, history_all.token_aggregation)))
    g = w.groupby("token_aggregation", sort=False)
    return pd.DataFrame({"token_aggregation": list(g.groups), "grad_clip": g.grad_clip.first().values,
                         "grad_norm_preclip_mean": g.grad_norm_preclip.mean().values,
                         "clipped_fraction": g.clipped_fraction.mean().values, "n_cells": g.cell_id.nunique().values})


def share_sums(dominance: pd.DataFrame) -> pd.DataFrame:
    if dominance.empty:
        return dominance
    return dominance.groupby(["token_aggregation", "checkpoint"], sort=False)[SHARE_METRICS].sum().reset_index()


# ----------------------------------------------------------------------------- cell sanity

SANITY_COLUMNS = ["cell_id", "arm", FAMILY_COL, "beta_label", "final_answer_accuracy", "entangled_answer_accuracy",
                  "strategy_match_rate", "entangled_strategy_match_rate", "step0_base_relative_reconstruction",
                  "final_base_relative_reconstruction", "router_probe_tasks", "posterior_probe_tasks", "n_tasks",
                  "followed_strategy_tv_max", "collapsed", "passed", "failures"]
CELL_CHECK_COL = "cell_check"  # "ok" / "FAIL" / "" (not checked) in every table that names cells


def entangled_reference(quality: dict | None) -> dict:
    """The entangled model's answer accuracy and strategy-match rate (its quality check, mean over
    tasks), the yardstick a cell is held to; {} when there is no check (skipped or not given)."""
    tasks = (quality or {}).get("tasks") or {}
    if not tasks:
        return {}
    def mean(check):
        return float(np.mean([t["checks"][check]["value"] for t in tasks.values()]))
    return {"answer_accuracy": mean("answer_accuracy"), "strategy_match_rate": mean("strategy_match_rate"),
            "n_tasks": len(tasks)}


def cell_sanity(summary: pd.DataFrame, history_all: pd.DataFrame, entangled: dict, thr: dict) -> pd.DataFrame:
    """One row per complete cell: is it a working model of the tasks (design section 6, cell sanity, docs/design.md)?

    Checks (thresholds from the `report` config): final answer accuracy and strategy-match rate
    >= sanity_min_*_ratio x the entangled model's; step-0 base-relative reconstruction (validation)
    within sanity_step0_tolerance of 1 (the cell starts as the entangled model); final base-relative
    reconstruction (test) <= sanity_max_base_relative; the within-task router probe usable on
    >= sanity_min_probe_coverage of the tasks. A check whose input is absent is not run (named in
    `failures` as "not checked"); `passed` is then NA unless another check failed."""
    rows = []
    step0 = {}
    if len(history_all):
        h = history_all[(history_all.metric == "distribution_normalized_reconstruction_loss") & (history_all.step == 0)]
        step0 = dict(zip(h.cell_id, h.value.astype(float)))
    for _, r in summary.iterrows():
        n_tasks = float(r["n_tasks"]) if "n_tasks" in r.index and pd.notna(r["n_tasks"]) else entangled.get("n_tasks", math.nan)
        row = {"cell_id": r["cell_id"], "arm": r.get("arm", ""), FAMILY_COL: family_label(r["reconstruction_family"]),
               "beta_label": beta_label(r["beta"]),
               "final_answer_accuracy": float(r.get("final_answer_accuracy", math.nan)),
               "entangled_answer_accuracy": entangled.get("answer_accuracy", math.nan),
               "strategy_match_rate": float(r.get("strategy_match_rate", math.nan)),
               "entangled_strategy_match_rate": entangled.get("strategy_match_rate", math.nan),
               "step0_base_relative_reconstruction": step0.get(r["cell_id"], math.nan),
               "final_base_relative_reconstruction": float(r.get("distribution_normalized_reconstruction_loss", math.nan)),
               "router_probe_tasks": float(r.get("within_task_router_probe_tasks", math.nan)),
               "posterior_probe_tasks": float(r.get("posterior_probe_tasks", math.nan)), "n_tasks": n_tasks}
        fails, unchecked = [], []

        def check(name, inputs, ok, why):
            if any(v is None or math.isnan(v) for v in inputs):
                unchecked.append(name)
            elif not ok:
                fails.append(why)

        ea, ca = row["entangled_answer_accuracy"], row["final_answer_accuracy"]
        check("answer accuracy", (ea, ca), ca >= thr["sanity_min_answer_ratio"] * ea,
              f"answer accuracy {fmt_num(ca)} < {thr['sanity_min_answer_ratio']} x entangled {fmt_num(ea)}")
        es, cs = row["entangled_strategy_match_rate"], row["strategy_match_rate"]
        check("strategy match", (es, cs), cs >= thr["sanity_min_strategy_match_ratio"] * es,
              f"strategy match {fmt_num(cs)} < {thr['sanity_min_strategy_match_ratio']} x entangled {fmt_num(es)}")
        s0 = row["step0_base_relative_reconstruction"]
        check("step-0 base-relative reconstruction", (s0,), abs(s0 - 1) <= thr["sanity_step0_tolerance"],
              f"step-0 base-relative reconstruction {fmt_num(s0)} is not 1 +- {thr['sanity_step0_tolerance']} "
              "(the cell did not start as the entangled model)")
        fb = row["final_base_relative_reconstruction"]
        check("final base-relative reconstruction", (fb,), fb <= thr["sanity_max_base_relative"],
              f"final base-relative reconstruction {fmt_num(fb)} > {thr['sanity_max_base_relative']}")
        rp = row["router_probe_tasks"]
        cover = rp / n_tasks if n_tasks and not math.isnan(n_tasks) else math.nan
        check("router probe coverage", (cover,), cover >= thr["sanity_min_probe_coverage"],
              f"within-task router probe usable on {fmt_num(rp)} of {fmt_num(n_tasks)} tasks")
        tv = float(r.get("followed_strategy_tv_max", math.nan))
        row["followed_strategy_tv_max"] = tv
        # collapse is a finding about the cell, not a broken cell: flagged, not failed
        row["collapsed"] = None if math.isnan(tv) else bool(tv >= thr["collapse_tv"])
        row["passed"] = False if fails else (None if unchecked else True)
        row["failures"] = "; ".join(fails + ([f"not checked: {', '.join(unchecked)}"] if unchecked else []))
        rows.append(row)
    return pd.DataFrame(rows, columns=SANITY_COLUMNS)


def fmt_num(v) -> str:
    return "NA" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.3g}"


def mark_cells(tables: dict, sanity: pd.DataFrame) -> None:
    """Add CELL_CHECK_COL to every table that names cells (cell_id, cell_ids, primary_cell,
    comparison_cell): FAIL when any named cell fails its sanity check, ok when all pass."""
    if sanity.empty:
        return
    status = dict(zip(sanity.cell_id, sanity.passed))
    id_cols = ("cell_id", "cell_ids", "primary_cell", "comparison_cell")

    def mark(row, cols):
        ids = [i for c in cols for i in str(row[c]).split(",") if i and i in status]
        if not ids:
            return ""
        vals = [status[i] for i in ids]
        return "FAIL" if any(v is False for v in vals) else ("ok" if all(v is True for v in vals) else "")

    for name, df in tables.items():
        cols = [c for c in id_cols if c in df.columns]
        if name == "cell_sanity" or df.empty or not cols or name.startswith("history"):
            continue
        df[CELL_CHECK_COL] = [mark(r, cols) for _, r in df.iterrows()]


# ----------------------------------------------------------------------------- metadata


def collection_metadata(summary: pd.DataFrame, state: pd.DataFrame, code_now: str | None = None) -> pd.DataFrame:
    """field | value: when the collection's cells were trained (first start, last finish), the
    code versions they record (with counts), hosts and devices, planned vs observed cells, and
    how many cells ran with code other than `code_now` (the working tree's version)."""
    rows = [("planned cells", str(len(state))),
            ("observed cells (with final metrics)", str(int((state.status == "complete").sum())) if len(state) else "0")]

    def counts(col):
        if col not in summary.columns or summary[col].isna().all():
            return "NA (not recorded)"
        return ", ".join(f"{v} ({n} cells)" for v, n in summary[col].fillna("NA").astype(str).value_counts().items())

    if "train_started_at" in summary.columns and summary.train_started_at.notna().any():
        rows += [("first cell started", str(summary.train_started_at.dropna().min())),
                 ("last cell finished", str(summary.train_finished_at.dropna().max()))]
    else:
        rows += [("first cell started", "NA (not recorded)"), ("last cell finished", "NA (not recorded)")]
    rows += [("code versions", counts("train_code_version")), ("hosts", counts("train_host")),
             ("devices", counts("train_device"))]
    if code_now and "train_code_version" in summary.columns:
        other = summary[summary.train_code_version.notna() & (summary.train_code_version != code_now)]
        rows.append(("cells trained with other code than now", f"{len(other)} (now: {code_now})"))
    return pd.DataFrame(rows, columns=["field", "value"])


# ----------------------------------------------------------------------------- fairness


def fairness_table(primary_cells: pd.DataFrame, state: pd.DataFrame, primary_rows: pd.DataFrame, grid_axes,
                   comparisons: dict, commons: dict, unmatched: dict, history_all: pd.DataFrame,
                   history_task: pd.DataFrame, sanity: pd.DataFrame | None = None) -> pd.DataFrame:
    """claim | status | evidence, each computed from configs and outputs (design section 7, docs/design.md)."""
    rows = []
    if sanity is not None and len(sanity):
        bad = sanity[sanity.passed.eq(False)]
        unchecked = sanity[sanity.passed.isna()]
        status = "not supported" if len(bad) else ("partial" if len(unchecked) else "supported")
        ev = f"{len(sanity) - len(bad) - len(unchecked)}/{len(sanity)} complete cells pass the cell sanity check"
        if len(bad):
            ev += "; failing: " + ", ".join(bad.cell_id)
        if len(unchecked):
            ev += f"; {len(unchecked)} not fully checked (no entangled quality check or history)"
        rows.append({"claim": "cells are working models (cell sanity)", "status": status, "evidence": ev})
    pst = state[state.role == "primary"] if "role" in state.columns else state
    n_exp, n_ok = len(pst), int((pst.status == "complete").sum())
    missing = list(pst[pst.status != "complete"].cell_id)
    status = "supported" if n_ok == n_exp and n_exp else ("partial" if n_ok else "not supported")
    ev = f"{n_ok}/{n_exp} primary cells have final metrics" + (f"; missing: {', '.join(missing)}" if missing else "")
    rows.append({"claim": "planned grid completeness", "status": status, "evidence": ev})

    fixed, varying = [], []
    for k in CELL_KEYS:
        if k not in primary_cells.columns or k in grid_axes:
            continue
        vals = sorted({format_value(v) for v in primary_cells[k].dropna()})
        (fixed if len(vals) == 1 else varying).append(f"{k}={'/'.join(vals)}")
    status = "supported" if not [v for v in varying if not v.startswith("seed=")] else "not supported"
    rows.append({"claim": "fixed-setting coverage", "status": status,
                 "evidence": "fixed " + ", ".join(fixed) + (f"; also varying outside the grid: {', '.join(varying)}" if varying else "")
                 + f"; grid axes: {', '.join(grid_axes)}"})

    for arm, ref in comparisons.items():
        common, un = commons.get(arm), unmatched.get(arm)
        n_c = 0 if common is None else len(common)
        n_p = len(primary_rows)
        status = "supported" if n_c == n_p and n_p else ("partial" if n_c else "not supported")
        ev = f"{n_c} common cells of {n_p} primary rows with {arm}"
        if un is not None and len(un):
            ev += "; no matching row for " + ", ".join(f"{r[FAMILY_COL]} {r['beta_label']}" for _, r in un.iterrows())
        rows.append({"claim": f"common-cell comparison ({arm})", "status": status, "evidence": ev})
        rows.append({"claim": f"aggregation-only causal attribution ({arm})",
                     **attribution(primary_rows, ref, common, grid_axes, arm)})

    rows.append({"claim": "training-dynamics diagnosis", **dynamics_status(history_all, primary_cells)})
    rows.append({"claim": "token-count dominance", **dominance_status(history_task)})
    n_seeds = primary_rows["n_seeds"] if "n_seeds" in primary_rows.columns else pd.Series([1] * len(primary_rows))
    seeds = sorted({format_value(s) for s in primary_cells.get("seed", pd.Series(dtype=float)).dropna()})
    lo = int(n_seeds.min()) if len(n_seeds) else 0
    status = "supported" if lo >= 3 else ("partial" if lo == 2 else "not supported")
    rows.append({"claim": "seed replication", "status": status,
                 "evidence": f"{lo} seed(s) per setting at least (seeds: {', '.join(seeds) or 'none'}); 3 or more needed"})
    return pd.DataFrame(rows, columns=["claim", "status", "evidence"])


def attribution(primary_rows: pd.DataFrame, ref: pd.DataFrame, common: pd.DataFrame | None, grid_axes, arm: str) -> dict:
    """supported when paired cells differ only in token_aggregation; not supported naming the key otherwise."""
    if common is None or common.empty:
        return {"status": "not supported", "evidence": f"no common cells with {arm}"}
    keys = pair_keys(primary_rows, ref, grid_axes)
    ref_index = {_key(r, keys): r for _, r in ref.iterrows()}
    diffs, unknown = {}, set()
    for _, p in primary_rows.iterrows():
        r = ref_index.get(_key(p, keys))
        if r is None:
            continue
        d, u = differing_keys(p, r)
        unknown.update(u)
        for k in d:
            diffs.setdefault(k, (set(), set()))
            diffs[k][0].add(format_value(p[k]))
            diffs[k][1].add(format_value(r[k]))
    p_agg, r_agg = arm_prefix(primary_rows, ref)
    if diffs:
        parts = [f"{k}: {p_agg} rows use {'/'.join(sorted(a))}, {arm} rows use {'/'.join(sorted(b))}" for k, (a, b) in diffs.items()]
        return {"status": "not supported", "evidence": "paired cells differ besides token_aggregation in " + "; ".join(parts)}
    if unknown:
        return {"status": "partial", "evidence": f"recorded settings match, but {arm} does not record {', '.join(sorted(unknown))}"}
    return {"status": "supported", "evidence": f"{len(common)} paired cells differ only in token_aggregation ({p_agg} vs {r_agg})"}


def dynamics_status(history_all: pd.DataFrame, primary_cells: pd.DataFrame) -> dict:
    ids = set(primary_cells.cell_id)
    h = history_all[history_all.cell_id.isin(ids)] if len(history_all) else history_all
    if h.empty:
        return {"status": "not supported", "evidence": "no training history for primary cells"}
    n_cells = h.cell_id.nunique()
    n_ck = h.groupby("cell_id").step.nunique()
    first = int(h.step.min())
    ev = f"{n_cells}/{len(ids)} primary cells with history, {int(n_ck.min())}-{int(n_ck.max())} validation checkpoints"
    if first != 0:
        return {"status": "partial", "evidence": ev + f"; earliest checkpoint is step {first}: exact initialization metrics are absent"}
    with_init = h[h.step == 0].cell_id.nunique()
    status = "supported" if n_cells == len(ids) and with_init == n_cells else "partial"
    return {"status": status, "evidence": ev + f"; {with_init} with step-0 (initialization) metrics"}


def dominance_status(history_task: pd.DataFrame) -> dict:
    have = sorted(set(history_task.metric) & set(SHARE_METRICS)) if len(history_task) else []
    if not have:
        return {"status": "not supported", "evidence": "no per-task share metrics in the histories"}
    lack = [m for m in SHARE_METRICS if m not in have]
    return {"status": "partial" if lack else "supported",
            "evidence": f"per-task {', '.join(have)} for {history_task.cell_id.nunique()} cells" + (f"; missing {', '.join(lack)}" if lack else "")}


def availability_table(primary_rows: pd.DataFrame, comparisons: dict, commons: dict, history_all: pd.DataFrame,
                       history_task: pd.DataFrame) -> pd.DataFrame:
    """diagnostic | local_data (yes/partial/no) | local_source | missing_data_note, from what exists."""
    def has(df, *cols):
        return len(df) > 0 and all(c in df.columns and df[c].notna().any() for c in cols)

    def hist_has(h, metric):
        return len(h) > 0 and (h.metric == metric).any()

    rows = []

    def add(diag, ok, source, note_if_missing, partial=False, note=""):
        rows.append({"diagnostic": diag, "local_data": "partial" if (ok and partial) else ("yes" if ok else "no"),
                     "local_source": source if ok else "", "missing_data_note": note if ok else note_if_missing})

    add("KL-to-reconstruction trade-off", has(primary_rows, "kl_prior_loss", "active_reconstruction_objective"), "summary",
        "summary lacks kl_prior_loss or active_reconstruction_objective")
    add("KL/reconstruction ratio", has(primary_rows, "kl_over_active_reconstruction"), "summary", "no KL / active ratio")
    ref_scale = any(has(r, "inferred_zfree_reference_scale") for r in comparisons.values())
    add("Sum scale vs mean scale", has(primary_rows, "inferred_zfree_reference_scale") and ref_scale,
        "summary + comparison arm", "no comparison arm with reconstruction_loss and distribution_normalized_reconstruction_loss")
    n_common = sum(len(c) for c in commons.values() if c is not None)
    add("Mean-vs-sum objective scale", n_common > 0, "common_cells", "no common cells with a comparison arm")
    add("Posterior-router gap", has(primary_rows, "posterior_router_probe_gap"), "summary", "no posterior / router probes")
    add("KL dynamics over training", hist_has(history_all, "kl_prior_loss"), "history_long", "no history with kl_prior_loss")
    add("Reconstruction dynamics", hist_has(history_all, "distribution_normalized_reconstruction_loss"), "history_long",
        "no history with base-relative reconstruction")
    first = int(history_all.step.min()) if len(history_all) else None
    add("Initialization / first-eval scale", first is not None, "history_long", "no history",
        partial=first not in (None, 0),
        note="" if first == 0 else f"earliest validation checkpoint is step {first}; exact initialization metrics are absent")
    dom = dominance_status(history_task)
    add("Token-count dominance", dom["status"] != "not supported", "history_per_task_long",
        "requires per-task example/token/loss/gradient shares in the histories", partial=dom["status"] == "partial",
        note=dom["evidence"] if dom["status"] == "partial" else "")
    seeds_lo = int(primary_rows["n_seeds"].min()) if has(primary_rows, "n_seeds") else 1
    add("Seed replication", seeds_lo >= 2, "summary_by_setting", "one seed per setting", partial=seeds_lo == 2,
        note="2 seeds only" if seeds_lo == 2 else "")
    add("Fairness of the collection", True, "collection config + collection_state", "")
    return pd.DataFrame(rows, columns=["diagnostic", "local_data", "local_source", "missing_data_note"])


# ----------------------------------------------------------------------------- driver


def report_settings(report_cfg: dict | None) -> dict:
    """The `report` config section with the schema's defaults filled in."""
    from latentstrat.config import load_schema

    props = load_schema()["properties"]["report"]["properties"]
    return {**{k: v.get("default") for k, v in props.items()}, **(report_cfg or {})}


def ranking_metric(rows: pd.DataFrame, wanted: str) -> tuple[str, str]:
    """(the metric rows are ranked by, a note when it is not the one asked for)."""
    if wanted in rows.columns and rows[wanted].notna().any():
        return wanted, ""
    if wanted != FALLBACK_METRIC and FALLBACK_METRIC in rows.columns:
        return FALLBACK_METRIC, f"ranked by {FALLBACK_METRIC}: the rows have no {wanted}"
    return wanted, ""


def aggregate_tables(summary: pd.DataFrame, state: pd.DataFrame, comparisons: dict, grid_axes, history: pd.DataFrame,
                     out_dir: str | Path, top_k: int = 5, primary_metric: str = "chance_corrected_matched_router_score",
                     meta: dict | None = None, entangle_quality: dict | None = None,
                     bootstrap: dict | None = None, costs: pd.DataFrame | None = None) -> dict:
    """All aggregate tables from DataFrames; writes parquet + CSV under out_dir. Returns {name: DataFrame}.

    summary: complete cells (all arms; `role` column marks the primary arm, else all rows are primary).
    comparisons: external comparison arm name -> validated table; run-here arms come from summary.
    entangle_quality: the entangle stage's quality.json (the cell sanity check's yardstick), or None.
    bootstrap: cell id -> its bootstrap replicates (metrics.bootstrap_replicates), for intervals.
    costs: per cell job seconds (cell_costs), or None.
    """
    out_dir = Path(out_dir)
    t: dict[str, pd.DataFrame] = {}
    role = summary["role"] if "role" in summary.columns else pd.Series("primary", index=summary.index)
    primary_cells = summary[role == "primary"]
    t["summary"] = summary
    t["collection_state"] = state
    t["collection_state_counts"] = collection_state_counts(state)
    by_setting = setting_intervals(seed_means(summary), bootstrap)
    t["summary_by_setting"] = by_setting
    primary_rows = setting_intervals(seed_means(primary_cells), bootstrap)
    t["metric_distributions"] = metric_distributions(primary_rows)
    refs = dict(comparisons)
    if "arm" in summary.columns:
        for arm in summary.loc[role != "primary", "arm"].unique():
            refs[arm] = setting_intervals(seed_means(summary[summary.arm == arm]), bootstrap)
    refs = {a: (seed_means(r) if "n_seeds" not in r.columns else r) for a, r in refs.items()}
    commons, unmatched = {}, {}
    for arm, ref in refs.items():
        commons[arm], unmatched[arm] = common_cells(primary_rows, ref, grid_axes, arm, bootstrap=bootstrap)
    t["common_cells"] = _concat(commons.values())
    above = None
    if "within_task_router_probe_corrected_ci_low" in summary.columns:
        above = dict(zip(summary.cell_id, summary.within_task_router_probe_corrected_ci_low.astype(float) > 0))
    t["arm_contrasts"] = arm_contrasts(commons, bootstrap, above=above)
    t["unmatched_rows"] = _concat(unmatched.values())
    t["reference_scale"] = scale_table(primary_rows, refs, commons)
    t["derived_diagnostics"] = derived_diagnostics(primary_rows)
    primary_metric, ranking_note = ranking_metric(primary_rows, primary_metric)
    t["top_rows"], t["bottom_rows"] = top_bottom(primary_rows, primary_metric, top_k)

    cells_info = pd.concat([state[["cell_id", "arm", "token_aggregation", "reconstruction_family", "beta", "seed"]]],
                           ignore_index=True) if len(state) else pd.DataFrame(columns=["cell_id", "arm", "token_aggregation", "reconstruction_family", "beta", "seed"])
    hist = history if len(history) else pd.DataFrame(columns=HISTORY_COLUMNS)
    hist = label_cells(hist, cells_info) if len(hist) else hist.assign(**{c: [] for c in ["arm", "token_aggregation", FAMILY_COL, "beta_label"]})
    h_all, h_task = hist[hist.task == "all"], hist[hist.task != "all"]
    t["history_long"], t["history_per_task_long"] = h_all, h_task
    dyn = dynamics_summary(h_all) if len(h_all) else pd.DataFrame()
    t["dynamics_summary"] = label_cells(dyn, cells_info) if len(dyn) else dyn
    t["per_task_checkpoints"] = label_cells(per_task_checkpoints(h_task, top_k), cells_info) if len(h_task) else pd.DataFrame()
    t["token_dominance"] = token_dominance(h_task) if len(h_task) else pd.DataFrame()
    t["token_dominance_sums"] = share_sums(t["token_dominance"])
    t["gradient_clipping"] = gradient_clipping(h_all) if len(h_all) else gradient_clipping(pd.DataFrame(columns=["metric"]))
    t["collection_metadata"] = collection_metadata(summary, state, host.code_version()["code_version"])
    t["cell_costs"] = costs if costs is not None else cell_costs(None, [])
    t["cell_sanity"] = cell_sanity(summary, h_all, entangled_reference(entangle_quality),
                                   report_settings((meta or {}).get("report")))
    t["fairness"] = fairness_table(primary_cells, state, primary_rows, grid_axes, refs, commons, unmatched, h_all, h_task,
                                   t["cell_sanity"])
    t["data_availability"] = availability_table(primary_rows, refs, commons, h_all, h_task)
    mark_cells(t, t["cell_sanity"])
    for name, df in t.items():
        df = df.reset_index(drop=True)
        write_parquet(df, out_dir / f"{name}.parquet")
        with_text = df.to_csv(index=False)
        write_text(with_text, out_dir / f"{name}.csv")
    write_text(json.dumps({"grid_axes": list(grid_axes), "top_k": top_k, "primary_metric": primary_metric,
                           "ranking_note": ranking_note,
                           "comparison_arms": list(refs), **(meta or {})}, indent=2, default=str) + "\n",
               out_dir / "aggregate_meta.json")
    return t


def _concat(frames) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_entangle_quality(path) -> dict:
    """The entangle stage's quality.json (per-task temperature-1 checks)."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"entangle quality report {p} is unreadable ({e}); rerun the entangle stage") from None


def aggregate_collection(cfg: dict, metrics_paths: dict, history_paths: dict, out_dir, quality_path=None,
                         upstream: dict | None = None, bench_dir=None, configfile=None) -> dict:
    """The aggregate job: per-cell metrics + histories of a collection (+ the entangle stage's
    quality.json, the cell sanity check's yardstick) -> aggregate tables under out_dir, and
    FOLLOWUP_FILE: the seeds that would settle a `cannot tell` of the main contrast (or none).
    `upstream`: see load_cell_metrics (the partial report after a failed run passes it).
    `bench_dir`: the collection's Snakemake benchmark folder, for what a cell costs; `configfile`:
    the collection's config file, which a follow-up config extends."""
    quality = load_entangle_quality(quality_path) if quality_path else None
    comparisons = {}
    for arm in external_arms(cfg):  # validated before any other work: a bad table names its column
        comparisons[arm["name"]] = read_summary_table(arm["table"])
    summary, state = load_cell_metrics(cfg, metrics_paths, upstream)
    complete = set(state.loc[state.status == "complete", "cell_id"])
    history, bad = load_histories({c: p for c, p in history_paths.items() if c in complete})
    bootstrap = load_bootstrap({c: Path(p).with_name(BOOTSTRAP_FILE) for c, p in metrics_paths.items() if c in complete})
    grid_axes = [k for k in CELL_KEYS if k in cfg["grid"]]
    meta = {"collection": cfg["collection"], "description": cfg.get("description", ""), "title": cfg["report"].get("title", ""),
            "report": cfg["report"], "primary_arm": cfg["primary_arm"], "unreadable_histories": bad,
            "configfile": str(Path(configfile).resolve()) if configfile else None}
    costs = cell_costs(bench_dir, list(metrics_paths))
    t = aggregate_tables(summary, state, comparisons, grid_axes, history, out_dir, top_k=cfg["report"]["top_k"],
                         primary_metric=cfg["report"]["primary_metric"], meta=meta, entangle_quality=quality,
                         bootstrap=bootstrap, costs=costs)
    write_followup_plan(followup_plan(cfg, t["arm_contrasts"], costs), out_dir)
    return t


def write_followup_plan(plan: dict, out_dir) -> None:
    write_text(json.dumps(plan, indent=2, default=str) + "\n", Path(out_dir) / FOLLOWUP_FILE)


FOLLOWUP_FILE = "followup.json"

# benchmark folder (per cell job) -> part of a cell's cost
COST_PARTS = {"train": "train", "evaluate": "evaluate", "probe": "probes", "metrics": "metrics"}


def cell_costs(bench_dir, cells: list[str]) -> pd.DataFrame:
    """Per cell: the seconds of its train, evaluate, probe (summed over its probe jobs) and
    metrics jobs from Snakemake's benchmark files, and their total; cells whose work was done
    by another collection (shared cell work) have none here and are left out (all of them
    without a `bench_dir`)."""
    columns = ["cell_id", *(f"{p}_s" for p in COST_PARTS.values()), "total_s"]
    if not bench_dir:
        return pd.DataFrame(columns=columns)
    bench_dir, rows = Path(bench_dir), []
    for cid in cells:
        row = {"cell_id": cid}
        for folder, part in COST_PARTS.items():
            files = [bench_dir / folder / f"{cid}.tsv"] if folder != "probe" else sorted((bench_dir / folder / cid).glob("*.tsv"))
            secs = [float(pd.read_csv(f, sep="\t")["s"].iloc[-1]) for f in files if f.is_file()]
            row[f"{part}_s"] = sum(secs) if secs else math.nan
        row["total_s"] = sum(row[f"{p}_s"] for p in COST_PARTS.values())
        rows.append(row)
    df = pd.DataFrame(rows, columns=columns)
    return df[df.total_s.notna()].reset_index(drop=True)


def followup_plan(cfg: dict, contrasts: pd.DataFrame, costs: pd.DataFrame) -> dict:
    """{"needed": False} when the main contrast (the ranking metric against each comparison arm)
    decides or is not a matter of power; else the seeds that settle it (power.followup_need) and
    what they cost: cells added and seconds of one job slot per cell (mean of `costs`)."""
    metric = cfg["report"]["primary_metric"]
    if contrasts.empty or contrasts.loc[contrasts.metric == metric, "mean_delta"].isna().all():
        metric = FALLBACK_METRIC  # tables without the chance-corrected score (as ranking_metric)
    seeds = list(cfg.get("seeds") or [cfg["cell"]["seed"]])
    n_cells = len(expand_cells(cfg, validated=True))
    rows = contrasts[contrasts.metric == metric] if not contrasts.empty else contrasts
    needs = [n for n in (power.followup_need(r, len(seeds), cfg["report"]["near_zero_delta"],
                                             cfg["report"]["followup_max_seeds"]) for r in rows.to_dict("records")) if n]
    if not needs:
        return {"needed": False, "metric": metric}
    n = max(x["seeds"] for x in needs)
    per_seed = n_cells // len(seeds)
    seconds = float(costs.total_s.mean()) if len(costs) else math.nan
    threads = int(cfg["resources"]["threads"]) or 1
    return {"needed": True, "metric": metric, "collection": cfg["collection"], "needs": needs,
            "seeds": power.next_seeds(seeds, n), "cells_now": n_cells, "cells_added": per_seed * (n - len(seeds)),
            "seconds_per_cell": seconds, "parallel_cells": max(1, (os.cpu_count() or 1) // threads)}


def state_from_summary(summary: pd.DataFrame, arm: str = "primary") -> pd.DataFrame:
    """Collection state when only a summary table exists: every row is a complete primary cell."""
    st = pd.DataFrame({"cell_id": summary["cell_id"], "arm": summary.get("arm", arm), "role": "primary",
                       "status": "complete", "reason": ""})
    for k in CELL_KEYS:
        st[k] = summary[k].values if k in summary.columns else None
    return st


def grid_axes_from_rows(rows: pd.DataFrame) -> list[str]:
    """Cell keys (not seed) that take more than one value in the rows: the grid axes."""
    return [k for k in CELL_KEYS if k != "seed" and k in rows.columns and rows[k].map(format_value).nunique() > 1]


def aggregate_from_tables(summary_path, comparison_paths=(), history_path=None, out_dir=".", top_k: int = 5,
                          primary_metric: str = "chance_corrected_matched_router_score", config_path=None) -> dict:
    """Aggregate tables from a summary table (+ comparison tables, + long history) alone.
    `config_path`: the collection config the tables came from; with it, a `cannot tell` that is a
    matter of power gets a follow-up plan (FOLLOWUP_FILE) that extends that config."""
    from latentstrat.config import load_config

    cfg = load_config(config_path) if config_path else None
    summary = read_summary_table(summary_path)  # validate every input before any work
    comparisons = {Path(p).stem: read_summary_table(p) for p in comparison_paths}
    history = pd.DataFrame(columns=HISTORY_COLUMNS)
    if history_path:
        p = Path(history_path)
        history = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
        missing = [c for c in HISTORY_COLUMNS if c not in history.columns]
        if missing:
            raise ValueError(f"history table {p} lacks required column {missing[0]!r}")
        unknown = sorted(set(history.cell_id) - set(summary.cell_id))
        if unknown:
            raise ValueError(f"history table {p}: cell_id {unknown[0]!r} is not in the summary table {summary_path}")
    summary = summary.assign(role="primary")
    if "arm" not in summary.columns:
        summary["arm"] = _agg_name(summary)
    state = state_from_summary(summary)
    meta = {"collection": Path(summary_path).stem, "source": "tables", "summary_table": str(summary_path),
            "comparison_tables": [str(p) for p in comparison_paths], "history_table": str(history_path or ""),
            "configfile": str(Path(config_path).resolve()) if config_path else None}
    t = aggregate_tables(summary, state, comparisons, grid_axes_from_rows(summary), history, out_dir,
                         top_k=top_k, primary_metric=primary_metric, meta=meta)
    write_followup_plan(followup_plan(cfg, t["arm_contrasts"], cell_costs(None, [])) if cfg else {"needed": False},
                        out_dir)
    return t
