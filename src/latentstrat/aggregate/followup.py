"""What a cell cost (from the collection's Snakemake benchmark files) and the follow-up plan:
the seeds that would settle a `cannot tell` of the main contrast, and what they would cost
(FOLLOWUP_FILE beside the aggregate tables)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from latentstrat.aggregate import power
from latentstrat.cells import Collection, next_seeds
from latentstrat.io import write_text
from latentstrat.metrics import ENDPOINT_FALLBACK
from latentstrat.paths import CELL_JOB_FOLDER
from latentstrat.stages import names as stage_names

FOLLOWUP_FILE = "followup.json"

# the cell jobs whose benchmark seconds make a cell's cost
COST_PARTS = stage_names("cell")


def cell_costs(bench_dir, cells: list[str]) -> pd.DataFrame:
    """Per cell: the seconds of its train, evaluate, probe and tabulate jobs from Snakemake's
    benchmark files, and their total; cells whose work was done by another collection (shared
    cell work) have none here and are left out (all of them without a `bench_dir`)."""
    columns = ["cell_id", *(f"{p}_s" for p in COST_PARTS), "total_s"]
    if not bench_dir:
        return pd.DataFrame(columns=columns)
    bench_dir, rows = Path(bench_dir), []
    for cid in cells:
        row = {"cell_id": cid}
        for part in COST_PARTS:
            files = [bench_dir / CELL_JOB_FOLDER[part] / f"{cid}.tsv"]
            secs = [float(pd.read_csv(f, sep="\t")["s"].iloc[-1]) for f in files if f.is_file()]
            row[f"{part}_s"] = sum(secs) if secs else math.nan
        row["total_s"] = sum(row[f"{p}_s"] for p in COST_PARTS)
        rows.append(row)
    df = pd.DataFrame(rows, columns=columns)
    return df[df.total_s.notna()].reset_index(drop=True)


def seed_variances(commons: pd.DataFrame | None, arm: str, metric: str) -> list[float] | None:
    """The per-replicate delta variance of each common setting of the contrast against `arm`
    (a setting without replicates: the mean of the others'); None when none is known."""
    col = f"delta_{metric}_seed_var"
    if commons is None or commons.empty or col not in commons.columns:
        return None
    v = commons.loc[commons.comparison_arm == arm, col].astype(float)
    if v.notna().sum() == 0:
        return None
    return list(v.fillna(v.mean()))


def followup_plan(
    collection: Collection,
    contrasts: pd.DataFrame,
    costs: pd.DataFrame,
    threads: int = 1,
    commons: pd.DataFrame | None = None,
    cores: int = 2,
) -> dict:
    """{"needed": False} when the headline contrast (the primary metric against each comparison
    arm) decides or is not a matter of power; else the seeds that settle it (power.followup_need,
    sized on each common setting's own spread in `commons`) and what they cost: cells added and
    seconds of one job slot per cell (mean of `costs`), for the command the follow-up config
    prints (`--cores 2`: `cores` // `threads`, the collection's resources.threads, cells at a
    time). The follow-up's cells are exactly this collection's plus its fresh seeds in every
    setting: its replicate seeds stay those of this collection (cells.Collection.followup)."""
    report = collection.report
    metric = report["primary_metric"]
    if report.get("headline_seeds"):  # looks are capped at two: this is the second
        return {"needed": False, "metric": metric, "why": "this collection is the second and last look"}
    second = power.look_alpha(report, followup=True)
    if len(report.get("alpha_by_look") or []) < 2:
        return {"needed": False, "metric": metric, "why": "report.alpha_by_look declares one look"}
    if contrasts.empty or contrasts.loc[contrasts.metric == metric, "mean_delta"].isna().all():
        metric = ENDPOINT_FALLBACK  # external tables without the primary metric (as settings.ranking_metric)
    seeds = list(collection.seeds)
    rows = contrasts[contrasts.metric == metric] if not contrasts.empty else contrasts
    needs = [
        n
        for n in (
            power.followup_need(
                r,
                len(seeds),
                report["near_zero_delta"],
                report["followup_max_seeds"],
                seed_variances(commons, r["comparison_arm"], metric),
                second,
            )
            for r in rows.to_dict("records")
        )
        if n
    ]
    if not needs:
        return {"needed": False, "metric": metric}
    n = max(x["seeds"] for x in needs)
    # n fresh seeds per setting, after every seed the collection has used (replicates included):
    # the follow-up's headline tests them on their own (report.headline_seeds), a second look on
    # data the first look never saw (when no look has tested anything yet, training noise being
    # unknown, the seeds simply add up)
    now = collection.cells
    if any(x["training_noise_known"] for x in needs):
        # a second look on fewer fresh seeds rests on too few df to hold its level (measured:
        # report.followup_min_fresh_seeds, docs/design.md)
        n = max(n, int(report["followup_min_fresh_seeds"]))
        fresh = next_seeds([max(int(c.settings["seed"]) for c in now)], n + 1)[1:]
        new_seeds = seeds + fresh
    else:
        fresh, new_seeds = [], next_seeds(seeds, n)
    n_now, n_then = len(now), len(collection.followup(new_seeds, fresh).cells)
    seconds = float(costs.total_s.mean()) if len(costs) else math.nan
    return {
        "needed": True,
        "metric": metric,
        "collection": collection.name,
        "needs": needs,
        "seeds": new_seeds,
        "fresh_seeds": fresh,
        "cells_now": n_now,
        "cells_added": n_then - n_now,
        "seconds_per_cell": seconds,
        "parallel_cells": max(1, cores // (int(threads) or 1)),
    }


def write_followup_plan(plan: dict, out_dir) -> None:
    write_text(json.dumps(plan, indent=2, default=str) + "\n", Path(out_dir) / FOLLOWUP_FILE)
