"""Collection report: results.md, analysis.md, figures, brief.yaml, findings.json from aggregate tables."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import yaml

from latentstrat.aggregate.collection import report_settings
from latentstrat.aggregate.inputs import load_entangle_quality
from latentstrat.io import write_text

if TYPE_CHECKING:
    from latentstrat.jobs import Job


def report_thresholds(meta: dict) -> dict:
    """cfg["report"] values from meta (or the aggregate's meta), else the schema defaults."""
    return report_settings(meta.get("report"))


def build_report(aggregate_dir, out_dir, meta: dict | None = None, figures: bool = True) -> dict:
    """Write the report of one collection from its cached aggregate tables (figures unless
    `figures=False`). Returns {findings, figures, skipped, seconds}."""
    from latentstrat.report.decomposition import decomposition
    from latentstrat.report.figures import make_figures
    from latentstrat.report.findings import compute_findings
    from latentstrat.report.headline import headline, primary_contrast_arm
    from latentstrat.report.html import write_html_report
    from latentstrat.report.markdown import analysis_md, results_md
    from latentstrat.report.multiplicity import multiplicity
    from latentstrat.report.split import split_parts
    from latentstrat.report.tables import load_aggregate

    t0 = time.perf_counter()
    tables, agg_meta = load_aggregate(aggregate_dir)
    meta = {**agg_meta, **(meta or {}), "aggregate_dir": str(aggregate_dir)}
    thresholds = report_thresholds(meta)
    meta.setdefault("primary_metric", thresholds["primary_metric"])
    # the declared primary contrast and endpoint, for the figures that draw them (the forest plot,
    # the endpoint per cell); a collection without a comparison arm has its endpoint alone
    arm = primary_contrast_arm(tables, meta)
    tables["primary_contrast"] = pd.DataFrame(
        [{"primary_arm": meta.get("primary_arm") or "primary", "comparison_arm": arm, "metric": meta["primary_metric"]}]
    )
    out_dir = Path(out_dir)
    made, skipped = make_figures(tables, out_dir / "figures") if figures else ([], [])
    findings = compute_findings(tables, thresholds)
    meta["followup"] = write_followup(Path(aggregate_dir), out_dir, meta.get("configfile"))
    write_text(results_md(tables, meta, made, skipped, thresholds), out_dir / "results.md")
    head = headline(tables, meta)
    parts = [p for p in split_parts(tables) if p["part"] != "total"]
    head["multiplicity"] = multiplicity(tables, head, parts)
    write_text(analysis_md(tables, meta, findings, thresholds, head), out_dir / "analysis.md")
    write_text(
        json.dumps(
            {"collection": meta.get("collection"), "thresholds": thresholds, "findings": findings},
            indent=2,
            default=_jsonable,
        )
        + "\n",
        out_dir / "findings.json",
    )
    st = tables["collection_state"]
    brief = {
        "collection": meta.get("collection"),
        "title": meta.get("title") or meta.get("collection"),
        "description": meta.get("description", ""),
        **{k: v for k, v in head.items() if k != "attribution_evidence"},
        "contrast_split": split_parts(tables),
        "decomposition": decomposition(tables),
        "cells": {
            "expected": len(st),
            "complete": int((st.status == "complete").sum()) if len(st) else 0,
            "incomplete": list(st.loc[st.status != "complete", "cell_id"]) if len(st) else [],
        },
        "comparison_arms": meta.get("comparison_arms", []),
        "entangle_quality_passed": (meta.get("entangle_quality") or {}).get("passed"),
        **_cell_checks(tables["cell_sanity"]),
        "fairness": {r.claim: r.status for r in tables["fairness"].itertuples()} if len(tables["fairness"]) else {},
        "findings": {f["question"]: f["status"] for f in findings},
        "followup": "followup.yaml" if meta["followup"].get("needed") else None,
        "figures": [f"figures/{n}.png" for n, _ in made],
        "figures_skipped": [n for n, _ in skipped],
    }
    write_text(yaml.safe_dump(brief, sort_keys=False, width=120), out_dir / "brief.yaml")
    write_html_report(tables, brief, made, out_dir, meta)
    return {"findings": findings, "figures": made, "skipped": skipped, "seconds": time.perf_counter() - t0}


def write_followup(aggregate_dir: Path, out_dir: Path, configfile: str | None) -> dict:
    """FOLLOWUP_FILE of the aggregate as `followup.yaml` beside the report (its `extends:`
    relative to the report folder), when a `cannot tell` is a matter of power and the collection's
    config file is known; else no follow-up file (a stale one is removed). Returns the plan."""
    import os

    from latentstrat.aggregate.followup import FOLLOWUP_FILE
    from latentstrat.aggregate.power import followup_text

    p = aggregate_dir / FOLLOWUP_FILE
    plan = json.loads(p.read_text()) if p.exists() else {"needed": False}
    target = out_dir / "followup.yaml"
    if plan.get("needed") and configfile:
        plan = {**plan, "path": str(target), "extends": os.path.relpath(configfile, out_dir.resolve())}
        write_text(followup_text(plan), target)
    else:
        plan = {**plan, "needed": False}
        target.unlink(missing_ok=True)
    return plan


def _cell_checks(sanity) -> dict:
    """brief.yaml's view of the cell sanity check: passed (None when some cell could not be fully
    checked, or none was), the failing cells with their reasons and the cells not fully checked."""
    if sanity.empty:
        return {"cell_checks_passed": None, "failing_cells": [], "unchecked_cells": []}
    bad, unchecked = sanity[sanity.passed.eq(False)], sanity[sanity.passed.isna()]
    passed = False if len(bad) else (True if sanity.passed.eq(True).all() else None)
    return {
        "cell_checks_passed": passed,
        "failing_cells": [{"cell_id": r.cell_id, "why": r.failures} for r in bad.itertuples()],
        "unchecked_cells": [{"cell_id": r.cell_id, "why": r.failures} for r in unchecked.itertuples()],
    }


def _jsonable(o):
    try:
        return float(o)
    except (TypeError, ValueError):
        return str(o)


def run(job: Job) -> dict:
    """The report rule's job: the report from the aggregate tables (the aggregate's meta carries
    the collection's and the report's settings)."""
    quality = load_entangle_quality(job.input["quality"])
    return build_report(
        job.input["aggregate"], job.folder("results"), {"partial_run": False, "entangle_quality": quality}
    )
