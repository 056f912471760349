"""Atomic file output: write to a temp file next to the target, then rename.

Nothing half-written ever carries the final name, so a killed job never leaves an output that
looks complete.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None):
    """Yield a temp path in the target's folder; rename it onto `path` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_parquet(df: pd.DataFrame, path: str | Path) -> None:
    """Deterministic parquet (no pandas index, fixed compression), written atomically."""
    with atomic_path(path, suffix=".parquet") as tmp:
        df.to_parquet(tmp, index=False, compression="zstd")


def write_text(text: str, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def read_parquet(path: str | Path, what: str = "table", columns: list[str] | None = None) -> pd.DataFrame:
    """Read parquet with an error that names the file and what it should be."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # corrupt / truncated file
        raise ValueError(f"{what} {path} is not a readable parquet file: {e}") from None
    if columns:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise ValueError(f"{what} {path} lacks columns {missing}")
    return df
