"""Helpers shared by test modules (test modules never import each other): a copy of the
workflow to run Snakemake in, dry-run parsing, and the shrunk smoke config of the entangle tests."""

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

from latentstrat.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def smoke_cfg(**entangle):
    """config/smoke.yaml shrunk for the entangle tests (tiny splits, a 3-step entangle stage)."""
    over = {
        "data": {"train_per_task": 6, "validation_per_task": 3, "test_per_task": 3},
        "entangle": {"steps": 3, "batch_size": 8, "warmup_steps": 1, "quality_samples_per_task": 2, **entangle},
    }
    return load_config(ROOT / "config" / "smoke.yaml", overrides=over)


def tiny_collection(wd: Path, name: str, grid: dict, test_per_task: int = 3, **sections) -> Path:
    """config/<name>.yaml in the copied workflow `wd`: smoke.yaml on two tasks with tiny splits,
    a 3-step entangle stage and 2-step cells over `grid`, results under wd/results; `sections`
    are further top-level keys (comparison_arms defaults to none). Returns its path."""
    raw = {
        "extends": "smoke.yaml",
        "collection": name,
        "results_dir": str(wd / "results"),
        "data": {
            "tasks": ["grid_pathfinding", "multidigit_addition"],
            "train_per_task": 6,
            "validation_per_task": 3,
            "test_per_task": test_per_task,
        },
        "evaluate": {"max_new_tokens": 32},
        "entangle": {"steps": 3, "batch_size": 8, "warmup_steps": 1, "quality_samples_per_task": 2},
        "train": {"steps": 2, "eval_every": 2, "checkpoint_every": 2},
        "grid": grid,
        "comparison_arms": [],
        **sections,
    }
    path = wd / "config" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def copy_workflow(dst: Path) -> Path:
    shutil.copy(ROOT / "Snakefile", dst / "Snakefile")
    shutil.copytree(ROOT / "workflow", dst / "workflow", symlinks=False)
    shutil.copytree(ROOT / "config", dst / "config")
    shutil.copytree(ROOT / "envs", dst / "envs")
    shutil.copytree(ROOT / "resources", dst / "resources")  # the shipped bases
    for link in ("profiles", "slurm"):  # as in the repository: the workflow profile and `--profile slurm`
        (dst / link).symlink_to(ROOT.joinpath(link).readlink())
    src = dst / "src" / "latentstrat"
    (src / "report").mkdir(parents=True)
    (src / "aggregate").mkdir()
    for f in (ROOT / "src" / "latentstrat" / "aggregate").glob("*.py"):
        shutil.copy(f, src / "aggregate" / f.name)
    if (ROOT / "src" / "latentstrat" / "metrics.py").exists():
        shutil.copy(ROOT / "src" / "latentstrat" / "metrics.py", src / "metrics.py")
    for f in (ROOT / "src" / "latentstrat" / "report").glob("*.py"):
        shutil.copy(f, src / "report" / f.name)
    (src / "report" / "__init__.py").touch()
    return dst


def snakemake(wd: Path, *args, config=(), configfile="config/smoke.yaml", timeout=300):
    cmd = [SNAKEMAKE, "--configfile", configfile, "--config", f"results_dir={wd / 'results'}", *config, *args]
    return subprocess.run(cmd, cwd=wd, capture_output=True, text=True, timeout=timeout)


def dry_run(wd: Path, *args, config=(), configfile="config/smoke.yaml"):
    """(returncode, [(rule, cell, task)], output) of `snakemake -n`."""
    r = snakemake(wd, "-n", *args, config=config, configfile=configfile)
    out = r.stdout + r.stderr
    jobs, rule = [], None
    for line in out.splitlines():
        m = re.match(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):$", line)
        if m:
            rule = m[1]
            jobs.append((rule, None, None))
            continue
        m = re.match(r"^\s+wildcards: (.*)$", line)
        if m and rule:
            wc = dict(kv.split("=", 1) for kv in m[1].split(", "))
            jobs[-1] = (rule, wc.get("cell"), wc.get("task"))
    return r.returncode, jobs, out


def outputs_of(out: str) -> list[str]:
    files = []
    for line in out.splitlines():
        m = re.match(r"^\s+output: (.*)$", line)
        if m:
            files += m[1].split(", ")
    return files


def rules(jobs):
    return Counter(j[0] for j in jobs)
