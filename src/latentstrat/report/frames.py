"""The data each report figure draws. A figure draws one of these frames and its caption quotes
numbers computed from the same frame (`arm_numbers`), so a caption cannot contradict its figure.

- `cells`: the summary, one row per cell;
- `settings` / `primary_settings`: summary_by_setting (means over a setting's seeds), every arm
  or the primary arm's;
- `history` / `history_per_task`: the validation history of both arms of the primary contrast,
  long (cell, step, metric, value), whose last checkpoint a caption quotes;
- `heatmap_frame`: the objective-scale heatmap's deltas and their noise.
"""

from __future__ import annotations

import math

import pandas as pd

from latentstrat.aggregate.columns import DELTA_METRICS, FAMILY_COL
from latentstrat.metrics import ENDPOINT, history_label, label
from latentstrat.report.tables import plural, primary_arms

FAM, BETA = "family", "beta"


def sig3(v) -> str:
    """A number as a caption or the landing page prints it: three significant digits, NA when
    missing (tables.fmt: a table's number, to 4 decimals)."""
    if v is None or not math.isfinite(float(v)):
        return "NA"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


ENDPOINT_NOTE = "endpoint"  # a figure note's metric that stands for the collection's primary endpoint


def endpoint(t: dict) -> str:
    """The collection's primary endpoint: the declared primary contrast's metric."""
    pc = t.get("primary_contrast", pd.DataFrame())
    return str(pc.metric.iloc[0]) if not pc.empty and "metric" in pc.columns else ENDPOINT


def setting_rows(t: dict, table: str = "summary_by_setting") -> pd.DataFrame:
    df = t.get(table, pd.DataFrame())
    if df.empty:
        return df
    return df.assign(**{FAM: df["family_label"], BETA: df["beta_label"]})


def contrast_arms(t: dict) -> list[str]:
    """The arms of the primary contrast (primary first); the primary arm alone without one."""
    arms = primary_arms(t)
    pc = t.get("primary_contrast", pd.DataFrame())
    if not pc.empty and "comparison_arm" in pc.columns:
        arms += [a for a in pc.comparison_arm if a and a not in arms]
    return arms


def drawn_arms(t: dict, rows: pd.DataFrame) -> list[str]:
    """The arms a per-arm figure draws from `rows`: those of the primary contrast it has (primary
    first), else every arm in it."""
    return [a for a in contrast_arms(t) if (rows.arm == a).any()] or list(dict.fromkeys(rows.arm))


def primary_rows(t: dict) -> pd.DataFrame:
    """Setting-level rows of the primary arm."""
    df = setting_rows(t)
    arms = contrast_arms(t)[:1]
    if df.empty or not arms or "arm" not in df.columns:
        return df
    return df[df.arm.isin(arms)]


def history_rows(t: dict, table: str = "history_long") -> pd.DataFrame:
    """The validation history of the cells of both arms of the primary contrast."""
    h = t.get(table, pd.DataFrame())
    if h.empty:
        return h
    arms = contrast_arms(t)
    if arms and "arm" in h.columns:
        h = h[h.arm.isin(arms)]
    return h.assign(**{FAM: h[FAMILY_COL], BETA: h["beta_label"]})


def last_checkpoint(h: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per cell (and task, where the history has tasks), the metric at its last checkpoint: the
    `value` column, with the cell's arm."""
    g = h[h.metric == metric]
    if g.empty:
        return pd.DataFrame(columns=["arm", "value"])
    keys = ["cell_id", "task"] if "task" in g.columns else ["cell_id"]
    return g.sort_values("step").groupby(keys, sort=False).tail(1)


FRAMES = ("cells", "settings", "primary_settings", "history", "history_per_task")


def caption_frame(t: dict, frame: str, metric: str) -> tuple[pd.DataFrame, str, str, str]:
    """(rows, value column, what one row is, when) of a caption's numbers."""
    metric = endpoint(t) if metric == ENDPOINT_NOTE else metric
    if frame == "cells":
        return t.get("summary", pd.DataFrame()), metric, "cell", "at the end of training"
    if frame in ("settings", "primary_settings"):
        rows = setting_rows(t) if frame == "settings" else primary_rows(t)
        return rows, metric, "setting", "at the end of training, mean over a setting's seeds"
    table = "history_long" if frame == "history" else "history_per_task_long"
    what = "cell" if frame == "history" else "cell-task"
    return last_checkpoint(history_rows(t, table), metric), "value", what, "at the last validation checkpoint"


def arm_numbers(t: dict, frame: str | None, metric: str | None) -> str:
    """`In this collection, <metric> <when>: sum median 0.53 (0.43 to 0.56, 6 cells); ...`
    from the frame the figure draws."""
    if frame is None or metric is None:
        return ""
    metric = endpoint(t) if metric == ENDPOINT_NOTE else metric
    rows, col, what, when = caption_frame(t, frame, metric)
    if rows.empty or col not in rows.columns or "arm" not in rows.columns:
        return ""
    parts = []
    for arm, g in rows.groupby("arm", sort=False):
        v = pd.to_numeric(g[col], errors="coerce").dropna()
        if len(v):
            parts.append(
                f"``{arm}`` median {sig3(v.median())} ({sig3(v.min())} to {sig3(v.max())}, {plural(len(v), what)})"
            )
    name = history_label(metric) if frame.startswith("history") else label(metric)
    return f"In this collection, {name} {when}: " + "; ".join(parts) + "." if parts else ""


def heatmap_frame(t: dict) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The objective-scale heatmap: per metric (rows) and common setting (columns) the paired
    delta, and the delta over its interval's half-width (the colour: beyond +-1 the interval
    clears 0; one scale for every row). None without common settings."""
    c = t.get("common_cells", pd.DataFrame())
    if c.empty:
        return None
    cols = [f"delta_{m}" for m in DELTA_METRICS if f"delta_{m}" in c.columns]
    multi = c.comparison_arm.nunique() > 1
    c = c.assign(col=(c.comparison_arm + ": " if multi else "") + c[FAMILY_COL] + " " + c.beta_label)
    delta = c.set_index("col")[cols].T
    half = pd.DataFrame(
        {col: (c[f"{col}_ci_high"] - c[f"{col}_ci_low"]).to_numpy() / 2 for col in cols}, index=c["col"]
    ).T
    delta.index = half.index = [label(i[len("delta_") :]) for i in delta.index]
    return delta, delta / half.where(half > 0)


def heatmap_numbers(t: dict) -> str:
    """The heatmap caption's numbers, from heatmap_frame."""
    got = heatmap_frame(t)
    if got is None:
        return ""
    delta, z = got
    clear = int((z.abs() >= 1).sum().sum())
    n = int(delta.notna().sum().sum())
    text = f"In this collection: {clear} of {n} deltas have an interval clear of 0"
    if z.notna().any().any():
        row, col = z.abs().stack().idxmax()
        big = f"{sig3(delta.loc[row, col])} ({sig3(z.loc[row, col])} half-widths)"
        text += f"; the largest relative to its noise: {row} at {col}, {big}"
    return text + "."
