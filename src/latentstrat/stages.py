"""The pipeline's stages, declared once: the rule that runs each, how often it runs (once per
base, per model as built, per cell, per collection), the folder its outputs live in, the folder
of its per-job logs and benchmarks, and the function that runs one of its jobs.

Adding a stage touches three places (docs/architecture.md, "Adding a stage"):

1. its declaration here (the Snakefile includes `workflow/rules/<name>.smk` for every declared
   stage, in this order);
2. its rule file, `workflow/rules/<name>.smk`: inputs, outputs, log, benchmark, params, and
   `script: "../scripts/stage.py"` (the one rule script: it builds the job and calls the entry);
3. its entry, `run(job)` in the stage's module, which takes one `latentstrat.jobs.Job`.

Everything else reads this table: the benchmark files the status command sizes requests from
(`paths.BENCH_RULES`), the log and benchmark folders (`paths.CELL_JOB_FOLDER`), the status
command's stage columns and Slurm rules, a cell's cost parts in the follow-up, and the job a
corrupt output's folder names (`io.PRODUCERS`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

# how often a stage runs: once per base; once per model as built (cells.init_id: the two arms of
# a pair share it); once per cell; once per collection
LEVELS = ("base", "init", "cell", "collection")


@dataclass(frozen=True)
class Stage:
    name: str  # its Snakemake rule and rule file (workflow/rules/<name>.smk)
    level: str  # one of LEVELS
    folder: str  # the folder its outputs are in: under the base, a cell's work or the collection
    job_folder: str  # its per-job logs and benchmarks (logs/<job_folder>/<key>.log) at init and cell level
    entry: str  # "module:function" running one job (a latentstrat.jobs.Job)
    # a cell stage's wall time as a share of its train job's, for the collection's ETA until a job
    # of the stage has been measured (the default collection on a CPU: evaluate 28 s, probes 14 s,
    # tabulate 1.3 s per 571 s of train)
    share_of_train: float | None = None
    done_word: str = ""  # a cell stage's progress word in the status summary (`trained 4/58`)


STAGES = (
    Stage("data", "base", "data", "data", "latentstrat.base.data:run"),
    Stage("entangle", "base", "entangle", "entangle", "latentstrat.base.entangle:run"),
    Stage("reference", "base", "reference", "reference", "latentstrat.base.reference:run"),
    Stage("step0", "init", "step0", "step0", "latentstrat.cell.step0:run"),
    Stage("train", "cell", "train", "train", "latentstrat.cell.train:run", 1.0, "trained"),
    Stage("evaluate", "cell", "evaluate", "evaluate", "latentstrat.cell.evaluate:run", 0.05, "evaluated"),
    Stage("probes", "cell", "probes", "probe", "latentstrat.cell.probes:run", 0.025, "probed"),
    Stage("tabulate", "cell", "cells", "tabulate", "latentstrat.cell.tabulate:run", 0.003, "tabulated"),
    Stage("aggregate", "collection", "aggregate", "aggregate", "latentstrat.aggregate.collection:run"),
    Stage("report", "collection", "report", "report", "latentstrat.report:run"),
)
BY_NAME = {s.name: s for s in STAGES}


def names(*levels: str) -> tuple[str, ...]:
    """The stages of these levels (every stage without any), in pipeline order."""
    unknown = set(levels) - set(LEVELS)
    if unknown:
        raise ValueError(f"unknown stage level(s) {sorted(unknown)} (levels: {', '.join(LEVELS)})")
    return tuple(s.name for s in STAGES if not levels or s.level in levels)


def entry(name: str):
    """The function that runs one job of stage `name`."""
    if name not in BY_NAME:
        raise KeyError(f"no stage {name!r} is declared (latentstrat.stages: {', '.join(BY_NAME)})")
    module, function = BY_NAME[name].entry.split(":")
    return getattr(importlib.import_module(module), function)
