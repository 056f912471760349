"""The inferred z-free reference scale per arm: how far the arms' reconstruction scales differ
(the `sum` arm's is about n_bar times the `mean` arm's), on the common cells of each contrast."""

from __future__ import annotations

import math

import pandas as pd

from latentstrat.aggregate.settings import aggregation_name
from latentstrat.metrics import M


def _scale_stats(v) -> dict | None:
    v = pd.Series(v, dtype=float).dropna()
    return {"n": len(v), "min": v.min(), "mean": v.mean(), "max": v.max(), "std": v.std(ddof=0)} if len(v) else None


def scale_table(primary: pd.DataFrame, comparisons: dict, commons: dict) -> pd.DataFrame:
    """Inferred z-free reference scale per arm (on the common cells for comparison arms) and the
    ratios primary / comparison arm: rows `<agg>`, `<agg>_comparison_common_cells` and
    `<primary agg>_over_<agg>_comparison_ratio` (` (<arm>)` appended when arms share an aggregation)."""
    col = M.inferred_zfree_reference_scale
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
