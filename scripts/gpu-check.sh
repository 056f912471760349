#!/usr/bin/env bash
# The GPU measurements of a cell's step (docs/performance.md, "GPU"), in one call on a machine with
# one CUDA GPU whose python3 holds PyTorch: the trainer's step against the library step it
# replaced (kernel ops, host syncs, step ms, graph breaks, outputs) at the cluster cell's shape
# (Qwen2.5-0.5B's architecture, bf16, batch 128 and 8), then the embedded default's step.
# Packages missing there travel as wheels in .whl/ and are installed into /tmp/site first.
# Results go to $OUT (default results/gpu-check/). About 5 minutes on one H100 or H200.
set -euo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
out=${OUT:-results/gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
for batch in 128 8; do
  python3 -m latentstrat.bench seedscale --device cuda --threads 8 --batch-size "$batch" --steps 12 \
    --count-step --out "$out/seedscale-$batch.json" 2>&1 | tee "$out/seedscale-$batch.txt"
done
python3 -m latentstrat.bench train --device cuda --threads 8 --rounds 2 2>&1 | tee "$out/train.txt"
