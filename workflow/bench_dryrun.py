"""Dry-run overhead of the workflow: the default 12-cell grid (+ its 8-cell comparison arm) and
a generated 1000-cell grid (10 families x 10 betas x 10 seeds, no comparison arm).

    .venv/bin/python workflow/bench_dryrun.py [--repeats 3]

Prints one line per grid: cells, jobs and the best wall time of `snakemake -n -q` (parse,
config validation, DAG). Goals: <= 3 s and <= 30 s.
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
GRIDS = {
    "default (12 + 8 cells)": [],
    "generated (1000 cells)": [
        "grid={reconstruction_family: [raw, dist_norm, "
        + ", ".join(f"tokcc_a{a}" for a in (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1))
        + "], beta: ["
        + ", ".join(str(b) for b in (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30))
        + "]}",
        "seeds=[" + ", ".join(str(s) for s in range(10)) + "]",
        "comparison_arms=[]",
    ],
}


def dry_run(config, results):
    cmd = [SNAKEMAKE, "-n", "-q", "rules", "--config", f"results_dir={results}", *config]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(r.stdout + r.stderr)
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", r.stdout + r.stderr, re.M))
    return dt, int(stats.get("train", 0)), int(stats.get("total", 0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in GRIDS.items():
            runs = [dry_run(config, tmp) for _ in range(args.repeats)]
            best = min(r[0] for r in runs)
            print(f"{name}: {runs[0][1]} train jobs, {runs[0][2]} jobs, dry run {best:.2f} s (best of {args.repeats})")


if __name__ == "__main__":
    main()
