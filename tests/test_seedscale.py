"""The seed-scale check: Qwen2.5-0.5B's architecture (random weights) wrapped as a cell of the
cluster config, two train steps, a validation pass and a decode, on this CPU."""

import json
import subprocess
import sys

import pytest

from latentstrat.bench import seedscale


def test_layer_matmul_parameters_and_step_flops_by_hand():
    cfg = seedscale.QWEN25_05B
    # q 896x896, k and v 896x128 (2 of 14 heads' width), o 896x896, gate / up / down 896x4864
    assert seedscale.layer_matmul_params(cfg) == 896 * 896 * 2 + 2 * 896 * 128 + 3 * 896 * 4864
    n = 24 * seedscale.layer_matmul_params(cfg)
    assert seedscale.step_flops(cfg, {"adapters": 10}, tokens=100, supervised=0) == (4 * n + 60) * 100
    assert seedscale.step_flops(cfg, {"adapters": 0}, tokens=0, supervised=3) == 3 * 4 * 896 * 151936


@pytest.mark.slow
def test_qwen25_05b_cell_trains_validates_and_decodes_on_the_cpu(tmp_path):
    out = tmp_path / "seedscale.json"
    r = subprocess.run(
        [sys.executable, "-m", "latentstrat.bench", "seedscale", "--batch-size", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads(out.read_text())
    # the published model's parameter count: 24 layers, a 151,936-token vocabulary, tied embeddings
    assert res["parameters"]["frozen"] == seedscale.QWEN25_05B_PARAMETERS == 494_032_768
    # two LoRA adapters, r 16 on every linear layer: r x (in + out) per layer and adapter
    per_layer = 16 * (2 * (896 + 896) + 2 * (896 + 128) + 3 * (896 + 4864))
    assert res["parameters"]["adapters"] == 2 * 24 * per_layer
    assert res["backbone_dtype"] == "bfloat16" and res["trainable_dtypes"] == ["bfloat16", "float32"]
    assert all(x > 0 for x in res["adapter_grad_max"]) and all(0 < n <= 16 for n in res["decoded_tokens"])
    assert 0.5 < res["losses"][0] < 3  # the normalized family: about 1 at step 0 (z adds nothing)
    assert res["peak_memory_mb"] > 1000  # a bf16 copy of 494 M parameters alone is 942 MB
    assert "peak memory" in r.stdout and "published Qwen2.5-0.5B" in r.stdout
