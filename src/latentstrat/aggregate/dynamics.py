"""Training histories -> the dynamics tables: the histories labelled by cell, per-cell first /
min / max / final values (`dynamics_summary`), per-task router checkpoints, token-count
dominance (per-task shares of examples, tokens, loss and gradient) and gradient clipping."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from latentstrat.aggregate.columns import FAMILY_COL, SHARE_METRICS
from latentstrat.cells import beta_label
from latentstrat.families import family_label
from latentstrat.metrics import HISTORY_COLUMNS, M

# dynamics summary: metric -> short name used in column names (seeds: base_relative_reconstruction)
DYNAMICS_METRICS = {
    M.base_relative_reconstruction: M.base_relative_reconstruction,
    M.active_reconstruction_objective: M.active_reconstruction_objective,
    M.kl_prior_loss: M.kl_prior_loss,
    M.kl_over_active_reconstruction: M.kl_over_active_reconstruction,
    # validation proxies get their own names: the router probe there scores which strategy the
    # generator follows by likelihood instead of decoding (metrics.SCORED_NAMES), on a small subset
    "scored_router_probe": "val_scored_router_probe",
    M.posterior_probe: "val_posterior_probe",
    "scored_matched_router_score": "val_scored_matched_router_score",
}
INIT_LABEL = "initialization"
CELL_INFO_COLUMNS = ["cell_id", "arm", "token_aggregation", "reconstruction_family", "beta", "seed"]


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
        row = {
            "cell_id": cid,
            "first_checkpoint": checkpoint_label(first_step),
            "first_global_step": first_step,
            "final_global_step": final_step,
        }
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
        r = g[g.metric == "scored_matched_router_score"].sort_values("step")
        if r.empty:
            continue
        acc = g[g.metric == M.final_answer_accuracy].sort_values("step")
        rows.append(
            {
                "task_name": task,
                "cell_id": cid,
                "final_val_scored_matched_router_score": r.value.iloc[-1],
                "max_val_scored_matched_router_score": r.value.max(),
                "step_of_max": int(r.step.iloc[int(np.argmax(r.value.values))]),
                "final_val_decoded_answer_accuracy": acc.value.iloc[-1] if len(acc) else math.nan,
            }
        )
    df = pd.DataFrame(
        rows,
        columns=[
            "task_name",
            "cell_id",
            "final_val_scored_matched_router_score",
            "max_val_scored_matched_router_score",
            "step_of_max",
            "final_val_decoded_answer_accuracy",
        ],
    )
    if df.empty:
        return df
    df = df.sort_values(["task_name", "max_val_scored_matched_router_score"], ascending=[True, False])
    return df.groupby("task_name", sort=False).head(top_k).reset_index(drop=True)


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
            mix = history_task[
                (history_task.cell_id == cid) & (history_task.metric == "batch_task_share") & (history_task.step > 0)
            ]  # the batches' mix over the whole run
            mix = mix.groupby("task").value.mean() if len(mix) else pd.Series(dtype=float)
            for task, r in snap.iterrows():
                rows.append(
                    {
                        "cell_id": cid,
                        "token_aggregation": g["token_aggregation"].iloc[0],
                        "checkpoint": which,
                        "step": int(step),
                        "task": task,
                        **{m: r.get(m, math.nan) for m in SHARE_METRICS},
                        "batch_task_share": mix.get(task, math.nan),
                    }
                )
    per_cell = pd.DataFrame(rows)
    cols = SHARE_METRICS + ["batch_task_share"]
    out = (
        per_cell.groupby(["token_aggregation", "checkpoint", "task"], sort=False)[cols]
        .mean(numeric_only=True)
        .reset_index()
    )
    out["n_cells"] = per_cell.groupby(["token_aggregation", "checkpoint", "task"], sort=False).size().values
    return out


def gradient_clipping(history_all: pd.DataFrame) -> pd.DataFrame:
    """Per token aggregation: the clipping threshold, the mean pre-clip gradient norm and the
    fraction of training steps whose norm was clipped (over every cell and checkpoint window):
    whether the threshold bound, and for which aggregation."""
    h = history_all[history_all.metric.isin(["grad_norm_preclip", "clipped_fraction", "grad_clip"])]
    if h.empty:
        return pd.DataFrame(
            columns=["token_aggregation", "grad_clip", "grad_norm_preclip_mean", "clipped_fraction", "n_cells"]
        )
    w = h.pivot_table(index=["cell_id", "step"], columns="metric", values="value").reset_index()
    w["token_aggregation"] = w.cell_id.map(dict(zip(history_all.cell_id, history_all.token_aggregation)))
    g = w.groupby("token_aggregation", sort=False)
    return pd.DataFrame(
        {
            "token_aggregation": list(g.groups),
            "grad_clip": g.grad_clip.first().values,
            "grad_norm_preclip_mean": g.grad_norm_preclip.mean().values,
            "clipped_fraction": g.clipped_fraction.mean().values,
            "n_cells": g.cell_id.nunique().values,
        }
    )


def share_sums(dominance: pd.DataFrame) -> pd.DataFrame:
    if dominance.empty:
        return dominance
    return dominance.groupby(["token_aggregation", "checkpoint"], sort=False)[SHARE_METRICS].sum().reset_index()


def history_tables(history: pd.DataFrame, state: pd.DataFrame, top_k: int) -> dict[str, pd.DataFrame]:
    """The dynamics tables of a collection from its cells' long histories (labelled from the
    collection state): history_long ("all" tasks), history_per_task_long, dynamics_summary,
    per_task_checkpoints, token_dominance, token_dominance_sums, gradient_clipping."""
    cells_info = (
        pd.concat([state[CELL_INFO_COLUMNS]], ignore_index=True)
        if len(state)
        else pd.DataFrame(columns=CELL_INFO_COLUMNS)
    )
    hist = history if len(history) else pd.DataFrame(columns=HISTORY_COLUMNS)
    hist = (
        label_cells(hist, cells_info)
        if len(hist)
        else hist.assign(**{c: [] for c in ["arm", "token_aggregation", FAMILY_COL, "beta_label"]})
    )
    h_all, h_task = hist[hist.task == "all"], hist[hist.task != "all"]
    t = {"history_long": h_all, "history_per_task_long": h_task}
    dyn = dynamics_summary(h_all) if len(h_all) else pd.DataFrame()
    t["dynamics_summary"] = label_cells(dyn, cells_info) if len(dyn) else dyn
    t["per_task_checkpoints"] = (
        label_cells(per_task_checkpoints(h_task, top_k), cells_info) if len(h_task) else pd.DataFrame()
    )
    t["token_dominance"] = token_dominance(h_task) if len(h_task) else pd.DataFrame()
    t["token_dominance_sums"] = share_sums(t["token_dominance"])
    t["gradient_clipping"] = (
        gradient_clipping(h_all) if len(h_all) else gradient_clipping(pd.DataFrame(columns=["metric"]))
    )
    return t
