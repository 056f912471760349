"""The aggregate job: a collection's inputs -> every aggregate table, written as parquet + CSV
(with aggregate_meta.json and FOLLOWUP_FILE) under the aggregate folder.

`aggregate_collection` reads the per-cell files the workflow names; `aggregate_from_tables`
reads a summary table from elsewhere (the `python -m latentstrat.report` command);
`aggregate_tables` does the rest from DataFrames alone, in the order of the data flow:
inputs -> settings (seed means, intervals) -> contrasts (primary vs each comparison arm) ->
dynamics (histories) -> sanity (cell checks) -> fairness -> followup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from latentstrat.aggregate.columns import FAMILY_COL
from latentstrat.aggregate.contrasts import arm_contrasts, common_cells, family_contrasts
from latentstrat.aggregate.dynamics import history_tables
from latentstrat.aggregate.fairness import (
    availability_table,
    collection_metadata,
    collection_setup,
    collection_state_counts,
    fairness_table,
)
from latentstrat.aggregate.followup import cell_costs, followup_plan, write_followup_plan
from latentstrat.aggregate.inputs import (
    load_bootstrap,
    load_cell_rows,
    load_entangle_quality,
    load_histories,
    read_history_table,
    read_summary_table,
)
from latentstrat.aggregate.power import look_alpha
from latentstrat.aggregate.sanity import cell_sanity, entangled_model_quality, mark_cells
from latentstrat.aggregate.scale import scale_table
from latentstrat.aggregate.settings import (
    aggregation_name,
    derived_diagnostics,
    metric_distributions,
    ranking_metric,
    seed_means,
    setting_rows,
    top_bottom,
)
from latentstrat.aggregate.split import split_contrasts
from latentstrat.aggregate.states import cell_states, state_counts
from latentstrat.cells import CELL_KEYS, Collection, external_arms, format_value
from latentstrat.families import family_label, parse_family
from latentstrat.io import write_parquet, write_text
from latentstrat.metrics import BOOTSTRAP_FILE, ENDPOINT, HISTORY_COLUMNS
from latentstrat.runtime import host

if TYPE_CHECKING:
    from latentstrat.jobs import Job


def report_settings(report_cfg: dict | None) -> dict:
    """The `report` config section with the schema's defaults filled in."""
    from latentstrat.schema import load_schema

    props = load_schema()["properties"]["report"]["properties"]
    return {**{k: v.get("default") for k, v in props.items()}, **(report_cfg or {})}


def concat_tables(frames) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def comparison_arm_rows(summary: pd.DataFrame, role: pd.Series, comparisons: dict, bootstrap: dict | None) -> dict:
    """Comparison arm name -> its setting rows: the external tables, then the run-here arms of
    `summary` (rows whose role is not primary)."""
    arms = dict(comparisons)
    if "arm" in summary.columns:
        for arm in summary.loc[role != "primary", "arm"].unique():
            arms[arm] = setting_rows(summary[summary.arm == arm], bootstrap)
    return {a: (seed_means(r) if "n_seeds" not in r.columns else r) for a, r in arms.items()}


def cell_rows(summary: pd.DataFrame, comparisons: dict) -> dict:
    """cell id -> its metrics row, over the collection's cells and the external tables' rows (the
    paired deltas per replicate seed: contrasts.setting_training)."""
    out = {}
    for df in [summary, *comparisons.values()]:
        if df is not None and "cell_id" in df.columns:
            out.update({str(r["cell_id"]): r for _, r in df.iterrows()})
    return out


def contrast_tables(
    primary_rows: pd.DataFrame,
    arms: dict,
    grid_axes,
    bootstrap: dict | None,
    states: pd.DataFrame,
    cells: dict,
    settings: dict,
    descriptive: bool = True,
) -> tuple[dict, dict, dict]:
    """(tables common_cells, arm_contrasts, contrast_by_family, unmatched_rows, reference_scale;
    common rows and unmatched primary rows per comparison arm). Training noise is measured on
    each setting's paired delta across its replicate seeds (contrasts.training_terms); the
    contrast per family is over the report settings' `primary_metric`, every contrast at the
    look's level (`look_alpha`, else the first look's). `descriptive=False` leaves out the tables
    no verdict reads (the contrast per family, the reference scale)."""
    primary_metric = settings.get("primary_metric") or ENDPOINT
    alpha = settings.get("look_alpha") or look_alpha(settings, followup=False)
    commons, unmatched = {}, {}
    state_of = dict(zip(states.cell_id, states.state)) if len(states) else None
    for arm, rows in arms.items():
        commons[arm], unmatched[arm] = common_cells(
            primary_rows, rows, grid_axes, arm, bootstrap=bootstrap, cells=cells, states=state_of
        )
    t = {
        "common_cells": concat_tables(commons.values()),
        "arm_contrasts": arm_contrasts(commons, bootstrap, alpha=alpha),
        "unmatched_rows": concat_tables(unmatched.values()),
    }
    if settings.get("normalized_secondary"):
        t["normalized_contrasts"] = normalized_contrasts(primary_rows, commons, bootstrap, primary_metric, alpha)
    if descriptive:
        t["contrast_by_family"] = family_contrasts(commons, bootstrap, primary_metric, alpha)
        t["reference_scale"] = scale_table(primary_rows, arms, commons)  # the z-free reference scale per arm
    return t, commons, unmatched


def verdict_tables(data: CollectionData, settings: dict, descriptive: bool = True) -> tuple[dict, dict]:
    """The verdict's part of the aggregate, from cells to contrasts: setting rows (seed means with
    intervals), cell states, comparison arms' setting rows, common cells and arm contrasts.
    Returns (tables, context: primary_rows, arms, commons, unmatched). The calibration harness
    (bench calibrate) runs simulated collections through exactly this, with `descriptive=False`:
    without the tables no verdict reads (summary_by_setting, contrast_by_family, reference_scale)."""
    summary, bootstrap = data.summary, data.bootstrap
    role = summary["role"] if "role" in summary.columns else pd.Series("primary", index=summary.index)
    t = {"summary_by_setting": setting_rows(summary, bootstrap)} if descriptive else {}
    primary_rows = setting_rows(summary[role == "primary"], bootstrap)
    t["cell_states"] = cell_states(summary, settings)
    t["cell_state_counts"] = state_counts(t["cell_states"])
    arms = comparison_arm_rows(summary, role, data.comparisons, bootstrap)
    cells = cell_rows(summary, data.comparisons)
    contrasts, commons, unmatched = contrast_tables(
        primary_rows, arms, data.grid_axes, bootstrap, t["cell_states"], cells, settings, descriptive
    )
    t.update(contrasts)
    if settings.get("contrast_split"):  # the declared split of the primary contrast (aggregate.split)
        t["contrast_split"] = split_table(settings, data, primary_rows, arms, cells, t["cell_states"])
    fresh = settings.get("headline_seeds")
    if fresh:  # a follow-up: the headline tests its fresh seeds on their own (the pooled contrast beside it)
        t["headline_contrasts"] = fresh_seed_contrasts(data, settings, fresh)
    return t, {"primary_rows": primary_rows, "arms": arms, "commons": commons, "unmatched": unmatched}


def split_table(settings: dict, data: CollectionData, primary_rows, arms: dict, cells: dict, states) -> pd.DataFrame:
    """report.contrast_split read on the collection's setting rows (aggregate.split), at the look's level."""
    summary = data.summary
    primary = summary[summary["role"] == "primary"] if "role" in summary.columns else summary
    name = str(primary["arm"].iloc[0]) if "arm" in primary.columns and len(primary) else "primary"
    return split_contrasts(
        settings["contrast_split"],
        {name: primary_rows, **arms},
        data.grid_axes,
        data.bootstrap,
        cells,
        dict(zip(states.cell_id, states.state)) if len(states) else None,
        settings.get("primary_metric") or ENDPOINT,
        settings.get("look_alpha") or look_alpha(settings, followup=False),
    )


def normalized_contrasts(primary_rows, commons: dict, bootstrap, metric: str, alpha: float) -> pd.DataFrame:
    """The secondary endpoint (report.normalized_secondary): the primary metric's arm contrasts
    over the common settings of the families whose objective is normalized (families.Family
    .normalized: measured against the entangled model, so the aggregation's scale change does
    not reach them), at the look's level."""
    normalized = set()
    for f in primary_rows.get("reconstruction_family", pd.Series(dtype=str)).dropna().unique():
        try:
            if parse_family(str(f)).normalized:
                normalized.add(family_label(str(f)))
        except ValueError:  # a family an external table names and this code does not know
            continue
    subset = {arm: c[c[FAMILY_COL].isin(normalized)] if len(c) else c for arm, c in commons.items()}
    return arm_contrasts(subset, bootstrap, [metric], alpha=alpha)


def fresh_seed_contrasts(data: CollectionData, settings: dict, seeds) -> pd.DataFrame:
    """The arm contrasts over the cells whose replicate seed is one of `seeds` alone
    (report.headline_seeds): the follow-up's own look, on cells the first look never saw, at the
    second look's level (report.alpha_by_look)."""
    wanted = {format_value(s) for s in seeds}

    def fresh(df: pd.DataFrame) -> pd.DataFrame:
        return df[df["seed"].map(format_value).isin(wanted)] if "seed" in df.columns else df.iloc[0:0]

    summary, comparisons = fresh(data.summary), {a: fresh(df) for a, df in data.comparisons.items()}
    if summary.empty:
        return arm_contrasts({}, None)
    sub = CollectionData(summary, data.state, comparisons, data.grid_axes, data.history, data.bootstrap)
    second = {**settings, "headline_seeds": None, "look_alpha": look_alpha(settings, followup=True)}
    t, _ = verdict_tables(sub, second, descriptive=False)
    part = t["arm_contrasts"].assign(look="all families")
    if "normalized_contrasts" in t:
        part = pd.concat([part, t["normalized_contrasts"].assign(look="normalized families")], ignore_index=True)
    return part.assign(seeds=",".join(sorted(wanted)))


def write_tables(t: dict, out_dir: Path, meta: dict) -> None:
    """Every table as parquet + CSV, and aggregate_meta.json."""
    for name, df in t.items():
        df = df.reset_index(drop=True)
        write_parquet(df, out_dir / f"{name}.parquet")
        write_text(df.to_csv(index=False), out_dir / f"{name}.csv")
    write_text(json.dumps(meta, indent=2, default=str) + "\n", out_dir / "aggregate_meta.json")


@dataclass(frozen=True, eq=False)
class CollectionData:
    """What the aggregate tables are computed from.

    summary: complete cells (all arms; `role` column marks the primary arm, else all rows are primary).
    state: every cell of the collection and its status (`load_cell_rows`).
    comparisons: external comparison arm name -> validated table; run-here arms come from summary.
    grid_axes: the cell settings the primary arm's grid varies.
    history: the complete cells' training histories (long).
    bootstrap: cell id -> its bootstrap replicates (tabulate.bootstrap_replicates), for intervals.
    costs: per cell job seconds (cell_costs), or None.
    entangle_quality: the entangle stage's quality.json (the cell sanity check's yardstick), or None.
    """

    summary: pd.DataFrame
    state: pd.DataFrame
    comparisons: dict
    grid_axes: list
    history: pd.DataFrame
    bootstrap: dict | None = None
    costs: pd.DataFrame | None = None
    entangle_quality: dict | None = None


def aggregate_tables(
    data: CollectionData,
    out_dir: str | Path,
    top_k: int = 5,
    primary_metric: str = ENDPOINT,
    meta: dict | None = None,
) -> dict:
    """All aggregate tables from a collection's data; writes parquet + CSV under out_dir.
    Returns {name: DataFrame}."""
    summary, state, grid_axes = data.summary, data.state, data.grid_axes
    role = summary["role"] if "role" in summary.columns else pd.Series("primary", index=summary.index)
    primary_cells = summary[role == "primary"]
    settings = report_settings((meta or {}).get("report"))
    verdict, ctx = verdict_tables(data, settings)
    t: dict[str, pd.DataFrame] = {
        "summary": summary,
        "collection_state": state,
        "collection_state_counts": collection_state_counts(state),
        **verdict,
    }
    primary_rows, arms, commons, unmatched = ctx["primary_rows"], ctx["arms"], ctx["commons"], ctx["unmatched"]
    t["metric_distributions"] = metric_distributions(primary_rows)
    t["derived_diagnostics"] = derived_diagnostics(primary_rows)
    primary_metric, ranking_note = ranking_metric(primary_rows, primary_metric)
    t["top_rows"], t["bottom_rows"] = top_bottom(primary_rows, primary_metric, top_k)
    t.update(history_tables(data.history, state, top_k))
    h_all, h_task = t["history_long"], t["history_per_task_long"]
    t["collection_metadata"] = collection_metadata(summary, state, host.code_version()["code_version"])
    t["cell_costs"] = data.costs if data.costs is not None else cell_costs(None, [])
    t["cell_sanity"] = cell_sanity(summary, h_all, entangled_model_quality(data.entangle_quality), settings)
    t["fairness"] = fairness_table(t, primary_cells, primary_rows, grid_axes, arms, commons, unmatched)
    t["data_availability"] = availability_table(primary_rows, arms, commons, h_all, h_task)
    mark_cells(t, t["cell_sanity"])
    write_tables(
        t,
        Path(out_dir),
        {
            "grid_axes": list(grid_axes),
            "top_k": top_k,
            "primary_metric": primary_metric,
            "ranking_note": ranking_note,
            "comparison_arms": list(arms),
            **(meta or {}),
        },
    )
    return t


def aggregate_collection(
    cfg: dict,
    row_paths: dict,
    history_paths: dict,
    out_dir,
    quality_path=None,
    upstream: dict | None = None,
    bench_dir=None,
    configfile=None,
) -> dict:
    """The aggregate job: per-cell metrics + histories of a collection (+ the entangle stage's
    quality.json, the cell sanity check's yardstick) -> aggregate tables under out_dir, and
    FOLLOWUP_FILE: the seeds that would settle a `cannot tell` of the main contrast (or none).
    `upstream`: see inputs.load_cell_rows (the partial report after a failed run passes it).
    `bench_dir`: the collection's Snakemake benchmark folder, for what a cell costs; `configfile`:
    the collection's config file, which a follow-up config extends."""
    quality = load_entangle_quality(quality_path) if quality_path else None
    comparisons = {}
    for arm in external_arms(cfg):  # validated before any other work: a bad table names its column
        comparisons[arm["name"]] = read_summary_table(arm["table"])
    collection = Collection.of(cfg)
    summary, state = load_cell_rows(list(collection.cells), row_paths, upstream)
    complete = set(state.loc[state.status == "complete", "cell_id"])
    history, bad = load_histories({c: p for c, p in history_paths.items() if c in complete})
    bootstrap = load_bootstrap({c: Path(p).with_name(BOOTSTRAP_FILE) for c, p in row_paths.items() if c in complete})
    grid_axes, report = [k for k in CELL_KEYS if k in cfg["grid"]], collection.report
    meta = {
        "collection": collection.name,
        "description": cfg.get("description", ""),
        "title": report.get("title", ""),
        "report": report,
        "primary_arm": cfg["primary_arm"],
        "unreadable_histories": bad,
        "setup": collection_setup(cfg["backbone"], cfg["lora"], cfg["train"], cfg["data"]),
        "configfile": str(Path(configfile).resolve()) if configfile else None,
    }
    costs = cell_costs(bench_dir, list(row_paths))
    t = aggregate_tables(
        CollectionData(summary, state, comparisons, grid_axes, history, bootstrap, costs, quality),
        out_dir,
        top_k=report["top_k"],
        primary_metric=report["primary_metric"],
        meta=meta,
    )
    threads = cfg["resources"]["threads"]
    write_followup_plan(followup_plan(collection, t["arm_contrasts"], costs, threads, t["common_cells"]), out_dir)
    return t


def state_from_summary(summary: pd.DataFrame, arm: str = "primary") -> pd.DataFrame:
    """Collection state when only a summary table exists: every row is a complete primary cell."""
    st = pd.DataFrame(
        {
            "cell_id": summary["cell_id"],
            "arm": summary.get("arm", arm),
            "role": "primary",
            "status": "complete",
            "reason": "",
        }
    )
    for k in CELL_KEYS:
        st[k] = summary[k].values if k in summary.columns else None
    return st


def grid_axes_from_rows(rows: pd.DataFrame) -> list[str]:
    """Cell keys (not seed) that take more than one value in the rows: the grid axes."""
    return [k for k in CELL_KEYS if k != "seed" and k in rows.columns and rows[k].map(format_value).nunique() > 1]


def aggregate_from_tables(
    summary_path,
    comparison_paths=(),
    history_path=None,
    out_dir=".",
    top_k: int = 5,
    primary_metric: str = ENDPOINT,
    config_path=None,
) -> dict:
    """Aggregate tables from a summary table (+ comparison tables, + long history) alone.
    `config_path`: the collection config the tables came from; with it, a `cannot tell` that is a
    matter of power gets a follow-up plan (FOLLOWUP_FILE) that extends that config."""
    from latentstrat.config import load_config

    cfg = load_config(config_path) if config_path else None
    collection = Collection.of(cfg) if cfg else None
    summary = read_summary_table(summary_path)  # validate every input before any work
    comparisons = {Path(p).stem: read_summary_table(p) for p in comparison_paths}
    history = pd.DataFrame(columns=HISTORY_COLUMNS)
    if history_path:
        history = read_history_table(history_path, summary, summary_path)
    summary = summary.assign(role="primary")
    if "arm" not in summary.columns:
        summary["arm"] = aggregation_name(summary)
    state = state_from_summary(summary)
    meta = {
        "collection": Path(summary_path).stem,
        "source": "tables",
        "summary_table": str(summary_path),
        "comparison_tables": [str(p) for p in comparison_paths],
        "history_table": str(history_path or ""),
        "configfile": str(Path(config_path).resolve()) if config_path else None,
        **({"report": collection.report} if collection else {}),
    }
    t = aggregate_tables(
        CollectionData(summary, state, comparisons, grid_axes_from_rows(summary), history),
        out_dir,
        top_k=top_k,
        primary_metric=primary_metric,
        meta=meta,
    )
    write_followup_plan(
        followup_plan(
            collection, t["arm_contrasts"], cell_costs(None, []), cfg["resources"]["threads"], t["common_cells"]
        )
        if collection
        else {"needed": False},
        out_dir,
    )
    return t


def run(job: Job) -> dict:
    """The aggregate rule's job: the collection's tables from every cell's row and history."""
    cells = job.params["cells"]
    return aggregate_collection(
        job.config,
        dict(zip(cells, job.files("rows"))),
        dict(zip(cells, job.files("history"))),
        job.outputs[0],
        quality_path=job.input["quality"],
        bench_dir=job.params["bench_dir"],
        configfile=job.params["configfile"],
    )
