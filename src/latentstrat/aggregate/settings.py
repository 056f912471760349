"""Cells -> setting rows: seeds averaged (`seed_means`), with 95% intervals from the cells'
bootstrap replicates and across seeds (`setting_intervals`), and the tables read off the
primary arm's setting rows: metric distributions, derived diagnostics, top and bottom rows.

Distributions use the population std (ddof=0, as the original study's tables); across-seed std
is the sample std (ddof=1).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from latentstrat.aggregate.columns import FAMILY_COL
from latentstrat.cells import CELL_KEYS, beta_label, format_value
from latentstrat.families import family_label
from latentstrat.metrics import (
    DISTRIBUTION_METRICS,
    ENDPOINT_FALLBACK,
    METRICS,
    PROBE_METRICS,
    M,
    interval,
    probe_label,
)


def setting_keys(df: pd.DataFrame) -> list[str]:
    """The cell settings a table records, except seed."""
    return [k for k in CELL_KEYS if k in df.columns and k != "seed"]


def aggregation_name(df: pd.DataFrame) -> str:
    """The token aggregation(s) of a table's rows (`sum`, `mean+sum`, ...; `unknown` without any)."""
    aggs = sorted(set(df["token_aggregation"])) if "token_aggregation" in df.columns and len(df) else []
    return "+".join(aggs) or "unknown"


def seed_means(df: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (seeds averaged): metric means, `<metric>_std` (ddof=1), n_seeds."""
    if df.empty:
        return df
    keys = ["arm"] * ("arm" in df.columns) + setting_keys(df)
    metrics = [m for m in METRICS if m in df.columns]
    extra = [
        c
        for c in df.columns
        if c.endswith(
            ("_chance", "_shuffled", "_corrected", "_tasks", "followed_strategy_tv", "followed_strategy_tv_max")
        )
        or c in ("n_test", "n_tasks")
    ]
    extra = [c for c in extra if pd.api.types.is_numeric_dtype(df[c])]
    ci = [c for c in df.columns if c.endswith(("_ci_low", "_ci_high"))]
    g = df.groupby(keys, sort=False, dropna=False)
    out = g[metrics + extra].mean().reset_index()
    std = g[metrics].std(ddof=1).reset_index(drop=True).add_suffix("_std")
    out = pd.concat([out, std], axis=1)
    out["n_seeds"] = g.size().values
    out["seeds"] = (
        g["seed"].apply(lambda s: ",".join(format_value(v) for v in s)).values if "seed" in df.columns else ""
    )
    out["cell_ids"] = g["cell_id"].apply(lambda s: ",".join(s)).values
    for c in ci:  # exact for one seed; for several, the seeds' mean half-width around the seed mean (the
        # seeds share the test inputs, so their test noise is not averaged away), replaced from the
        # replicates when the cells have them (setting_intervals)
        m = c[: -len("_ci_low")] if c.endswith("_ci_low") else c[: -len("_ci_high")]
        if m not in df.columns:
            out[c] = np.where(out["n_seeds"] == 1, g[c].first().values, np.nan)
            continue
        half = (df[m] - df[c]).abs().groupby([df[k] for k in keys], sort=False, dropna=False).mean().values
        out[c] = out[m] - half if c.endswith("_ci_low") else out[m] + half
    out["family_label"] = [family_label(f) for f in out["reconstruction_family"]]
    out["beta_label"] = [beta_label(b) for b in out["beta"]]
    return out


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


def setting_intervals(rows: pd.DataFrame, bootstrap: dict | None) -> pd.DataFrame:
    """For settings with several seeds: `<m>_ci_low/_ci_high` of the seed mean from the seeds'
    replicates (test-set noise), and `<m>_seed_ci_low/_high`, a t interval across seeds (seed
    noise)."""
    from scipy import stats

    rows = rows.copy()
    if rows.empty or "n_seeds" not in rows.columns:
        return rows
    metrics = [m for m in METRICS if m in rows.columns]
    cols: dict[str, list] = {}  # column -> values per row (NaN where a row has one seed), set at once
    for pos, (_, r) in enumerate(rows.iterrows()):
        n = int(r["n_seeds"])
        if n < 2:
            continue
        reps = setting_replicates(r, bootstrap)
        for m in metrics:
            if reps is not None and m in reps[1]:
                lo, hi = interval(reps[0][:, reps[1].index(m)])
                cols.setdefault(f"{m}_ci_low", {})[pos], cols.setdefault(f"{m}_ci_high", {})[pos] = lo, hi
            sd = r.get(f"{m}_std", math.nan)
            if pd.notna(sd) and pd.notna(r[m]):
                half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
                cols.setdefault(f"{m}_seed_ci_low", {})[pos] = r[m] - half
                cols.setdefault(f"{m}_seed_ci_high", {})[pos] = r[m] + half
    for c, by_pos in cols.items():
        old = rows[c].to_numpy(dtype=float, copy=True) if c in rows.columns else np.full(len(rows), np.nan)
        for pos, v in by_pos.items():
            old[pos] = v
        rows[c] = old
    return rows


def setting_rows(cells: pd.DataFrame, bootstrap: dict | None) -> pd.DataFrame:
    """Cells -> setting rows with their intervals."""
    return setting_intervals(seed_means(cells), bootstrap)


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
        out.append(
            {
                "metric": m,
                "label": probe_label(m),
                "n": len(v),
                "min": v.min(),
                "mean": v.mean(),
                "median": v.median(),
                "max": v.max(),
                "std": v.std(ddof=0),
            }
        )
    return pd.DataFrame(out, columns=["metric", "label", "n", "min", "mean", "median", "max", "std"])


def labelled(rows: pd.DataFrame, cols) -> pd.DataFrame:
    """Setting rows as family label, beta label, `cols` (with `_std` over several seeds), cell id(s)."""
    out = pd.DataFrame({FAMILY_COL: rows["family_label"].values, "beta_label": rows["beta_label"].values})
    for c in cols:
        out[c] = rows[c].values if c in rows.columns else math.nan
        if f"{c}_std" in rows.columns and rows.get("n_seeds", pd.Series([1])).max() > 1:
            out[f"{c}_std"] = rows[f"{c}_std"].values
    out["cell_id"] = rows["cell_ids"].values if "cell_ids" in rows.columns else rows["cell_id"].values
    return out


def derived_diagnostics(rows: pd.DataFrame) -> pd.DataFrame:
    cols = [
        M.matched_router_score,
        M.active_reconstruction_objective,
        M.kl_prior_loss,
        M.kl_over_active_reconstruction,
        M.inferred_zfree_reference_scale,
        M.posterior_router_probe_gap,
    ]
    return labelled(rows, cols)


def ranking_metric(rows: pd.DataFrame, wanted: str) -> tuple[str, str]:
    """(the metric rows are ranked by, a note when it is not the one asked for)."""
    if wanted in rows.columns and rows[wanted].notna().any():
        return wanted, ""
    if wanted != ENDPOINT_FALLBACK and ENDPOINT_FALLBACK in rows.columns:
        return ENDPOINT_FALLBACK, f"ranked by {ENDPOINT_FALLBACK}: the rows have no {wanted}"
    return wanted, ""


def top_bottom(rows: pd.DataFrame, metric: str, k: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    cols = [
        M.router_information,
        M.matched_router_score,
        M.within_task_router_probe,
        "within_task_router_probe_chance",
        "within_task_router_probe_shuffled",
        "within_task_router_probe_corrected",
        M.strategy_match_rate,
        "followed_strategy_tv_max",
        M.final_answer_accuracy,
        M.reconstruction_loss,
        M.kl_prior_loss,
    ]
    cols = [metric, f"{metric}_ci_low", f"{metric}_ci_high"] + [c for c in cols if c != metric]
    cols += ["final_answer_accuracy_ci_low", "final_answer_accuracy_ci_high"]
    cols = [c for c in cols if c in rows.columns or not c.endswith(("_ci_low", "_ci_high"))]
    ranked = rows.dropna(subset=[metric]).sort_values(metric, ascending=False, kind="stable")
    bottom = rows.dropna(subset=[metric]).sort_values(metric, ascending=True, kind="stable")
    return labelled(ranked.head(k), cols), labelled(bottom.head(k), cols)
