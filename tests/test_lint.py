"""The code passes ruff (pyproject.toml: line length 120, pycodestyle, pyflakes, import order, at
most 8 parameters a function, McCabe complexity at most 10)."""

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
