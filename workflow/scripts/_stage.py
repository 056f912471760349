"""Beside the rule script (stage.py): the package on the path and a log that captures everything.

The script reads only snakemake.input/output/params/threads/log, builds the job and calls its
stage's entry (docs/architecture.md, "Stages").
"""

import contextlib
import logging
import os
import sys
import traceback
from pathlib import Path

# the package from this checkout's src/, also in a conda env that does not install it
# (`snakemake --sdm conda`); with the package installed in editable mode it is the same code
_SRC = Path(__file__).resolve().parents[2] / "src"
if (_SRC / "latentstrat" / "__init__.py").exists():
    sys.path.insert(0, str(_SRC))


@contextlib.contextmanager
def logged(snakemake):
    """Send stdout/stderr (Python and C level) to the rule's log; log the traceback on failure."""
    log = Path(snakemake.log[0])
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        # every line reaches the log as it is printed: a running job's log can be followed
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, force=True, format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
        try:
            yield
        except BaseException:
            traceback.print_exc()
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
