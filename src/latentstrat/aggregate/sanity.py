"""Cell sanity: is each complete cell a working model of the tasks, held to the entangled
model's quality check (design section 6, docs/design.md); and the `cell_check` mark that every
table naming cells carries from it (`mark_cells`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from latentstrat.aggregate.columns import CELL_CHECK_COL, FAMILY_COL
from latentstrat.cells import beta_label
from latentstrat.families import family_label
from latentstrat.metrics import M

SANITY_COLUMNS = [
    "cell_id",
    "arm",
    FAMILY_COL,
    "beta_label",
    M.final_answer_accuracy,
    "entangled_answer_accuracy",
    M.strategy_match_rate,
    "entangled_strategy_match_rate",
    "step0_base_relative_reconstruction",
    "final_token_base_relative_reconstruction",
    "router_probe_tasks",
    "router_probe_collapsed_tasks",
    "posterior_probe_tasks",
    "n_tasks",
    "followed_strategy_tv_max",
    "collapsed",
    "passed",
    "failures",
]


def entangled_model_quality(quality: dict | None) -> dict:
    """The entangled model's answer accuracy and strategy-match rate (its quality check, mean over
    tasks), the yardstick a cell is held to; {} when there is no check (skipped or not given)."""
    tasks = (quality or {}).get("tasks") or {}
    if not tasks:
        return {}

    def mean(check):
        return float(np.mean([t["checks"][check]["value"] for t in tasks.values()]))

    return {
        "answer_accuracy": mean("answer_accuracy"),
        M.strategy_match_rate: mean(M.strategy_match_rate),
        "n_tasks": len(tasks),
    }


def fmt_num(v) -> str:
    return "NA" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.3g}"


def step0_base_relative(history_all: pd.DataFrame) -> dict:
    """cell id -> its step-0 (validation) base-relative reconstruction."""
    if not len(history_all):
        return {}
    h = history_all[(history_all.metric == M.base_relative_reconstruction) & (history_all.step == 0)]
    return dict(zip(h.cell_id, h.value.astype(float)))


def sanity_inputs(r: pd.Series, entangled: dict, step0: dict) -> dict:
    """A cell's numbers the checks read, next to the entangled model's."""
    n_tasks = (
        float(r["n_tasks"]) if "n_tasks" in r.index and pd.notna(r["n_tasks"]) else entangled.get("n_tasks", math.nan)
    )
    return {
        "cell_id": r["cell_id"],
        "arm": r.get("arm", ""),
        FAMILY_COL: family_label(r["reconstruction_family"]),
        "beta_label": beta_label(r["beta"]),
        M.final_answer_accuracy: float(r.get(M.final_answer_accuracy, math.nan)),
        "entangled_answer_accuracy": entangled.get("answer_accuracy", math.nan),
        M.strategy_match_rate: float(r.get(M.strategy_match_rate, math.nan)),
        "entangled_strategy_match_rate": entangled.get(M.strategy_match_rate, math.nan),
        "step0_base_relative_reconstruction": step0.get(r["cell_id"], math.nan),
        # per token in both arms: the same yardstick whatever the arm's token aggregation
        "final_token_base_relative_reconstruction": float(r.get(M.token_base_relative_reconstruction, math.nan)),
        "router_probe_tasks": float(r.get("within_task_router_probe_tasks", math.nan)),
        "router_probe_collapsed_tasks": _count(r.get("within_task_router_probe_collapsed_tasks")),
        "posterior_probe_tasks": float(r.get("posterior_probe_tasks", math.nan)),
        "n_tasks": n_tasks,
    }


def _count(v) -> float:
    """A task count of the cell row; 0 when absent (a row tabulated before the count)."""
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def sanity_checks(row: dict, thr: dict, yardstick: bool = True) -> tuple[list[str], list[str]]:
    """(why each failed check failed, the checks whose input is absent) of a sanity_inputs row.
    `yardstick`: the collection has an entangled model's quality check to hold answer accuracy
    and strategy match to; without one (`entangle.mode: skip`) those two checks do not apply
    (the other checks still run) rather than being absent."""
    fails, unchecked = [], []

    def check(name, inputs, ok, why):
        if not yardstick and name in ("answer accuracy", "strategy match"):
            return
        if any(v is None or math.isnan(v) for v in inputs):
            unchecked.append(name)
        elif not ok:
            fails.append(why)

    ea, ca = row["entangled_answer_accuracy"], row[M.final_answer_accuracy]
    check(
        "answer accuracy",
        (ea, ca),
        ca >= thr["sanity_min_answer_ratio"] * ea,
        f"answer accuracy {fmt_num(ca)} < {thr['sanity_min_answer_ratio']} x entangled {fmt_num(ea)}",
    )
    es, cs = row["entangled_strategy_match_rate"], row[M.strategy_match_rate]
    check(
        "strategy match",
        (es, cs),
        cs >= thr["sanity_min_strategy_match_ratio"] * es,
        f"strategy match {fmt_num(cs)} < {thr['sanity_min_strategy_match_ratio']} x entangled {fmt_num(es)}",
    )
    s0 = row["step0_base_relative_reconstruction"]
    check(
        "step-0 base-relative reconstruction",
        (s0,),
        abs(s0 - 1) <= thr["sanity_step0_tolerance"],
        f"step-0 base-relative reconstruction {fmt_num(s0)} is not 1 +- {thr['sanity_step0_tolerance']} "
        "(the cell did not start as the entangled model)",
    )
    fb = row["final_token_base_relative_reconstruction"]
    check(
        "final per-token base-relative reconstruction",
        (fb,),
        fb <= thr["sanity_max_base_relative"],
        f"final per-token base-relative reconstruction {fmt_num(fb)} > {thr['sanity_max_base_relative']}",
    )
    return fails, unchecked


def cell_sanity(summary: pd.DataFrame, history_all: pd.DataFrame, entangled: dict, thr: dict) -> pd.DataFrame:
    """One row per complete cell: is it a working model of the tasks (design section 6, cell sanity, docs/design.md)?

    Checks (thresholds from the `report` config): final answer accuracy and strategy-match rate
    >= sanity_min_*_ratio x the entangled model's; step-0 base-relative reconstruction (validation)
    within sanity_step0_tolerance of 1 (the cell starts as the entangled model); final per-token
    base-relative reconstruction (test; the same weighting in both arms) <= sanity_max_base_relative.
    Each is a check a broken cell fails (tests/test_negative_controls.py breaks a real one). The
    probe counts are shown, not checked: the probe stage refuses features it cannot fit, and a
    task whose probe has one class is a collapse (`router_probe_collapsed_tasks`), a finding. A check
    whose input is absent is not run (named in `failures` as "not checked"); `passed` is then NA
    unless another check failed, and a cell passes only when every check ran. Without an
    entangled model (`entangled` empty: `entangle.mode: skip`) answer accuracy and strategy match
    have no yardstick and do not apply (named in `failures` as "no yardstick")."""
    rows = []
    step0 = step0_base_relative(history_all)
    yardstick = bool(entangled)
    for _, r in summary.iterrows():
        row = sanity_inputs(r, entangled, step0)
        fails, unchecked = sanity_checks(row, thr, yardstick)
        tv = float(r.get("followed_strategy_tv_max", math.nan))
        row["followed_strategy_tv_max"] = tv
        # collapse is a finding about the cell, not a broken cell: flagged, not failed
        row["collapsed"] = None if math.isnan(tv) else bool(tv >= thr["collapse_tv"])
        row["passed"] = False if fails else (None if unchecked else True)
        notes = [f"not checked: {', '.join(unchecked)}"] if unchecked else []
        if not yardstick:
            notes.append("no yardstick for answer accuracy, strategy match (no entangled model)")
        row["failures"] = "; ".join(fails + notes)
        rows.append(row)
    return pd.DataFrame(rows, columns=SANITY_COLUMNS)


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
