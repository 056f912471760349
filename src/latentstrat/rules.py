"""What the workflow's rule files ask of the package beyond a stage's job: the lines a run starts
with (`start_message`), that each rule writes where the stages' declarations lay it out
(`layout_problem`), each job's Slurm resources (`job_resources`), the package sources the
collection rules read (`code_files`), and a quiet dry run beside a running collection
(`NoLockNotice`)."""

from __future__ import annotations

import logging
from pathlib import Path

from latentstrat.config import describe, tokenizer_identity
from latentstrat.paths import Paths
from latentstrat.stages import BY_NAME, EVERY_SECTION, STAGES
from latentstrat.status import start_line

WILDCARD = {"init": "{init}", "cell": "{cell}"}  # a job's key in the rules' path templates


def layout_problem(paths: Paths, declared: dict, mode: str, tasks) -> str | None:
    """Why the rules do not write where the package reads, or None. `declared`: rule name ->
    (its outputs {name: path}, or {index: path} for unnamed ones; its log; its benchmark). A
    rule that moves a file alone is named with the file and both paths, before any job runs."""
    for stage in STAGES:
        if stage.name not in declared:
            return f"stage {stage.name} is declared (latentstrat.stages) but no rule {stage.name} is"
        outputs, log, benchmark = declared[stage.name]
        key = WILDCARD.get(stage.level, "")
        want = paths.stage_files(stage.name, key, mode, tasks)
        if outputs and all(isinstance(k, int) for k in outputs):
            want = dict(enumerate(want.values()))
        have = {**{k: str(v) for k, v in outputs.items()}, "log": str(log), "benchmark": str(benchmark)}
        want = {
            **want,
            "log": str(paths.log_path(stage.name, key)),
            "benchmark": str(paths.bench_path(stage.name, key)),
        }
        for name in sorted(set(have) | set(want), key=str):
            if have.get(name) != want.get(name):
                return (
                    f"rule {stage.name} (workflow/rules/{stage.name}.smk): its {name} is {have.get(name)!r} but "
                    f"latentstrat.paths lays it out as {want.get(name)!r}; edit both together"
                )
    return None


def job_resources(res: dict, kind: str, mem_mb: int, runtime: int) -> dict:
    """A job's Slurm partition / account / qos / constraint (and GPUs, GPU model, or a generic
    resource such as a GPU shard) from `resources.slurm.<kind>` (else `resources.slurm_partition`
    / `slurm_account`); memory and runtime grow with each retry."""
    s = res["slurm"][kind]
    out = {
        "slurm_partition": s["partition"] or res["slurm_partition"],
        "slurm_account": s["account"] or res["slurm_account"],
        "qos": s["qos"],
        "constraint": s["constraint"],
    }
    out = {k: v for k, v in out.items() if v}
    if kind == "gpu" and s.get("gres"):  # a share of a GPU (e.g. shard:1): several cells per GPU
        out["gres"] = s["gres"]
    elif kind == "gpu":
        out["gpu"] = res["gpu"]
        if s.get("gpu_model"):
            out["gpu_model"] = s["gpu_model"]
    out["mem_mb"] = lambda wildcards, attempt: mem_mb * attempt
    out["runtime"] = lambda wildcards, attempt: runtime * attempt
    return out


class NoLockNotice(logging.Filter):
    """`--nolock` (a dry run beside a running collection): Snakemake 9 still prints its lock
    notice in a dry run ("Error: Directory cannot be locked": its warn-only locking overrides
    --nolock); the user asked for no lock, so the notice is dropped. `settings()` returns the
    workflow's execution settings, which reach it after the rule files are read."""

    def __init__(self, settings):
        super().__init__()
        self.settings = settings

    def filter(self, record):
        s = self.settings()
        nolock = s is not None and not s.lock
        return not (nolock and "Directory cannot be locked" in record.getMessage())


def parallel_cell_jobs(workflow, threads: int) -> int | None:
    """The cell jobs a run runs at once: --cores over a cell job's threads locally, --jobs on a
    cluster (None where Snakemake does not say)."""
    try:
        return (workflow._cores or 0) // max(threads, 1) if workflow.local_exec else workflow.nodes
    except (TypeError, ValueError, AttributeError):
        return None


def start_message(cfg: dict, parallel: int | None, main: bool = True, configfile: str = "config/config.yaml") -> str:
    """What a run prints first: the collection, its cells and arms (config.describe), the data
    stage's tokenizer, the entangled model, and in the run's main process the cells left with
    their time at `parallel` cell jobs at once (None: unknown)."""
    first, *arms = describe(cfg)
    lines = [f"{first}; data stage tokenizer: {tokenizer_identity(cfg['backbone'])}; entangled model: "
             f"{cfg['entangle']['mode']}", *arms]  # fmt: skip
    return "\n".join(lines + ([start_line(cfg, parallel, configfile)] if main else []))


def stage_settings(cfg: dict, stage: str) -> dict:
    """The config sections a stage's jobs read (its declaration's `sections`), as its rule
    passes them: Snakemake's `params` rerun trigger then reruns a job only when those change."""
    names = BY_NAME[stage].sections
    return dict(cfg) if names == EVERY_SECTION else {k: cfg[k] for k in names}


def archived(paths: Paths, cells: list) -> dict:
    """The archived cells (latentstrat.archive.archived_cells); a bad archive stops the workflow
    before any job, with the archive's message."""
    from snakemake.exceptions import WorkflowError

    from latentstrat.archive import ArchiveError, archived_cells

    try:
        return archived_cells(paths, cells)
    except ArchiveError as e:
        raise WorkflowError(str(e)) from None


def final_targets(paths: Paths, cells: dict, mode: str, tasks, archived: dict) -> list[str]:
    """Every output of every stage's jobs (rule all's input) but those of the archived cells
    (latentstrat.archive: their jobs are not in the DAG) and of the step-0 validations only archived
    cells start from. Snakemake checks missing outputs only for target jobs, so a deleted cell file
    reruns its job and what reads it, nothing else."""
    from latentstrat.cells import init_id

    live = [cid for cid in cells if cid not in archived]
    keys = {"init": sorted({init_id(cells[cid].settings) for cid in live}), "cell": live}
    return [f for s in STAGES for f in paths.job_files(s.name, keys.get(s.level, []), mode, tasks)]


def cell_file_list(paths: Paths, cells, archived: dict, name: str) -> list[str]:
    """The aggregate's input `name` (row, bootstrap, history) of every cell, in the collection's
    order: an archived cell's from the archive, any other's from its stage's output."""
    from latentstrat.archive import source_files

    return [archived[c][name] if c in archived else str(source_files(paths, c)[name]) for c in cells]


def code_files(repository: str | Path, *relpaths: str) -> list[str]:
    """Existing package sources under src/latentstrat (files, or folders of *.py): inputs of
    the aggregate and report rules only, so editing them reruns those and never trains."""
    src = Path(repository) / "src" / "latentstrat"
    out = []
    for rel in relpaths:
        p = src / rel
        out += [str(f) for f in sorted(p.glob("*.py"))] if p.is_dir() else ([str(p)] if p.exists() else [])
    return out
