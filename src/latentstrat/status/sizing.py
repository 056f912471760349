"""Slurm requests from measurements: every job writes a Snakemake benchmark file (wall seconds,
peak resident memory); this reads a finished or partial collection's files, per rule, and turns
the largest of them into the `mem_mb` and `runtime` a job of that rule should ask for, with a
margin, as a `set-resources` block for the Slurm profile (`python -m latentstrat.status
--requests`).

A job measured on one machine is sized for machines like it: run a few cells of the collection
on the cluster first (`snakemake --profile slurm --until train ...` or a partial run), then size
from those. Rules with no benchmark file yet keep the workflow's defaults and are listed as such.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from latentstrat.paths import BENCH_RULES, Paths

# Snakemake's benchmark columns: wall seconds and peak resident set size in MB
WALL, RSS = "s", "max_rss"


def read_benchmark(path: Path) -> dict | None:
    """One benchmark file's wall seconds and peak RSS (MB), or None when it does not read (a job
    killed mid-write) or holds no number; a job too short to sample has no RSS (NaN)."""
    try:
        df = pd.read_csv(path, sep="\t")
    except (OSError, ValueError, pd.errors.ParserError):
        return None
    if WALL not in df.columns or df.empty:
        return None
    wall = pd.to_numeric(df[WALL], errors="coerce").max()
    rss = pd.to_numeric(df[RSS], errors="coerce").max() if RSS in df.columns else math.nan
    return None if pd.isna(wall) else {"wall_s": float(wall), "max_rss_mb": float(rss)}


def measured(paths: Paths) -> pd.DataFrame:
    """Per rule (in pipeline order): jobs measured, the largest and the median wall time and the
    largest peak RSS among them, and the files that did not read."""
    rows = []
    for rule in BENCH_RULES:
        files = sorted(paths.bench_path(rule, "*").parent.glob(paths.bench_path(rule, "*").name))
        got = [read_benchmark(f) for f in files]
        ok = [g for g in got if g is not None]
        rss = [g["max_rss_mb"] for g in ok if not math.isnan(g["max_rss_mb"])]
        rows.append(
            {
                "rule": rule,
                "jobs": len(ok),
                "unreadable": len(got) - len(ok),
                "max_wall_s": max((g["wall_s"] for g in ok), default=math.nan),
                "median_wall_s": float(pd.Series([g["wall_s"] for g in ok]).median()) if ok else math.nan,
                "max_rss_mb": max(rss, default=math.nan),
            }
        )
    return pd.DataFrame(rows)


def mem_request(peak_mb: float, margin: float = 1.5, min_mem_mb: int = 500) -> int:
    """The `mem_mb` a job should request after peaking at `peak_mb`: the peak times `margin`,
    rounded up to 100 MB, at least `min_mem_mb`."""
    return max(min_mem_mb, 100 * math.ceil(peak_mb * margin / 100))


def requests(table: pd.DataFrame, margin: float = 1.5, min_mem_mb: int = 500, min_runtime: int = 5) -> dict:
    """rule -> {mem_mb, runtime (minutes)}: the measured peak times `margin`, memory rounded up
    to 100 MB and at least `min_mem_mb`, runtime rounded up to a minute and at least
    `min_runtime`. Rules with no measured job are left out (they keep the workflow's values)."""
    if margin < 1:
        raise ValueError(f"margin {margin} < 1 would request less than was measured")
    out = {}
    for r in table.itertuples():
        if r.jobs == 0:
            continue
        req = {"runtime": max(min_runtime, math.ceil(r.max_wall_s * margin / 60))}
        if not math.isnan(r.max_rss_mb):
            req = {"mem_mb": mem_request(r.max_rss_mb, margin, min_mem_mb), **req}
        out[r.rule] = req
    return out


def set_resources_block(req: dict) -> str:
    """The requests as a Snakemake profile's `set-resources` mapping (YAML)."""
    lines = ["set-resources:"]
    for rule, res in req.items():
        lines.append(f"  {rule}:")
        lines += [f"    {k}: {v}" for k, v in res.items()]
    return "\n".join(lines) + "\n"


def render(table: pd.DataFrame, req: dict, margin: float) -> str:
    """The measured table, then the block to paste into the profile (or a profile of its own)."""
    lines = [
        f"{'rule':<10} {'jobs':>5} {'max wall':>10} {'peak RSS':>10}   request (x{margin:g})",
    ]
    for r in table.itertuples():
        if r.jobs == 0:
            lines.append(f"{r.rule:<10} {0:>5} {'-':>10} {'-':>10}   not measured: the workflow's default")
            continue
        rss = "-" if math.isnan(r.max_rss_mb) else f"{r.max_rss_mb:.0f} MB"
        got = ", ".join(f"{k} {v}" for k, v in req[r.rule].items())
        bad = f" ({r.unreadable} unreadable)" if r.unreadable else ""
        lines.append(f"{r.rule:<10} {r.jobs:>5} {r.max_wall_s:>9.0f}s {rss:>10}   {got}{bad}")
    lines += ["", "# paste into workflow/profiles/slurm/config.yaml (runtime in minutes):", set_resources_block(req)]
    return "\n".join(lines)
