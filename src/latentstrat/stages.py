"""The pipeline's stages, declared once: the rule that runs each, how often it runs (once per
base, per model as built, per cell, per collection), its folder and the files in it, the folder
of its per-job logs and benchmarks, and the function that runs one of its jobs.

Adding a stage touches three places (docs/architecture.md, "Adding a stage"):

1. its declaration here (the Snakefile includes `workflow/rules/<name>.smk` for every declared
   stage, in this order);
2. its rule file, `workflow/rules/<name>.smk`: inputs, outputs, log, benchmark, params, and
   `script: "../scripts/stage.py"` (the one rule script: it builds the job and calls the entry);
3. its entry, `run(job)` in the stage's module, which takes one `latentstrat.jobs.Job`.

Everything else reads this table: the layout (`paths.Paths`: every file the rules write, held
equal to the rule files when the workflow loads), the workflow's final targets and the base
stages a lost base brings back, the benchmark files the status command sizes requests from
(`paths.BENCH_RULES`), the log and benchmark folders (`paths.CELL_JOB_FOLDER`), the status
command's stage columns, outputs and Slurm rules, a cell's cost parts in the follow-up, and the
job a corrupt output's folder names (`io.PRODUCERS`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

# how often a stage runs: once per base; once per model as built (cells.init_id: the two arms of
# a pair share it); once per cell; once per collection
LEVELS = ("base", "init", "cell", "collection")


# where a stage's folder is: under the base (results/base/<base>/, shared by the collections on
# it) or under the collection (results/<collection>/)
ANCHORS = ("base", "collection")
GLOBAL = "global"  # the probes' table over every task, beside one per task ({task} files)


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline. Its folder is `layout` under its anchor, where `{work}` is the
    work key (paths.work_key) and `{key}` the cell id or init id of one job; `files` names each
    output inside the folder (a name ending in "/" is a folder; `{task}` is one file per task and
    the global one); `only` names the files that exist only in some `entangle.mode`s."""

    name: str  # its Snakemake rule and rule file (workflow/rules/<name>.smk)
    level: str  # one of LEVELS
    layout: str  # its folder under the anchor, e.g. "cells/{work}/{key}/train"
    files: dict[str, str]  # output name -> path inside the folder
    job_folder: str  # its per-job logs and benchmarks (logs/<job_folder>/<key>.log) at init and cell level
    entry: str  # "module:function" running one job (a latentstrat.jobs.Job)
    anchor: str = "base"  # one of ANCHORS
    reads: tuple[str, ...] = ()  # the base stages whose outputs a base stage's job reads
    sections: tuple[str, ...] = ()  # the config sections its jobs read (EVERY_SECTION: all of them)
    # sections its jobs read beyond their params, from the workflow's config (EVERY_SECTION: all
    # of them), each for a reason its declaration gives: a change there reaches the job another
    # way, or must not rerun it
    also_reads: tuple[str, ...] = ()
    only: dict[str, tuple[str, ...]] = field(default_factory=dict)  # file -> the entangle modes it exists in
    # a cell stage's wall time as a share of its train job's, for the collection's ETA until a job
    # of the stage has been measured (the default collection on a CPU: evaluate 28 s, probes 14 s,
    # tabulate 1.3 s per 571 s of train)
    share_of_train: float | None = None
    done_word: str = ""  # a cell stage's progress word in the status summary (`trained 4/58`)

    def __post_init__(self):
        assert self.level in LEVELS and self.anchor in ANCHORS and set(self.only) <= set(self.files), self

    @property
    def folder(self) -> str:
        """The stage folder's own name (the last part of its layout that is not a key): what a
        file's path says about the job that wrote it (io.producer)."""
        return [part for part in self.layout.split("/") if "{" not in part][-1]

    def outputs(self, mode: str = "train", tasks=()) -> dict[str, str]:
        """Output name -> path inside the folder, for an entangle mode and the collection's tasks."""
        out = {}
        for name, path in self.files.items():
            if name in self.only and mode not in self.only[name]:
                continue
            if "{task}" in name:
                out.update({name.format(task=t): path.format(task=t) for t in [*tasks, GLOBAL]})
            else:
                out[name] = path
        return out


MODEL = ("train", "shipped")  # the entangle modes that have an entangled model
# the config sections the stages read: a base names no collection, so collections on one base
# share its jobs; a cell's work likewise (the lora, train, evaluate and probes sections)
BASE_SECTIONS = ("base", "data", "backbone", "entangle")
TRAIN_SECTIONS = (*BASE_SECTIONS, "lora", "train")
EVERY_SECTION = ("*",)
STAGES = (
    Stage(
        "data",
        "base",
        "data",
        {
            "train": "train.parquet",
            "validation": "validation.parquet",
            "test": "test.parquet",
            "tokenizer": "tokenizer.json",
            "tokenizer_info": "tokenizer_info.json",
            "card": "data_card.parquet",
            "base_config": "base_config.json",
        },
        "data",
        "latentstrat.base.data:run",
        sections=BASE_SECTIONS,
    ),
    Stage(
        "entangle",
        "base",
        "entangle",
        {
            "quality": "quality.json",
            "entangle_history": "history.parquet",
            "entangle_config": "model/config.json",
            "entangle_weights": "model/model.safetensors",
            "shipped_reference": "reference_tokens.parquet",
        },
        "entangle",
        "latentstrat.base.entangle:run",
        reads=("data",),
        sections=BASE_SECTIONS,
        only={"entangle_config": MODEL, "entangle_weights": MODEL, "shipped_reference": ("shipped",)},
    ),
    Stage(
        "reference",
        "base",
        "reference",
        {"tokens": "tokens.parquet", "scales": "scales.json", "token_counts": "token_counts.parquet"},
        "reference",
        "latentstrat.base.reference:run",
        reads=("data", "entangle"),
        sections=BASE_SECTIONS,
        # T_ref at the tokcc exponents of the collection's cells (cells.tokcc_alphas): not a
        # param, so the collections on one base share the reference
        also_reads=EVERY_SECTION,
    ),
    Stage(
        "step0",
        "init",
        "step0/{work}/{key}",
        {"passes": "passes.parquet", "measured": "measured.json"},
        "step0",
        "latentstrat.cell.step0:run",
        reads=("data", "entangle"),
        sections=(*TRAIN_SECTIONS, "evaluate", "probes"),
    ),
    Stage(
        "train",
        "cell",
        "cells/{work}/{key}/train",
        {
            "heads": "heads/heads.safetensors",
            "heads_config": "heads/config.json",
            "history": "history.parquet",
            "summary": "summary.json",
        },
        "train",
        "latentstrat.cell.train:run",
        sections=TRAIN_SECTIONS,
        # validates with the `evaluate` and `probes` settings its step-0 input records (and the
        # work key, paths.work_key, names its folder by them)
        also_reads=("evaluate", "probes"),
        share_of_train=1.0,
        done_word="trained",
    ),
    Stage(
        "evaluate",
        "cell",
        "cells/{work}/{key}/evaluate",
        {"records": "records.parquet"},
        "evaluate",
        "latentstrat.cell.evaluate:run",
        sections=(*TRAIN_SECTIONS, "evaluate"),
        share_of_train=0.05,
        done_word="evaluated",
    ),
    Stage(
        "probes",
        "cell",
        "cells/{work}/{key}/probes",
        {"{task}": "{task}.parquet"},
        "probe",
        "latentstrat.cell.probes:run",
        sections=("probes",),
        share_of_train=0.025,
        done_word="probed",
    ),
    Stage(
        "tabulate",
        "cell",
        "cells/{key}",
        {"row": "row.parquet", "bootstrap": "bootstrap.parquet"},
        "tabulate",
        "latentstrat.cell.tabulate:run",
        sections=("probes",),
        anchor="collection",
        share_of_train=0.003,
        done_word="tabulated",
    ),
    Stage(
        "aggregate",
        "collection",
        "aggregate",
        {"tables": "./"},
        "aggregate",
        "latentstrat.aggregate.collection:run",
        sections=EVERY_SECTION,
        anchor="collection",
    ),
    Stage(
        "report",
        "collection",
        "report",
        {
            "results": "results.md",
            "analysis": "analysis.md",
            "brief": "brief.yaml",
            "findings": "findings.json",
            # for `snakemake --report` (report.html): the landing page, the figures' captions and pages
            "landing": "landing.rst",
            "captions": "captions.rst",
            "figures": "figures/",
            "figure_pages": "figure_pages/",
            "pages": "html/",
        },
        "report",
        "latentstrat.report:run",
        anchor="collection",
    ),
)
BY_NAME = {s.name: s for s in STAGES}


def names(*levels: str) -> tuple[str, ...]:
    """The stages of these levels (every stage without any), in pipeline order."""
    unknown = set(levels) - set(LEVELS)
    if unknown:
        raise ValueError(f"unknown stage level(s) {sorted(unknown)} (levels: {', '.join(LEVELS)})")
    return tuple(s.name for s in STAGES if not levels or s.level in levels)


BASE_STAGES = names("base", "init")  # the base stages, step0 among them (once per init)
CELL_STAGES = names("cell")


def entry(name: str):
    """The function that runs one job of stage `name`."""
    if name not in BY_NAME:
        raise KeyError(f"no stage {name!r} is declared (latentstrat.stages: {', '.join(BY_NAME)})")
    module, function = BY_NAME[name].entry.split(":")
    return getattr(importlib.import_module(module), function)
