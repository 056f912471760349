"""Reading the aggregate directory and rendering tables as markdown (4 decimals, like the original study's reports)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from latentstrat.families import family_label, parse_family

TABLES = [
    "summary",
    "collection_state",
    "collection_state_counts",
    "summary_by_setting",
    "metric_distributions",
    "common_cells",
    "arm_contrasts",
    "headline_contrasts",
    "normalized_contrasts",
    "contrast_by_family",
    "unmatched_rows",
    "reference_scale",
    "derived_diagnostics",
    "top_rows",
    "bottom_rows",
    "history_long",
    "history_per_task_long",
    "dynamics_summary",
    "per_task_checkpoints",
    "token_dominance",
    "token_dominance_sums",
    "gradient_clipping",
    "cell_sanity",
    "cell_states",
    "cell_state_counts",
    "collection_metadata",
    "fairness",
    "data_availability",
    "cell_costs",
]


def load_aggregate(aggregate_dir: str | Path) -> tuple[dict, dict]:
    """({table name: DataFrame (empty when absent)}, aggregate_meta)."""
    d = Path(aggregate_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"aggregate directory {d} does not exist")
    tables = {}
    for name in TABLES:
        p = d / f"{name}.parquet"
        tables[name] = pd.read_parquet(p) if p.exists() else pd.DataFrame()
    meta_path = d / "aggregate_meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return tables, meta


def fmt(v) -> str:
    """Seeds' number style: round to 4 decimals, drop trailing zeros (1.0000 -> 1, 214.2840 -> 214.284);
    a missing number is "NA", never an empty string."""
    if isinstance(v, bool) or v is None:
        return "NA" if v is None else str(v)
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return str(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f):
        return "NA"
    r = round(f, 4)
    if r == 0:
        r = 0.0
    s = f"{r:.4f}".rstrip("0").rstrip(".")
    return s if s != "-0" else "0"


def md_table(df: pd.DataFrame, columns: list[str] | None = None, max_rows: int | None = None) -> str:
    if df is None or df.empty:
        return "_(no rows)_\n"
    cols = [c for c in (columns or list(df.columns)) if c in df.columns]
    rows = df[cols].head(max_rows) if max_rows else df[cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in rows.iterrows():
        lines.append("| " + " | ".join(fmt(r[c]).replace("|", "/") for c in cols) + " |")
    return "\n".join(lines) + "\n"


def plural(n: int, word: str, many: str | None = None) -> str:
    """`1 cell`, `2 cells` (`many`: the plural when it is not word + s)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def normalized_labels(t) -> dict:
    """Family label -> whether the family is normalized (its declaration's `normalized`), for the
    families of the collection's cells (tables key families by label)."""
    s = t.get("summary", pd.DataFrame())
    if s.empty or "reconstruction_family" not in s.columns:
        return {}
    out = {}
    for f in s["reconstruction_family"].dropna().unique():
        try:
            out[family_label(f)] = parse_family(f).normalized
        except ValueError:  # an external arm's family that no declaration knows
            continue
    return out
