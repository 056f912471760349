"""Setting rows of the primary arm against each comparison arm: common cells (paired settings
with deltas and their 95% intervals), the arm contrasts with their verdicts, and the inferred
z-free reference scale of each arm on those cells (`scale_table`).

A comparison arm is run here or read from an external comparison summary table (columns in
docs/comparison-table.md). Deltas are primary minus comparison arm.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from latentstrat import power
from latentstrat.aggregate.columns import DELTA_METRICS, FAMILY_COL
from latentstrat.aggregate.settings import aggregation_name, setting_replicates
from latentstrat.cells import CELL_KEYS, format_value
from latentstrat.metrics import interval

Z95 = 1.959963984540054
ROUTER_SCORES = ("matched_router_score", "chance_corrected_matched_router_score")
CONTRAST_COLUMNS = [
    "comparison_arm",
    "metric",
    "n_cells",
    "mean_delta",
    "ci_low",
    "ci_high",
    "verdict",
    "why",
    "detectable_delta",
    "router_signal_cells",
    "cells_negative",
    "cells_positive",
    "cells_cannot_tell",
]


def pair_keys(primary: pd.DataFrame, comparison: pd.DataFrame, grid_axes) -> list[str]:
    """Keys that pair a primary row with a comparison row: the grid axes except aggregation."""
    return [k for k in grid_axes if k != "token_aggregation" and k in primary.columns and k in comparison.columns]


def pair_key(row, keys) -> tuple:
    return tuple(format_value(row[k]) for k in keys)


def arm_prefix(primary: pd.DataFrame, comparison: pd.DataFrame) -> tuple[str, str]:
    """Column prefixes: the arms' token aggregations (mean_/sum_) when they differ, else primary_/comparison_."""
    pa = set(primary["token_aggregation"]) if len(primary) else set()
    ca = set(comparison["token_aggregation"]) if len(comparison) else set()
    if len(pa) == 1 and len(ca) == 1 and pa != ca:
        return pa.pop(), ca.pop()
    return "primary", "comparison"


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


def delta_interval(p, c, m: str, pr, cr) -> tuple[float, float]:
    """95% interval of primary row p minus comparison row c in metric m: paired bootstrap from
    their replicates (pr, cr: setting_replicates) when both have them, else from each side's own
    interval or its seeds (row_se); NaN when neither."""
    pv, cv = float(p.get(m, math.nan)), float(c.get(m, math.nan))
    if pr is not None and cr is not None and m in pr[1]:
        k = pr[1].index(m)
        return interval(pr[0][:, k] - cr[0][:, k])
    se = math.hypot(row_se(p, m), row_se(c, m))
    if math.isfinite(se):
        return pv - cv - Z95 * se, pv - cv + Z95 * se
    return math.nan, math.nan


def common_cells(
    primary: pd.DataFrame,
    comparison: pd.DataFrame,
    grid_axes,
    arm: str,
    metrics=DELTA_METRICS,
    bootstrap: dict | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(common rows with comparison/primary values and deltas, primary rows without a match).

    Rows are setting-level (seed means). Delta = primary - comparison, with a 95% paired
    bootstrap interval (`delta_<m>_ci_low/_ci_high`) when both cells have replicates: the
    replicates resample the same test examples in both cells (metrics.resample_counts).
    """
    keys = pair_keys(primary, comparison, grid_axes)
    p_pre, c_pre = arm_prefix(primary, comparison)
    comparison_index = {}
    for _, c in comparison.iterrows():
        comparison_index.setdefault(pair_key(c, keys), c)
    rows, unmatched = [], []
    for _, p in primary.iterrows():
        c = comparison_index.get(pair_key(p, keys))
        ident = {FAMILY_COL: p["family_label"], "beta_label": p["beta_label"]}
        if c is None:
            unmatched.append(
                {
                    "comparison_arm": arm,
                    **ident,
                    "primary_cell": p.get("cell_id", p.get("cell_ids")),
                    "reason": f"no {arm} row with " + ", ".join(f"{k}={format_value(p[k])}" for k in keys),
                }
            )
            continue
        row = {"comparison_arm": arm, **ident}
        pr, cr = setting_replicates(p, bootstrap), setting_replicates(c, bootstrap)
        for m in metrics:
            cv, pv = float(c.get(m, math.nan)), float(p.get(m, math.nan))
            row[f"{c_pre}_{m}"], row[f"{p_pre}_{m}"], row[f"delta_{m}"] = cv, pv, pv - cv
            row[f"delta_{m}_ci_low"], row[f"delta_{m}_ci_high"] = delta_interval(p, c, m, pr, cr)
            if f"{m}_std" in p.index and p.get("n_seeds", 1) > 1:
                row[f"{p_pre}_{m}_std"] = p[f"{m}_std"]
        row["primary_cell"] = p.get("cell_ids", p.get("cell_id"))
        row["comparison_cell"] = c.get("cell_ids", c.get("cell_id"))
        rows.append(row)
    return pd.DataFrame(rows), pd.DataFrame(
        unmatched, columns=["comparison_arm", FAMILY_COL, "beta_label", "primary_cell", "reason"]
    )


def verdict(lo: float, hi: float) -> str:
    """The sign of an effect from its 95% interval: negative / positive when the interval
    excludes 0, else cannot tell (also when there is no interval)."""
    if pd.isna(lo) or pd.isna(hi):
        return "cannot tell"
    return "negative" if hi < 0 else ("positive" if lo > 0 else "cannot tell")


def router_signal(row, above: dict | None) -> bool | None:
    """Does either cell of a common-cell row carry router structure above chance (its
    chance-corrected within-task router probe's 95% interval above 0)? None when unknown."""
    if above is None:
        return None
    ids = [i for col in ("primary_cell", "comparison_cell") for i in str(row.get(col, "")).split(",") if i]
    known = [above[i] for i in ids if i in above]
    return any(known) if known else None


def mean_delta_interval(c: pd.DataFrame, m: str, bootstrap: dict | None) -> tuple[float, float]:
    """95% interval of the mean over common cells c of delta m: from the cells' paired replicates
    (replicate by replicate) when every cell has them, else, the cells being independent, the
    mean's SE from each delta's interval; NaN when neither."""
    col = f"delta_{m}"
    reps = []
    for _, r in c.iterrows():
        pr = setting_replicates({"cell_ids": r.get("primary_cell", "")}, bootstrap)
        cr = setting_replicates({"cell_ids": r.get("comparison_cell", "")}, bootstrap)
        if pr is None or cr is None or m not in pr[1]:
            reps = None
            break
        reps.append(pr[0][:, pr[1].index(m)] - cr[0][:, cr[1].index(m)])
    if reps:
        return interval(np.nanmean(np.stack(reps), axis=0))
    ses = ((c[f"{col}_ci_high"] - c[f"{col}_ci_low"]) / (2 * Z95)).dropna()
    ok = c[col].notna() & c[f"{col}_ci_high"].notna()
    if ok.any() and len(ses) == int(ok.sum()):
        se = math.sqrt(float((ses**2).sum())) / len(ses)
        mu = float(c.loc[ok, col].mean())
        return mu - Z95 * se, mu + Z95 * se
    return math.nan, math.nan


def contrast_row(arm: str, c: pd.DataFrame, m: str, bootstrap: dict | None, above: dict | None) -> dict:
    """One arm contrast: comparison arm `arm`, its common cells c, metric m (see arm_contrasts)."""
    col = f"delta_{m}"
    lo, hi = mean_delta_interval(c, m, bootstrap)
    signal = [router_signal(r, above) for _, r in c.iterrows()] if m in ROUTER_SCORES else [None] * len(c)
    each = [
        verdict(a, b) if s is not False else "cannot tell"
        for a, b, s in zip(
            c.get(f"{col}_ci_low", pd.Series(dtype=float)), c.get(f"{col}_ci_high", pd.Series(dtype=float)), signal
        )
    ]
    v, why = verdict(lo, hi), ""
    if m in ROUTER_SCORES and signal and all(s is False for s in signal):
        v, why = "cannot tell", "no cell of either arm has a router probe above chance"
    return {
        "comparison_arm": arm,
        "metric": m,
        "n_cells": int(c[col].notna().sum()),
        "mean_delta": float(c[col].mean()),
        "ci_low": lo,
        "ci_high": hi,
        "verdict": v,
        "why": why,
        "detectable_delta": power.detectable_difference(lo, hi),
        "router_signal_cells": sum(bool(s) for s in signal) if m in ROUTER_SCORES else None,
        "cells_negative": each.count("negative"),
        "cells_positive": each.count("positive"),
        "cells_cannot_tell": each.count("cannot tell"),
    }


def arm_contrasts(
    commons: dict, bootstrap: dict | None, metrics=DELTA_METRICS, above: dict | None = None
) -> pd.DataFrame:
    """Per comparison arm and metric: the mean common-cell delta (primary - arm), its 95% paired
    bootstrap interval (replicates of the mean over cells), the verdict from it and the smallest
    difference that interval could detect (power.detectable_difference); plus how
    many single-cell deltas are negative / positive / cannot tell. A router-score delta between
    cells none of which has a router probe above chance (`above`: cell id -> bool) compares
    noise with noise: cannot tell, whatever its interval."""
    rows = [
        contrast_row(arm, c, m, bootstrap, above)
        for arm, c in commons.items()
        if c is not None and not c.empty
        for m in metrics
        if f"delta_{m}" in c.columns
    ]
    return pd.DataFrame(rows, columns=CONTRAST_COLUMNS)


def differing_keys(p: pd.Series, c: pd.Series, ignore=("token_aggregation", "seed")) -> tuple[list[str], list[str]]:
    """(cell keys recorded on both rows whose values differ, cell keys the comparison does not record)."""
    diff, unknown = [], []
    for k in CELL_KEYS:
        if k in ignore:
            continue
        if k not in c.index or pd.isna(c[k]):
            unknown.append(k)
        elif k in p.index and format_value(p[k]) != format_value(c[k]):
            diff.append(k)
    return diff, unknown


def _scale_stats(v) -> dict | None:
    v = pd.Series(v, dtype=float).dropna()
    return {"n": len(v), "min": v.min(), "mean": v.mean(), "max": v.max(), "std": v.std(ddof=0)} if len(v) else None


def scale_table(primary: pd.DataFrame, comparisons: dict, commons: dict) -> pd.DataFrame:
    """Inferred z-free reference scale per arm (on the common cells for comparison arms) and the
    ratios primary / comparison arm: rows `<agg>`, `<agg>_comparison_common_cells` and
    `<primary agg>_over_<agg>_comparison_ratio` (` (<arm>)` appended when arms share an aggregation)."""
    col = "inferred_zfree_reference_scale"
    rows = []
    p_agg = aggregation_name(primary)
    p_stats = _scale_stats(primary[col]) if col in primary.columns else None
    if p_stats:
        rows.append({"aggregation_mode": p_agg, "source": "primary arm", **p_stats})
    for arm, comp in comparisons.items():
        if col not in comp.columns:
            continue
        common = commons.get(arm)
        ids = set(common["comparison_cell"]) if common is not None and len(common) else set()
        key = "cell_ids" if "cell_ids" in comp.columns else "cell_id"
        c_stats = _scale_stats(comp[comp[key].isin(ids)][col] if ids else comp.iloc[0:0][col])
        if not c_stats:
            continue
        c_agg = aggregation_name(comp)
        suffix = f" ({arm})" if sum(aggregation_name(r) == c_agg for r in comparisons.values()) > 1 else ""
        rows.append({"aggregation_mode": f"{c_agg}_comparison_common_cells{suffix}", "source": arm, **c_stats})
        if p_stats:
            ratio = p_stats["mean"] / c_stats["mean"] if c_stats["mean"] else math.nan
            rows.append(
                {
                    "aggregation_mode": f"{p_agg}_over_{c_agg}_comparison_ratio{suffix}",
                    "source": f"derived: primary / {arm}",
                    "n": 1,
                    "min": ratio,
                    "mean": ratio,
                    "max": ratio,
                    "std": 0.0,
                }
            )
    return pd.DataFrame(rows, columns=["aggregation_mode", "source", "n", "min", "mean", "max", "std"])


def router_above_chance(summary: pd.DataFrame) -> dict | None:
    """cell id -> is its chance-corrected within-task router probe's 95% interval above 0
    (arm_contrasts' `above`); None when the cells record no such interval."""
    if "within_task_router_probe_corrected_ci_low" not in summary.columns:
        return None
    return dict(zip(summary.cell_id, summary.within_task_router_probe_corrected_ci_low.astype(float) > 0))
