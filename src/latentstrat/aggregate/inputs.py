"""Reading the aggregate's inputs: per-cell metrics (with each cell's state), external summary
and comparison tables (validated against docs/comparison-table.md, the original study's column
names), training histories, bootstrap replicates and the entangle stage's quality report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from latentstrat.cells import CELL_KEYS, Cell, beta_label
from latentstrat.families import family_label
from latentstrat.metrics import HISTORY_COLUMNS, METRICS, M, derive, history_name

# external comparison / summary tables (docs/comparison-table.md)
TABLE_REQUIRED = ["reconstruction_family", "beta", "token_aggregation", "beta_schedule", M.matched_router_score]
# the original study's column names for metrics latentstrat names otherwise
STUDY_COLUMNS = {"distribution_normalized_reconstruction_loss": M.base_relative_reconstruction}


def validate_summary_table(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Check a comparison/summary table against docs/comparison-table.md; fill labels and derived metrics."""
    missing = [c for c in TABLE_REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(
            f"summary table {source} lacks required column {missing[0]!r} "
            f"(required: {', '.join(TABLE_REQUIRED)}; see docs/comparison-table.md)"
        )
    df = df.rename(columns={k: v for k, v in STUDY_COLUMNS.items() if v not in df.columns})
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
    df = fill_derived(df)
    if "cell_id" not in df.columns:
        df["cell_id"] = [f"{source}#{i}" for i in range(len(df))]
    return df


def read_summary_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"summary table {path} does not exist")
    df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    return validate_summary_table(df, str(path))


def fill_derived(df: pd.DataFrame) -> pd.DataFrame:
    """Derived metrics (metrics.derive) where the inputs exist and the column is absent/NaN."""
    df = df.copy()
    rows = [derive(r) for r in df.to_dict("records")]
    for name in [
        M.matched_router_score,
        M.posterior_router_probe_gap,
        M.kl_over_active_reconstruction,
        M.inferred_zfree_reference_scale,
    ]:
        derived = pd.Series([r[name] for r in rows], index=df.index, dtype=float)
        if name in df.columns:
            df[name] = df[name].astype(float).fillna(derived)
        elif derived.notna().any():
            df[name] = derived
    return df


def read_cell_row(path, cell_id: str) -> dict:
    """The one row of a cell's metrics file; ValueError when it holds another cell or not one row."""
    df = pd.read_parquet(path)
    if len(df) != 1:
        raise ValueError(f"{len(df)} rows, expected 1")
    row = df.iloc[0].to_dict()
    if row.get("cell_id") != cell_id:
        raise ValueError(f"cell_id {row.get('cell_id')!r} != expected {cell_id!r}")
    return row


def load_cell_rows(
    cells: list[Cell], row_paths: dict, upstream: dict | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary of complete cells, collection_state of every expected cell: `cells`, the
    collection's, cells.expand_cells). With `upstream`
    (cell id -> the files its metrics are computed from), a metrics file older than one of them
    (say evaluate records rewritten, or corrupted, after it) is not complete: its numbers
    describe outputs that are gone."""
    rows, state = [], []
    for c in cells:
        path = row_paths.get(c.cell_id)
        status, reason = "complete", ""
        newer = [
            Path(u)
            for u in (upstream or {}).get(c.cell_id, [])
            if path is not None
            and Path(path).exists()
            and Path(u).exists()
            and Path(u).stat().st_mtime > Path(path).stat().st_mtime
        ]
        if path is None:
            status, reason = "incomplete", "no metrics path given"
        elif newer:
            status, reason = "incomplete", f"metrics file {path} is older than {newer[0]} (rerun the cell's jobs)"
        else:
            try:
                rows.append(read_cell_row(path, c.cell_id))
            except FileNotFoundError:
                status, reason = "incomplete", f"metrics file {path} missing"
            except Exception as e:  # unreadable / wrong content: the cell is incomplete, named
                status, reason = "incomplete", f"metrics file {path} unreadable: {e}"
        state.append(
            {
                "cell_id": c.cell_id,
                "arm": c.arm,
                "role": c.role,
                "status": status,
                "reason": reason,
                **{k: c.settings[k] for k in CELL_KEYS},
            }
        )
    summary = pd.DataFrame(rows)
    if len(summary):
        summary = fill_derived(summary)
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
    """(the cells' histories, long and concatenated; the cells whose history is unreadable)."""
    frames, bad = [], []
    for cid, path in history_paths.items():
        try:
            df = pd.read_parquet(path)
            missing = [c for c in HISTORY_COLUMNS if c not in df.columns]
            if missing:
                raise ValueError(f"lacks columns {missing}")
            frames.append(df.assign(cell_id=cid, metric=df.metric.map(history_name)))
        except Exception:
            bad.append(cid)
    hist = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=HISTORY_COLUMNS)
    return hist, bad


def read_history_table(path, summary: pd.DataFrame, summary_path) -> pd.DataFrame:
    """A long history table given next to a summary table: the history columns, and only cells
    of the summary table."""
    p = Path(path)
    history = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
    missing = [c for c in HISTORY_COLUMNS if c not in history.columns]
    if missing:
        raise ValueError(f"history table {p} lacks required column {missing[0]!r}")
    history["metric"] = history.metric.map(history_name)
    unknown = sorted(set(history.cell_id) - set(summary.cell_id))
    if unknown:
        raise ValueError(f"history table {p}: cell_id {unknown[0]!r} is not in the summary table {summary_path}")
    return history


def load_entangle_quality(path) -> dict:
    """The entangle stage's quality.json (per-task temperature-1 checks)."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"entangle quality report {p} is unreadable ({e}); rerun the entangle stage") from None
