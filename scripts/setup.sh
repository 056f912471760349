#!/usr/bin/env bash
# Set up everything latentstrat needs on a fresh Debian machine with Python 3.11 + pip:
# a virtual environment in .venv with the pinned packages (torch 2.13.0 CPU wheel locally),
# and Debian's slurm-wlm + munge for the real-Slurm tests. Idempotent: installs only what is
# missing. Cluster users: see docs/slurm.md (CUDA torch first, then this package).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.latentstrat-installed
want=$(cat pyproject.toml envs/latentstrat.yaml 2>/dev/null | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi

# Slurm + munge for tests/test_slurm.py (root on Debian; skipped where apt is absent).
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null
  else
    echo "setup: slurm-wlm/munge not installed and cannot apt-get them; the Slurm tests will be skipped" >&2
  fi
fi
echo "setup: ok ($(.venv/bin/python -c 'import torch, snakemake; print("torch", torch.__version__, "snakemake", snakemake.__version__)'))"
