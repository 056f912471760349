"""Where every stage reads and writes: the results layout, the file names inside each stage's
folder, and the work key that lets collections share a cell's work."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from latentstrat.stages import STAGES
from latentstrat.stages import names as stage_names

# Config sections that, with a cell's own settings and the base, decide what its train,
# evaluate and probe jobs compute. Collections on one base whose sections agree share those
# outputs: a follow-up collection that repeats a cell reuses it instead of retraining it.
WORK_KEY_SECTIONS = ("lora", "train", "evaluate", "probes")


# how a cell's training is run, not what it computes: left out of the work key
RUN_ONLY_TRAIN_KEYS = ("gradient_checkpointing", "compile")

# the folder of a per-cell (or per-init) job's log and benchmark, by rule
CELL_JOB_FOLDER = {s.name: s.job_folder for s in STAGES if s.level in ("init", "cell")}
# every rule that writes a benchmark file, in pipeline order
BENCH_RULES = stage_names()


def work_key(cfg: dict) -> str:
    """`w` + 10 hex digits of the hash of WORK_KEY_SECTIONS (validated, defaults filled)."""
    work = {k: cfg[k] for k in WORK_KEY_SECTIONS}
    work["train"] = {k: v for k, v in work["train"].items() if k not in RUN_ONLY_TRAIN_KEYS}
    blob = json.dumps(work, sort_keys=True, default=str)
    return "w" + hashlib.sha256(blob.encode()).hexdigest()[:10]


# The file names inside a stage's folder: Paths joins them for the rules and the status
# command, and the stages write and read them by these names.
# the data stage: one parquet per split (encoding.SPLITS), the tokenizer and what the data stage
# added to it, the data card, and the settings the base was built with (its guard)
DATA_FILES = {
    "train": "train.parquet",
    "validation": "validation.parquet",
    "test": "test.parquet",
    "tokenizer": "tokenizer.json",
    "tokenizer_info": "tokenizer_info.json",
}
DATA_CARD_FILE = "data_card.parquet"
BASE_CONFIG_FILE = "base_config.json"
ENTANGLE_FILES = {"quality": "quality.json", "entangle_history": "history.parquet"}


# with entangle.mode shipped, the reference table shipped with the base, installed beside the model
SHIPPED_REFERENCE_FILE = "reference_tokens.parquet"


REFERENCE_FILES = {"tokens": "tokens.parquet", "scales": "scales.json", "token_counts": "token_counts.parquet"}


STEP0_FILES = {"passes": "passes.parquet", "measured": "measured.json"}


# a trained cell (model.LatentStrategyModel.save_trained): the heads, written last, mark it
# complete; beside them its peft adapters (adapters/<name>/) or full copies (backbones/<name>/)
TRAIN_FILES = {
    "heads": "heads/heads.safetensors",
    "heads_config": "heads/config.json",
    "history": "history.parquet",
    "summary": "summary.json",
}
# beside them while the cell trains: its step, total and ETA (progress.Progress), read by status
PROGRESS_FILE = "progress.json"


@dataclass(frozen=True)
class BaseFolders:
    """The folders of the base stages a model job reads: the data stage's, the entangle stage's
    (the entangled model in model/; with `entangle.mode: skip` only its quality record) and the
    reference stage's (None for the jobs that run before it or do not read it)."""

    data: Path
    entangle: Path
    reference: Path | None = None

    def __post_init__(self):
        for name in ("data", "entangle", "reference"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))


@dataclass(frozen=True)
class Paths:
    """Where every stage reads and writes: the one place for the layout and the file names.
    The workflow's rules take their inputs and outputs from here, the status command its
    outputs to look for."""

    results: Path
    collection: str
    base: str
    work_key: str  # work_key(cfg): where this config's cells' work lives

    @classmethod
    def from_config(cls, cfg: dict) -> "Paths":
        return cls(Path(cfg["results_dir"]), cfg["collection"], cfg["base"], work_key(cfg))

    # base-level (shared by collections with the same `base`)
    @property
    def base_dir(self) -> Path:
        return self.results / "base" / self.base

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def base_config(self) -> Path:
        return self.data_dir / BASE_CONFIG_FILE

    @property
    def data_card(self) -> Path:
        return self.data_dir / DATA_CARD_FILE

    @property
    def entangle_dir(self) -> Path:
        return self.base_dir / "entangle"

    @property
    def reference_dir(self) -> Path:
        return self.base_dir / "reference"

    @property
    def base_logs_dir(self) -> Path:
        return self.base_dir / "logs"

    @property
    def base_bench_dir(self) -> Path:
        return self.base_dir / "benchmarks"

    @property
    def base_folders(self) -> BaseFolders:
        return BaseFolders(self.data_dir, self.entangle_dir, self.reference_dir)

    def data_files(self) -> dict[str, str]:
        return {k: str(self.data_dir / name) for k, name in DATA_FILES.items()}

    def entangle_files(self, mode: str = "train") -> dict[str, str]:
        """The entangle stage's outputs; with `entangle.mode: skip` (cells with init: direct use
        the backbone as is) only the quality record and an empty history."""
        d = self.entangle_dir
        files = {k: str(d / name) for k, name in ENTANGLE_FILES.items()}
        if mode != "skip":
            files.update(
                entangle_config=str(d / "model" / "config.json"),
                entangle_weights=str(d / "model" / "model.safetensors"),
            )
        if mode == "shipped":
            files["shipped_reference"] = str(d / SHIPPED_REFERENCE_FILE)
        return files

    def entangled_model_files(self, mode: str = "train") -> dict[str, str]:
        """The entangle outputs a model job reads: the model's config and weights (and with
        `entangle.mode: shipped` the reference table shipped with it); with `skip`, the quality
        record that stands for the backbone used as is. Never the quality record of a trained or
        installed model, whose timings differ on every run: re-creating the same model must not
        rerun the jobs downstream of it (docs/rerun-policy.md)."""
        files = self.entangle_files(mode)
        keep = ("quality",) if mode == "skip" else ("entangle_config", "entangle_weights", "shipped_reference")
        return {k: v for k, v in files.items() if k in keep}

    def reference_files(self) -> dict[str, str]:
        return {k: str(self.reference_dir / name) for k, name in REFERENCE_FILES.items()}

    # a cell's work (train, evaluate, probes): shared by collections with the same base and
    # WORK_KEY_SECTIONS, keyed by the cell id (its settings)
    def cell_dir(self, cid: str) -> Path:
        return self.base_dir / "cells" / self.work_key / cid

    def train_dir(self, cid: str) -> Path:
        return self.cell_dir(cid) / "train"

    # the step-0 validation shared by the cells that start from one model (cells.init_id: the two
    # arms of a pair)
    def step0_dir(self, iid: str) -> Path:
        return self.base_dir / "step0" / self.work_key / iid

    def step0_files(self, iid: str) -> dict[str, str]:
        return {k: str(self.step0_dir(iid) / name) for k, name in STEP0_FILES.items()}

    def train_files(self, cid: str) -> dict[str, str]:
        return {k: str(self.train_dir(cid) / name) for k, name in TRAIN_FILES.items()}

    def progress_path(self, cid: str) -> Path:
        return self.train_dir(cid) / PROGRESS_FILE

    def trained_weight_files(self, cid: str) -> list[Path]:
        """The trained cell's adapter or backbone weights that exist (beside the heads)."""
        d = self.train_dir(cid)
        return sorted([*d.glob("adapters/*/adapter_model.safetensors"), *d.glob("backbones/*/model.safetensors")])

    def records_path(self, cid: str) -> Path:
        return self.cell_dir(cid) / "evaluate" / "records.parquet"

    def probe_path(self, cid: str, task: str) -> Path:
        return self.cell_dir(cid) / "probes" / f"{task}.parquet"

    def probe_files(self, cid: str, tasks) -> list[str]:
        """Per-task probes, then the global one."""
        return [str(self.probe_path(cid, t)) for t in [*tasks, "global"]]

    # collection-level: the cell's row in this collection (its arm and role), tables, report
    @property
    def collection_dir(self) -> Path:
        return self.results / self.collection

    def row_path(self, cid: str) -> Path:
        return self.collection_dir / "cells" / cid / "row.parquet"

    def bootstrap_path(self, cid: str) -> Path:
        return self.collection_dir / "cells" / cid / "bootstrap.parquet"

    @property
    def logs_dir(self) -> Path:
        return self.collection_dir / "logs"

    @property
    def bench_dir(self) -> Path:
        return self.collection_dir / "benchmarks"

    def log_path(self, stage: str, cid: str) -> Path:
        """A cell stage's job log (`cid` may be a wildcard, "{cell}")."""
        return self.logs_dir / CELL_JOB_FOLDER[stage] / f"{cid}.log"

    def bench_path(self, rule: str, key: str = "") -> Path:
        """The Snakemake benchmark file of one job of `rule` (BENCH_RULES): the base stages' in
        the base folder, the collection's one per collection, the others one per cell (`key`:
        the cell id) or per step-0 init; `key` may be a wildcard ("{cell}") or a glob ("*")."""
        if rule in stage_names("base"):
            return self.base_bench_dir / f"{rule}.tsv"
        if rule in stage_names("collection"):
            return self.bench_dir / f"{rule}.tsv"
        return self.bench_dir / CELL_JOB_FOLDER[rule] / f"{key}.tsv"

    @property
    def aggregate_dir(self) -> Path:
        return self.collection_dir / "aggregate"

    @property
    def aggregate_marker(self) -> Path:
        return self.aggregate_dir / "collection_state.parquet"

    @property
    def report_dir(self) -> Path:
        return self.collection_dir / "report"

    def report_files(self) -> dict[str, str]:
        d = self.report_dir
        return {
            "results": str(d / "results.md"),
            "analysis": str(d / "analysis.md"),
            "brief": str(d / "brief.yaml"),
            "findings": str(d / "findings.json"),
            # for `snakemake --report` (report.html): the landing page and the figures' captions
            "landing": str(d / "landing.rst"),
            "captions": str(d / "captions.rst"),
        }
