"""Atomic file output: write to a temp file next to the target, then rename.

Nothing half-written ever carries the final name, so a killed job never leaves an output that
looks complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from latentstrat.stages import STAGES


def current_umask() -> int:
    """The process's umask (os.umask can only be read by setting it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None):
    """Yield a temp path in the target's folder; rename it onto `path` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it 0600: collaborators read what the umask allows
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_parquet(df: pd.DataFrame, path: str | Path, provenance: dict | None = None) -> None:
    """Deterministic parquet (no pandas index, fixed compression), written atomically.
    `provenance`: who wrote it where (runtime.host.provenance), kept in the file's metadata
    (pandas attrs) and read back by `parquet_provenance`."""
    if provenance is not None:
        df = df.copy(deep=False)
        df.attrs = {"provenance": provenance}
    with atomic_path(path, suffix=".parquet") as tmp:
        df.to_parquet(tmp, index=False, compression="zstd")


def parquet_provenance(df: pd.DataFrame) -> dict:
    """The provenance a table was written with (write_parquet), {} without one."""
    prov = df.attrs.get("provenance") if isinstance(df.attrs, dict) else None
    return dict(prov) if isinstance(prov, dict) else {}


def write_text(text: str, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


# the job that writes a file, from the stage folder in its path (the layout: paths.Paths)
PRODUCERS = {s.folder: s.job_folder for s in STAGES}
RERUN_CORRUPT = "python -m latentstrat.status --configfile <config> --rerun-corrupt"


def producer(path: str | Path) -> str:
    """The workflow job that writes `path` (its nearest stage folder), or 'the' when unknown."""
    for part in reversed(Path(path).parts[:-1]):
        if part in PRODUCERS:
            return PRODUCERS[part]
    return "the"


def unreadable_message(what: str, path: str | Path, reason: str) -> str:
    reason = " ".join(str(reason).split())
    return (
        f"{what} {path} is unreadable ({reason}); the {producer(path)} job that wrote it must run again: "
        f"`{RERUN_CORRUPT}` finds every unreadable output and reruns its job and what depends on it"
    )


def unreadable(path: str | Path) -> str | None:
    """Why an existing output cannot be read (parquet: every page; safetensors: header and every
    tensor; json: parses), or None when it reads."""
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.ParquetFile(path).read()
        elif path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                for k in f.keys():
                    f.get_tensor(k)
        elif path.suffix == ".json":
            import json

            json.loads(path.read_text())
    except Exception as e:  # noqa: BLE001 - any failure to read is the answer
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return None


def read_parquet(path: str | Path, what: str = "table", columns: list[str] | None = None) -> pd.DataFrame:
    """Read parquet with an error that names the file, what it should be, the job that wrote it
    and the command that reruns it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # corrupt / truncated file
        raise ValueError(unreadable_message(what, path, f"not a readable parquet file: {e}")) from None
    if columns:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ValueError(f"{what} {path} lacks columns {missing}")
    return df


def dump_json(obj: Any, path: str | Path) -> None:
    """Write JSON atomically (temp file, then rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.write("\n")
