"""Reading the aggregate directory and rendering tables as markdown (4 decimals, like the original study's reports)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from latentstrat.families import family_label, parse_family
from latentstrat.metrics import DIAGNOSTICS, METRICS, label, probe_label

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
    "contrast_split",
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


def primary_arms(t: dict) -> list[str]:
    """The primary arm's name(s) in the collection state (one, unless tables of several were
    aggregated); [] without a state."""
    st = t.get("collection_state", pd.DataFrame())
    if st is None or st.empty or "role" not in st.columns:
        return []
    return [str(a) for a in st.loc[st.role == "primary", "arm"].unique()]


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


# column names that read better as words than as their label
HEADERS = {
    "reconstruction_loss_family_label": "family",
    "family_label": "family",
    "beta_label": "beta",
    "cell_id": "cell",
}
SUFFIXES = {"_ci_low": "CI low", "_ci_high": "CI high", "_std": "SD", "_se_test": "SE (test)"}
MAX_COLUMNS = 9  # a wider table is split into parts that repeat its key columns


def header(col: str) -> str:
    """A column's header: its metric label (metrics.probe_label: a probe control's too), with the
    interval or spread it is (`CI low`)."""
    if col in HEADERS:
        return HEADERS[col]
    if col in METRICS or col in DIAGNOSTICS:
        return label(col)
    for suffix, word in SUFFIXES.items():
        if col.endswith(suffix) and (col[: -len(suffix)] in METRICS or col[: -len(suffix)].startswith("delta_")):
            return f"{header(col[: -len(suffix)])}: {word}"
    if col.startswith("delta_") and col[len("delta_") :] in METRICS:
        return "delta " + label(col[len("delta_") :])
    return probe_label(col)


def column_decimals(values: pd.Series) -> int | None:
    """One precision for a column of floats: three significant digits of its typical size (0 to
    4 decimals); None for a column that is not all numbers (or is whole numbers)."""
    v = pd.to_numeric(values, errors="coerce")
    if v.isna().all() or values.map(lambda x: isinstance(x, (bool, str))).any():
        return None
    v = v[np.isfinite(v)]
    if v.empty:
        return None
    if (v == v.round()).all():
        return 0 if v.abs().max() < 1e15 else None
    size = v.abs()[v != 0].median() if (v != 0).any() else 1.0
    return int(min(4, max(0, 2 - math.floor(math.log10(size)))))


def _cell(v, decimals: int | None) -> str:
    if decimals is None or isinstance(v, (bool, str)) or v is None:
        return fmt(v)
    f = float(v)
    if not math.isfinite(f):
        return fmt(f) if math.isnan(f) else str(f)
    return f"{f:,.{decimals}f}" if abs(f) >= 10_000 else f"{f:.{decimals}f}"


def key_columns(decimals: dict[str, int | None]) -> list[str]:
    """The leading columns that name a row (not numbers: no precision in `decimals`, column ->
    column_decimals, in the table's order): repeated in each part of a split table."""
    keys = []
    for c, d in decimals.items():
        if d is not None or len(keys) == 3:
            break
        keys.append(c)
    return keys


def md_table(df: pd.DataFrame, columns: list[str] | None = None, max_rows: int | None = None) -> str:
    """A Markdown table: headers as words, one precision per column, and a table wider than
    MAX_COLUMNS split into parts that each repeat its key columns."""
    if df is None or df.empty:
        return "_(no rows)_\n"
    cols = [c for c in (columns or list(df.columns)) if c in df.columns]
    rows = df[cols].head(max_rows) if max_rows else df[cols]
    decimals = {c: column_decimals(rows[c]) for c in cols}
    keys = key_columns(decimals)
    rest = [c for c in cols if c not in keys]
    width = max(1, MAX_COLUMNS - len(keys))
    parts = [rest[i : i + width] for i in range(0, len(rest), width)] or [[]]
    out = []
    for part in parts:
        shown = keys + part
        lines = ["| " + " | ".join(header(c) for c in shown) + " |", "|" + "---|" * len(shown)]
        for _, r in rows.iterrows():
            lines.append("| " + " | ".join(_cell(r[c], decimals[c]).replace("|", "/") for c in shown) + " |")
        out.append("\n".join(lines) + "\n")
    return "\n".join(out)


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
