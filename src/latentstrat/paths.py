"""Where every stage reads and writes: the results layout, the file names inside each stage's
folder, and the work key that lets collections share a cell's work."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from latentstrat.stages import BY_NAME, STAGES
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


# The file names inside a stage's folder, as its declaration (latentstrat.stages) names them:
# the stages write and read them by these names.
DATA_FILES = BY_NAME["data"].files
ENTANGLE_FILES = BY_NAME["entangle"].files
REFERENCE_FILES = BY_NAME["reference"].files
STEP0_FILES = BY_NAME["step0"].files
# a trained cell (model.LatentStrategyModel.save_trained): the heads, written last, mark it
# complete; beside them its peft adapters (adapters/<name>/) or full copies (backbones/<name>/)
TRAIN_FILES = BY_NAME["train"].files
SHIPPED_REFERENCE_FILE = ENTANGLE_FILES["shipped_reference"]
# the entangle stage's records, written in every `entangle.mode` (its quality and history)
ENTANGLE_RECORDS = {k: v for k, v in ENTANGLE_FILES.items() if k not in BY_NAME["entangle"].only}
# what a model job reads of the data stage (not the data card, not the base's guard)
MODEL_DATA = ("train", "validation", "test", "tokenizer", "tokenizer_info")
# beside a training cell's outputs: its step, total and ETA (progress.Progress), read by status
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

    def stage_dir(self, stage: str, key: str = "") -> Path:
        """A stage's folder (its declaration's layout under its anchor); `key`: the cell or init
        id of one job, or a wildcard ("{cell}")."""
        s = BY_NAME[stage]
        anchor = self.base_dir if s.anchor == "base" else self.collection_dir
        return anchor / s.layout.format(work=self.work_key, key=key)

    def stage_files(self, stage: str, key: str = "", mode: str = "train", tasks=()) -> dict[str, str]:
        """Output name -> path of one job of a stage (folders without a trailing slash)."""
        d = self.stage_dir(stage, key)
        return {name: str(d / rel) for name, rel in BY_NAME[stage].outputs(mode, tasks).items()}

    # base-level (shared by collections with the same `base`)
    @property
    def base_dir(self) -> Path:
        return self.results / "base" / self.base

    @property
    def data_dir(self) -> Path:
        return self.stage_dir("data")

    @property
    def base_config(self) -> Path:
        return Path(self.stage_files("data")["base_config"])

    @property
    def data_card(self) -> Path:
        return Path(self.stage_files("data")["card"])

    @property
    def entangle_dir(self) -> Path:
        return self.stage_dir("entangle")

    @property
    def reference_dir(self) -> Path:
        return self.stage_dir("reference")

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
        """The data a model job reads (MODEL_DATA)."""
        return {k: v for k, v in self.stage_files("data").items() if k in MODEL_DATA}

    def entangle_files(self, mode: str = "train") -> dict[str, str]:
        """The entangle stage's outputs; with `entangle.mode: skip` (cells with init: direct use
        the backbone as is) only the quality record and an empty history."""
        return self.stage_files("entangle", mode=mode)

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
        return self.stage_files("reference")

    # a cell's work (train, evaluate, probes): shared by collections with the same base and
    # WORK_KEY_SECTIONS, keyed by the cell id (its settings)
    def cell_dir(self, cid: str) -> Path:
        return self.stage_dir("train", cid).parent

    def train_dir(self, cid: str) -> Path:
        return self.stage_dir("train", cid)

    # the step-0 validation shared by the cells that start from one model (cells.init_id: the two
    # arms of a pair)
    def step0_dir(self, iid: str) -> Path:
        return self.stage_dir("step0", iid)

    def step0_files(self, iid: str) -> dict[str, str]:
        return self.stage_files("step0", iid)

    def train_files(self, cid: str) -> dict[str, str]:
        return self.stage_files("train", cid)

    def progress_path(self, cid: str) -> Path:
        return self.train_dir(cid) / PROGRESS_FILE

    def trained_weight_files(self, cid: str) -> list[Path]:
        """The trained cell's adapter or backbone weights that exist (beside the heads)."""
        d = self.train_dir(cid)
        return sorted([*d.glob("adapters/*/adapter_model.safetensors"), *d.glob("backbones/*/model.safetensors")])

    def records_path(self, cid: str) -> Path:
        return Path(self.stage_files("evaluate", cid)["records"])

    def probe_files(self, cid: str, tasks) -> list[str]:
        """Per-task probes, then the global one."""
        return list(self.stage_files("probes", cid, tasks=tasks).values())

    # collection-level: the cell's row in this collection (its arm and role), tables, report
    @property
    def collection_dir(self) -> Path:
        return self.results / self.collection

    def row_path(self, cid: str) -> Path:
        return Path(self.stage_files("tabulate", cid)["row"])

    def bootstrap_path(self, cid: str) -> Path:
        return Path(self.stage_files("tabulate", cid)["bootstrap"])

    @property
    def logs_dir(self) -> Path:
        return self.collection_dir / "logs"

    @property
    def bench_dir(self) -> Path:
        return self.collection_dir / "benchmarks"

    def log_path(self, stage: str, key: str = "") -> Path:
        """A job's log: the base stages' in the base folder, the collection's one per collection,
        the others one per cell or init (`key` may be a wildcard, "{cell}")."""
        level = BY_NAME[stage].level
        if level == "base":
            return self.base_logs_dir / f"{stage}.log"
        if level == "collection":
            return self.logs_dir / f"{stage}.log"
        return self.logs_dir / CELL_JOB_FOLDER[stage] / f"{key}.log"

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
        return self.stage_dir("aggregate")

    @property
    def aggregate_marker(self) -> Path:
        return self.aggregate_dir / "collection_state.parquet"

    @property
    def report_dir(self) -> Path:
        return self.stage_dir("report")

    def report_files(self) -> dict[str, str]:
        """The report's files (not its folders of figures and pages)."""
        return {k: v for k, v in self.stage_files("report").items() if not BY_NAME["report"].files[k].endswith("/")}

    def job_files(self, stage: str, keys, mode: str, tasks) -> list[str]:
        """Every output of a stage's jobs: one job per key at init and cell level (`keys`: the
        init ids or cell ids), one job otherwise."""
        level = BY_NAME[stage].level
        return [
            f
            for k in (keys if level in ("init", "cell") else [""])
            for f in self.stage_files(stage, k, mode, tasks).values()
        ]
