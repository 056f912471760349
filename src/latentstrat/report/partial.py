"""The partial report after a failed run (e.g. `--keep-going` with a failed cell): aggregate and
report over the cells whose metrics exist, listing the others as incomplete with the reason.

Called by the workflow's `onerror` handler in the main Snakemake process; the next complete run
replaces these outputs (the missing metrics are newer). A cell whose metrics are older than its
records or probes (rewritten or corrupt outputs) is incomplete too (aggregate.inputs.load_cell_rows).
"""

from __future__ import annotations

from pathlib import Path

from latentstrat.aggregate.collection import aggregate_collection
from latentstrat.aggregate.inputs import load_entangle_quality
from latentstrat.cells import expand_cells
from latentstrat.paths import Paths
from latentstrat.report import build_report


def partial_report(cfg: dict, log=print) -> dict | None:
    """Write the aggregate and the report of the finished cells of `cfg`'s collection; return
    {"done", "missing"}, or None when no cell has metrics yet or every cell has them."""
    p = Paths.from_config(cfg)
    cells = [c.cell_id for c in expand_cells(cfg)]
    tasks = list(cfg["data"]["tasks"])
    done = [c for c in cells if p.row_path(c).exists()]
    if not done:
        log("partial report: no cell has metrics yet; nothing to report")
        return None
    missing = [c for c in cells if c not in done]
    if not missing:  # the aggregate or the report job failed: its rerun writes the report, and a
        # partial one in its place would read as up to date to the next run
        log("partial report: every cell has metrics; the collection job that failed writes the report when rerun")
        return None
    log(
        f"partial report: {len(done)}/{len(cells)} cells have metrics; without: {', '.join(missing) or 'none'} "
        f"-> {p.report_dir}"
    )
    quality = p.entangle_files(cfg["entangle"]["mode"])["quality"]
    quality = quality if Path(quality).exists() else None
    aggregate_collection(
        cfg,
        {c: str(p.row_path(c)) for c in cells},
        {c: p.train_files(c)["history"] for c in cells},
        str(p.aggregate_dir),
        quality_path=quality,
        upstream={c: [str(p.records_path(c)), *p.probe_files(c, tasks)] for c in cells},
    )
    meta = {"collection": cfg["collection"], "cells": cells, "partial": True}
    if quality:
        meta["entangle_quality"] = load_entangle_quality(quality)
    build_report(str(p.aggregate_dir), str(p.report_dir), meta)
    return {"done": done, "missing": missing}
