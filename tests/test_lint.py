"""The code passes ruff (pyproject.toml: line length 120, pycodestyle, pyflakes, import order, at
most 8 parameters a function, McCabe complexity at most 10) and the workflow passes `snakefmt --check`."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed (it is in the test extras: pip install -e '.[test]')")
    r = subprocess.run([ruff, "check", "src", "tests", "workflow"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_the_workflow_passes_snakefmt_check():
    """The Snakefile and every rule file are as snakefmt writes them (pyproject.toml: line length 120)."""
    snakefmt = shutil.which("snakefmt", path=str(Path(sys.executable).parent)) or shutil.which("snakefmt")
    if snakefmt is None:
        pytest.fail("snakefmt is not installed (it is in the test extras: pip install -e '.[test]')")
    r = subprocess.run([snakefmt, "--check", "Snakefile", "workflow"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_snakemakes_own_lint_finds_nothing(tmp_path):
    """`snakemake --lint` (rules with log and benchmark, no mixed rules and functions, ...)."""
    from workflow_helpers import copy_workflow, snakemake

    wd = copy_workflow(tmp_path)
    r = snakemake(wd, "--lint")
    assert r.returncode == 0 and "Congratulations" in r.stdout + r.stderr, (r.stdout + r.stderr)[-4000:]
