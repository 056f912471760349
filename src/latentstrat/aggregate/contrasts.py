"""Setting rows of the primary arm against each comparison arm: common cells (paired settings
with deltas and their 95% intervals), the arm contrasts with their verdicts (training noise in
every interval: `training_noise`), and the inferred z-free reference scale of each arm on those
cells (`scale_table`).

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
# the primary endpoint and the seeds' router score: a delta of these between cells that carry no
# strategy information compares noise with noise
ROUTER_SCORES = ("router_information", "matched_router_score")
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
    "training_noise_in_interval",
    "se_test",
    "se_training",
    "training_noise_sd",
    "training_noise_df",
    "training_noise_settings",
    "test_ci_low",
    "test_ci_high",
    "seeds_min",
    "seeds_max",
    "strategy_cells",
    "both_empty_cells",
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
    """A row's standard error of metric m over test inputs when no replicates are at hand: from its
    95% interval (`<m>_ci_low/_ci_high`, normal approximation); NaN when it has none."""
    lo, hi = row.get(f"{m}_ci_low", math.nan), row.get(f"{m}_ci_high", math.nan)
    if pd.notna(lo) and pd.notna(hi):
        return (float(hi) - float(lo)) / (2 * Z95)
    return math.nan


def n_seeds(row) -> int:
    n = row.get("n_seeds", 1)
    return int(n) if pd.notna(n) else 1


# ----------------------------------------------------------------------------- training noise


def training_noise(rows, m: str) -> dict | None:
    """The seed-to-seed (training) variance of metric m, pooled over every setting row of `rows`
    (DataFrames of setting rows: the two arms of a contrast) that has two or more seeds:
    sum (n - 1) sd^2 / sum (n - 1). Returns {var, df, settings}, or None when no setting has two
    seeds (training noise unknown). Assumes one training variance for every cell of both arms
    (stated in the report); the seeds share the test inputs, so the spread also carries the part
    of test-input noise that differs between two models: the estimate errs on the wide side."""
    num = df = settings = 0.0
    for r in rows:
        if r is None or r.empty or f"{m}_std" not in r.columns or "n_seeds" not in r.columns:
            continue
        ok = r[(r.n_seeds >= 2) & r[f"{m}_std"].notna()]
        num += float(((ok.n_seeds - 1) * ok[f"{m}_std"].astype(float) ** 2).sum())
        df += float((ok.n_seeds - 1).sum())
        settings += len(ok)
    return {"var": num / df, "df": df, "settings": int(settings)} if df else None


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile (the normal one for infinite df)."""
    from scipy import stats

    return float(stats.norm.ppf(q) if not math.isfinite(df) else stats.t.ppf(q, df))


def combine(se_test: float, var_training: float, df_training: float) -> tuple[float, float]:
    """(SE, df) of an estimate whose test-input variance se_test^2 is known (infinite df) and
    whose training variance var_training rests on df_training seed degrees of freedom
    (Welch-Satterthwaite)."""
    v = se_test**2 + var_training
    df = v**2 / (var_training**2 / df_training) if var_training > 0 else math.inf
    return math.sqrt(v), df


def interval_with_noise(d: float, se_test: float, var_training: float, df_training: float):
    """(low, high, SE, df) of the 95% t interval of estimate d with both noises."""
    se, df = combine(se_test, var_training, df_training)
    half = t_quantile(0.975, df) * se
    return d - half, d + half, se, df


# ----------------------------------------------------------------------------- common cells


def delta_test(p, c, m: str, pr, cr) -> tuple[float, float, float]:
    """(low, high, SE) over test inputs of primary row p minus comparison row c in metric m: the
    paired bootstrap of their replicates (pr, cr: setting_replicates) when both have them, else
    each side's own interval (row_se); NaN when neither."""
    pv, cv = float(p.get(m, math.nan)), float(c.get(m, math.nan))
    if pr is not None and cr is not None and m in pr[1] and m in cr[1]:
        reps = pr[0][:, pr[1].index(m)] - cr[0][:, cr[1].index(m)]
        lo, hi = interval(reps)
        return lo, hi, float(np.nanstd(reps, ddof=1))
    se = math.hypot(row_se(p, m), row_se(c, m))
    if math.isfinite(se):
        return pv - cv - Z95 * se, pv - cv + Z95 * se, se
    return math.nan, math.nan, math.nan


def _states_of(row, states: dict | None) -> str:
    """The states of a setting row's cells ('strategy', or 'empty,strategy' when its seeds differ)."""
    if not states:
        return ""
    ids = [i for i in str(row.get("cell_ids", row.get("cell_id", ""))).split(",") if i]
    return ",".join(sorted({states[i] for i in ids if i in states}))


def common_cells(
    primary: pd.DataFrame,
    comparison: pd.DataFrame,
    grid_axes,
    arm: str,
    metrics=DELTA_METRICS,
    bootstrap: dict | None = None,
    noise: dict | None = None,
    states: dict | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(common rows with comparison/primary values and deltas, primary rows without a match).

    Rows are setting-level (seed means). Delta = primary - comparison with its 95% interval
    (`delta_<m>_ci_low/_ci_high`): the paired bootstrap over test inputs (the replicates resample
    the same test examples in both cells, metrics.resample_counts), widened by the training noise
    `noise[m]` (training_noise) when known. `states`: cell id -> cell state, shown per side.
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
        if states:
            row["primary_state"], row["comparison_state"] = _states_of(p, states), _states_of(c, states)
        row["primary_n_seeds"], row["comparison_n_seeds"] = n_seeds(p), n_seeds(c)
        pr, cr = setting_replicates(p, bootstrap), setting_replicates(c, bootstrap)
        for m in metrics:
            cv, pv = float(c.get(m, math.nan)), float(p.get(m, math.nan))
            row[f"{c_pre}_{m}"], row[f"{p_pre}_{m}"], row[f"delta_{m}"] = cv, pv, pv - cv
            lo, hi, se_test = delta_test(p, c, m, pr, cr)
            nz = (noise or {}).get(m)
            if nz and math.isfinite(se_test):
                var = nz["var"] * (1 / n_seeds(p) + 1 / n_seeds(c))
                lo, hi, _, _ = interval_with_noise(pv - cv, se_test, var, nz["df"])
            row[f"delta_{m}_ci_low"], row[f"delta_{m}_ci_high"] = lo, hi
            row[f"delta_{m}_se_test"] = se_test
            if f"{m}_std" in p.index and n_seeds(p) > 1:
                row[f"{p_pre}_{m}_std"] = p[f"{m}_std"]
        row["primary_cell"] = p.get("cell_ids", p.get("cell_id"))
        row["comparison_cell"] = c.get("cell_ids", c.get("cell_id"))
        rows.append(row)
    return pd.DataFrame(rows), pd.DataFrame(
        unmatched, columns=["comparison_arm", FAMILY_COL, "beta_label", "primary_cell", "reason"]
    )


# ----------------------------------------------------------------------------- arm contrasts


def verdict(lo: float, hi: float) -> str:
    """The sign of an effect from its 95% interval: negative / positive when the interval
    excludes 0, else cannot tell (also when there is no interval)."""
    if pd.isna(lo) or pd.isna(hi):
        return "cannot tell"
    return "negative" if hi < 0 else ("positive" if lo > 0 else "cannot tell")


def mean_delta_test(c: pd.DataFrame, m: str, bootstrap: dict | None) -> tuple[float, float, float]:
    """(low, high, SE) over test inputs of the mean over common cells c of delta m: from the
    cells' paired replicates (replicate by replicate) when every cell has them, else, the cells
    being independent, from each delta's SE; NaN when neither."""
    col = f"delta_{m}"
    reps = []
    for _, r in c.iterrows():
        pr = setting_replicates({"cell_ids": r.get("primary_cell", "")}, bootstrap)
        cr = setting_replicates({"cell_ids": r.get("comparison_cell", "")}, bootstrap)
        if pr is None or cr is None or m not in pr[1] or m not in cr[1]:
            reps = None
            break
        reps.append(pr[0][:, pr[1].index(m)] - cr[0][:, cr[1].index(m)])
    if reps:
        mean = np.nanmean(np.stack(reps), axis=0)
        return *interval(mean), float(np.nanstd(mean, ddof=1))
    ok = c[col].notna() if col in c.columns else pd.Series(dtype=bool)
    ses = c.loc[ok, f"{col}_se_test"] if f"{col}_se_test" in c.columns else pd.Series(dtype=float)
    if ok.any() and ses.notna().all():
        se = math.sqrt(float((ses**2).sum())) / len(ses)
        mu = float(c.loc[ok, col].mean())
        return mu - Z95 * se, mu + Z95 * se, se
    return math.nan, math.nan, math.nan


def _cell_verdicts(c: pd.DataFrame, m: str, noise_known: bool) -> list[str]:
    col = f"delta_{m}"
    if not noise_known:
        return ["cannot tell"] * int(c[col].notna().sum())
    return [verdict(a, b) for a, b, d in zip(c[f"{col}_ci_low"], c[f"{col}_ci_high"], c[col]) if pd.notna(d)]


def contrast_row(arm: str, c: pd.DataFrame, m: str, bootstrap: dict | None, noise: dict | None) -> dict:
    """One arm contrast: comparison arm `arm`, its common cells c, metric m (see arm_contrasts)."""
    col = f"delta_{m}"
    ok = c[c[col].notna()]
    mean = float(ok[col].mean()) if len(ok) else math.nan
    t_lo, t_hi, se_test = mean_delta_test(c, m, bootstrap)
    n = len(ok)
    seeds = pd.concat([ok.primary_n_seeds, ok.comparison_n_seeds]) if n else pd.Series([1])
    known = noise is not None and n > 0 and math.isfinite(se_test)
    if known:
        var = noise["var"] * float((1 / ok.primary_n_seeds + 1 / ok.comparison_n_seeds).sum()) / n**2
        lo, hi, se, df = interval_with_noise(mean, se_test, var, noise["df"])
        detect = (t_quantile(0.975, df) + t_quantile(0.8, df)) * se
        v, why = verdict(lo, hi), ""
    else:
        var, (lo, hi), detect = math.nan, (t_lo, t_hi), power.DETECT * se_test
        v = "cannot tell"
        why = (
            "training noise unknown: no setting of either arm has two seeds (add `replicates:` or seeds)"
            if n
            else "no common cell with a value on both sides"
        )
    states = [str(s) for col_s in ("primary_state", "comparison_state") if col_s in ok.columns for s in ok[col_s]]
    all_known = bool(states) and all(s and "unknown" not in s for s in states)
    strategy_cells = sum("strategy" in s for s in states) if all_known else None
    both_empty = (
        int(((ok.primary_state == "empty") & (ok.comparison_state == "empty")).sum())
        if "primary_state" in ok.columns
        else None
    )
    if m in ROUTER_SCORES and strategy_cells == 0 and n:
        v, why = "cannot tell", "no cell of either arm carries strategy information (no cell in state `strategy`)"
    each = _cell_verdicts(c, m, known)
    return {
        "comparison_arm": arm,
        "metric": m,
        "n_cells": n,
        "mean_delta": mean,
        "ci_low": lo,
        "ci_high": hi,
        "verdict": v,
        "why": why,
        "detectable_delta": detect,
        "training_noise_in_interval": bool(known),
        "se_test": se_test,
        "se_training": math.sqrt(var) if known else math.nan,
        "training_noise_sd": math.sqrt(noise["var"]) if noise else math.nan,
        "training_noise_df": noise["df"] if noise else 0.0,
        "training_noise_settings": noise["settings"] if noise else 0,
        "test_ci_low": t_lo,
        "test_ci_high": t_hi,
        "seeds_min": int(seeds.min()),
        "seeds_max": int(seeds.max()),
        "strategy_cells": strategy_cells,
        "both_empty_cells": both_empty,
        "cells_negative": each.count("negative"),
        "cells_positive": each.count("positive"),
        "cells_cannot_tell": each.count("cannot tell"),
    }


def arm_contrasts(commons: dict, bootstrap: dict | None, noises: dict, metrics=DELTA_METRICS) -> pd.DataFrame:
    """Per comparison arm and metric: the mean common-cell delta (primary - arm) and its 95%
    interval with training noise (the paired bootstrap over test inputs, widened by the pooled
    seed-to-seed variance `noises[arm][m]`, a t interval with Welch-Satterthwaite df), the
    verdict from it and the smallest difference it could detect (80% power at 5%). Without an
    estimate of training noise the verdict is `cannot tell` and the interval shown is the test
    inputs' alone. A router-score contrast in which no cell of either arm is in state `strategy`
    compares noise with noise: cannot tell, whatever its interval. Also how many single-cell
    deltas are negative / positive / cannot tell."""
    rows = [
        contrast_row(arm, c, m, bootstrap, (noises.get(arm) or {}).get(m))
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
