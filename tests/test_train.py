"""Disentangle trainer: outputs, determinism, SIGTERM resume, NaN handling (tiny CPU runs)."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from base_helpers import base_folders, tiny_cfg
from latentstrat.cells import training_seed
from latentstrat.io import write_parquet
from latentstrat.paths import BaseFolders


def weights(d):
    """A trained cell's weights: both peft adapters and the heads, under one set of names."""
    from pathlib import Path

    d = Path(d)
    out = {f"heads.{k}": v for k, v in load_file(d / "heads" / "heads.safetensors").items()}
    for name in ("generator", "posterior"):
        out.update(
            {f"{name}.{k}": v for k, v in load_file(d / "adapters" / name / "adapter_model.safetensors").items()}
        )
    return out


@pytest.fixture(scope="module")
def base(tiny_base):
    return tiny_base


def run(cfg, cell, base, out):
    from latentstrat.cell.train import train_cell

    return train_cell(cfg, cell, base_folders(base), out, threads=1)


def test_outputs_and_determinism(base, tmp_path):
    cfg, cell = tiny_cfg()
    s1 = run(cfg, cell, base, tmp_path / "a")
    run(cfg, cell, base, tmp_path / "b")
    for f in (
        "heads/heads.safetensors",
        "heads/config.json",
        "adapters/generator/adapter_config.json",
        "adapters/posterior/adapter_model.safetensors",
        "history.parquet",
        "summary.json",
    ):
        assert (tmp_path / "a" / f).exists()
    h1 = pd.read_parquet(tmp_path / "a" / "history.parquet")
    h2 = pd.read_parquet(tmp_path / "b" / "history.parquet")
    pd.testing.assert_frame_equal(h1, h2)
    assert (tmp_path / "a" / "history.parquet").read_bytes() == (tmp_path / "b" / "history.parquet").read_bytes()
    assert list(h1.columns) == ["cell_id", "step", "task", "metric", "value"]
    assert sorted(h1.step.unique()) == [0, 3, 6]
    a = h1[h1.task == "all"].pivot(index="step", columns="metric", values="value")
    # the family identities hold on every row; active = tokcc for this cell
    assert (a.inferred_zfree_reference_scale - s1["S_ref"]).abs().max() < 1e-4 * s1["S_ref"]
    assert (a.active_reconstruction_objective - a.tokcc_reconstruction_loss).abs().max() < 1e-6
    assert (a.kl_over_active_reconstruction - a.kl_prior_loss / a.active_reconstruction_objective).abs().max() < 1e-9
    assert a.beta_t.eq(0.1).all()
    # training lowers the optimized objective on the validation subset
    assert a.total_loss.loc[6] < a.total_loss.loc[0]
    t = h1[h1.task != "all"].pivot_table(index=["step", "task"], columns="metric", values="value")
    for m in ("example_share", "token_share", "loss_share", "grad_norm_share"):
        assert t[m].groupby("step").sum().sub(1).abs().max() < 1e-6, m
    assert t.example_share.eq(0.5).all()  # 8 + 8 validation examples
    # the batches' task mix (24 + 24 train rows, batch 8: 4 + 4 give or take 1), pre-clip norms
    mix = t.batch_task_share.dropna().groupby("step").sum()
    assert list(mix.index) == [3, 6] and mix.sub(1).abs().max() < 1e-9
    assert t.batch_task_share.dropna().sub(0.5).abs().max() <= 1 / 8 + 1e-9
    assert a.grad_norm_preclip.loc[[3, 6]].gt(0).all() and a.clipped_fraction.loc[[3, 6]].between(0, 1).all()
    assert a.grad_clip.loc[3] == 1.0
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["tokens_per_s"] > 0
    # the seed the cell trained on (its settings' and replicate seed's, not the replicate seed)
    assert summary["training_seed"] == training_seed(cell) != cell["seed"]


def test_step0_is_before_any_update(base, tmp_path):
    """The step-0 row of a 6-step run equals the step-0 row of a 1-step run (no update yet),
    and with init weights the z-free-level tokcc is about 1 (the z-free reference is the base)."""
    cfg, cell = tiny_cfg(steps=1, eval_every=1)
    run(cfg, cell, base, tmp_path / "one")
    h = pd.read_parquet(tmp_path / "one" / "history.parquet")
    a0 = h[(h.step == 0) & (h.task == "all")].set_index("metric").value
    # LoRA B = 0 at init: the generator is the entangled model up to the z slot, so the
    # base-relative losses sit near 1 (only the inserted <z> [Z] </z> tokens differ)
    assert 0.5 < a0["base_relative_reconstruction"] < 2.0
    assert 0.5 < a0["tokcc_reconstruction_loss"] < 2.0


def test_shared_step0_validation_is_the_cells_own_and_refuses_another_model(base, tmp_path):
    """Cells that start from one model (the two arms of a pair: one training seed) read one step-0
    validation: their history and weights are exactly what measuring step 0 in the cell gives,
    for the two cells of a pair (different objectives); a cell of another setting or another
    replicate seed (another training seed: other weights, other noise) is refused with the
    folder named."""
    from latentstrat.cell.step0 import step0_validation
    from latentstrat.cell.train import train_cell
    from latentstrat.cells import init_id, init_settings

    cfg, cell = tiny_cfg(steps=3, eval_every=3)
    s0 = tmp_path / "step0"
    step0_validation(cfg, init_settings(cell), base_folders(base), s0, threads=1)
    folders = base_folders(base)
    pair = {**cell, "token_aggregation": "mean"}
    assert init_id(pair) == init_id(cell)
    for i, c in enumerate([cell, pair]):
        train_cell(cfg, c, folders, tmp_path / f"own{i}", threads=1)
        train_cell(cfg, c, folders, tmp_path / f"shared{i}", threads=1, step0_dir=s0)
        own, shared = (pd.read_parquet(tmp_path / f"{d}{i}" / "history.parquet") for d in ("own", "shared"))
        pd.testing.assert_frame_equal(own, shared, check_exact=True)
        w_own, w_sh = (weights(tmp_path / f"{d}{i}") for d in ("own", "shared"))
        assert all(torch.equal(w_own[k], w_sh[k]) for k in w_own)
        assert own[own.step == 0].metric.nunique() > 15
    for other in ({**cell, "seed": cell["seed"] + 1}, {**pair, "reconstruction_family": "raw", "beta": 1.0}):
        with pytest.raises(ValueError, match=f"step-0 validation {s0}.*another model"):
            train_cell(cfg, other, folders, tmp_path / "other", threads=1, step0_dir=s0)


@pytest.mark.slow
def test_sigterm_resume_matches_uninterrupted(base, tmp_path, monkeypatch):
    cfg, cell = tiny_cfg(steps=8, eval_every=4, checkpoint_every=100)
    full = tmp_path / "full"
    run(cfg, cell, base, full)
    out = tmp_path / "killed"
    script = tmp_path / "run.py"
    marker = tmp_path / "training"
    script.write_text(
        "import json, sys, time, pathlib\n"
        "from latentstrat.cell import train\n"
        "from latentstrat.paths import BaseFolders\n"
        "cfg, cell, base, out, marker = json.load(open(sys.argv[1]))\n"
        "orig = train.forward_losses\n"
        "def slow(model, batch, objective, step, eps):\n"
        "    if model.training and step >= 2:\n"
        "        pathlib.Path(marker).touch()\n"
        "        time.sleep(0.5)\n"
        "    return orig(model, batch, objective, step, eps)\n"
        "train.forward_losses = slow\n"
        "train.train_cell(cfg, cell, BaseFolders(base['data_dir'], base['entangle_dir'], base['reference_dir']), out, "
        "threads=1)\n"
    )
    args = tmp_path / "args.json"
    args.write_text(json.dumps([cfg, cell, {k: str(v) for k, v in base.items()}, str(out), str(marker)]))
    p = subprocess.Popen([sys.executable, str(script), str(args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ckpt = out / "checkpoints" / "last.pt"
    deadline = time.time() + 180
    while time.time() < deadline and p.poll() is None and not marker.exists():
        time.sleep(0.2)
    assert p.poll() is None, "the run ended before it could be interrupted"
    os.kill(p.pid, signal.SIGTERM)
    log = p.communicate(timeout=120)[0].decode()
    assert p.returncode != 0, log
    assert ckpt.exists(), log
    ck = torch.load(ckpt, weights_only=True)
    assert 0 < ck["step"] < 8, ck["step"]
    assert not (out / "history.parquet").exists()
    from latentstrat.runtime import host

    here = host.cpu_model()
    monkeypatch.setattr(host, "cpu_model", lambda: "Another CPU")  # resumed on another machine
    run(cfg, cell, base, out)
    # the summary keeps every machine the cell trained on, from the step each took over
    segs = json.loads((out / "summary.json").read_text())["hosts"]
    assert [(s["cpu"], s["from_step"]) for s in segs] == [(here, 0), ("Another CPU", ck["step"])]
    assert [s["cpu"] for s in json.loads((full / "summary.json").read_text())["hosts"]] == [here]
    h_full = pd.read_parquet(full / "history.parquet")
    h_res = pd.read_parquet(out / "history.parquet")
    pd.testing.assert_frame_equal(h_full, h_res)
    w_full, w_res = weights(full), weights(out)
    assert w_full.keys() == w_res.keys()
    assert all(torch.equal(w_full[k], w_res[k]) for k in w_full)


def test_nan_loss_names_cell_step_term_and_keeps_checkpoint(base, tmp_path, monkeypatch):
    from latentstrat.cell import train
    from latentstrat.modeling import objective

    cfg, cell = tiny_cfg(steps=6, eval_every=100, checkpoint_every=2)
    out = tmp_path / "nan"
    real_kl, real_step = objective.gaussian_kl, train.forward_losses

    def fl(model, batch, objective_, step, eps):
        poison = model.training and step == 2  # the 3rd optimizer step
        objective.gaussian_kl = (lambda *a: real_kl(*a) * float("nan")) if poison else real_kl
        try:
            return real_step(model, batch, objective_, step, eps)
        finally:
            objective.gaussian_kl = real_kl

    monkeypatch.setattr(train, "forward_losses", fl)
    with pytest.raises(train.NonFiniteLoss) as e:
        run(cfg, cell, base, out)
    msg = str(e.value)
    assert cell["cell_id"] in msg and "step 3" in msg and "kl_prior_loss" in msg
    ck = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert ck["step"] == 2
    assert all(torch.isfinite(v).all() for v in ck["trainable"].values())
    assert not (out / "heads" / "heads.safetensors").exists()


def test_missing_reference_example_is_named(base, tmp_path):
    from latentstrat.cell.train import train_cell

    ref = pd.read_parquet(base["reference_dir"] / "tokens.parquet")
    bad = tmp_path / "ref"
    write_parquet(ref.iloc[1:], bad / "tokens.parquet")
    cfg, cell = tiny_cfg()
    with pytest.raises(ValueError, match=ref.example_id.iloc[0]):
        train_cell(cfg, cell, BaseFolders(base["data_dir"], base["entangle_dir"], bad), tmp_path / "o", threads=1)


def test_bench_train_runs_and_dispatches(capsys):
    from latentstrat.bench.__main__ import main

    assert main(["nope"]) == 2
    assert (
        main(
            [
                "train",
                "--tasks",
                "sorting_algorithms",
                "--examples-per-task",
                "8",
                "--hidden",
                "32",
                "--intermediate",
                "64",
                "--layers",
                "1",
                "--heads",
                "2",
                "--kv-heads",
                "1",
                "--latent-dim",
                "4",
                "--batch-size",
                "4",
                "--steps",
                "1",
                "--warmup",
                "0",
                "--threads",
                "1",
                "--matmul-n",
                "64",
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["trainer_tokens_per_s"] > 0 and res["naive_tokens_per_s"] > 0
    # the median of alternating rounds' ratios (3 by default)
    assert len(res["speedup_rounds"]) == 3 and res["speedup"] == pytest.approx(sorted(res["speedup_rounds"])[1])
    assert res["trainer_flops_per_s"] == pytest.approx(6 * res["params"] * res["trainer_tokens_per_s"])
    assert res["eval_merged_tokens_per_s"] > 0 and res["eval_lora_tokens_per_s"] > 0


def test_checkpoint_of_another_config_is_not_resumed(base, tmp_path, capsys):
    """A finished cell's checkpoint resumes only the run it was written for: the same config
    reruns as a no-op at the last step (control); a changed learning rate starts from step 0
    and ends exactly where a fresh run with that learning rate ends."""
    cfg, cell = tiny_cfg(steps=4, eval_every=2)
    out = tmp_path / "cell"
    run(cfg, cell, base, out)
    capsys.readouterr()
    run(cfg, cell, base, out)  # same run: resumed at its end
    assert "resumed from step 4" in capsys.readouterr().out
    cfg2, cell2 = tiny_cfg(steps=4, eval_every=2, lr=0.01)
    assert cell2 == cell
    run(cfg2, cell2, base, out)
    log = capsys.readouterr().out
    assert "starting from step 0" in log and "resumed" not in log
    run(cfg2, cell2, base, tmp_path / "fresh")
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / "history.parquet"), pd.read_parquet(tmp_path / "fresh" / "history.parquet")
    )
    w, w_fresh = weights(out), weights(tmp_path / "fresh")
    assert all(torch.equal(w[k], w_fresh[k]) for k in w)


def test_checkpoint_of_another_model_layer_is_not_resumed(base, tmp_path, capsys):
    """A checkpoint whose weights carry other parameter names (an earlier model layer) is never
    loaded: the cell starts from step 0 and says why (control: the same checkpoint, names
    intact, resumes)."""
    cfg, cell = tiny_cfg(steps=2, eval_every=2)
    out = tmp_path / "cell"
    run(cfg, cell, base, out)
    ckpt = out / "checkpoints" / "last.pt"
    ck = torch.load(ckpt, weights_only=True)
    capsys.readouterr()
    run(cfg, cell, base, out)
    assert "resumed from step 2" in capsys.readouterr().out
    ck["trainable"] = {k.replace("peft.base_model.model.", "lm."): v for k, v in ck["trainable"].items()}
    torch.save(ck, ckpt)
    run(cfg, cell, base, out)
    log = capsys.readouterr().out
    assert "holds another model layer's weights" in log and "starting from step 0" in log and "resumed" not in log


def test_grad_clip_per_aggregation_is_explicit():
    from latentstrat.cell.train import grad_clip_for
    from latentstrat.modeling.objective import Objective

    def o(aggregation, family):
        cell = {
            "reconstruction_family": family,
            "token_aggregation": aggregation,
            "beta": 0.01,
            "beta_schedule": "constant",
            "posterior_variance_weight": 0.0,
            "router_marginal_kl_weight": 0.0,
        }
        return Objective.with_scales(cell, {"S_ref": 26.0, "T_ref": 3.0})

    absolute = {"grad_clip_unit": "absolute"}
    assert grad_clip_for({"grad_clip": 1.0, **absolute}, o("sum", "raw")) == 1.0
    assert grad_clip_for({"grad_clip": {"mean": 1.0, "sum": 26.0}, **absolute}, o("sum", "raw")) == 26.0
    with pytest.raises(ValueError, match="no threshold for token aggregation 'sum_scaled'"):
        grad_clip_for({"grad_clip": {"mean": 1.0, "sum": 26.0}, **absolute}, o("sum_scaled", "raw"))
    # in units of the z-free objective: S_ref for raw, 1 for the normalized families, p + q for the mix
    rel = {"grad_clip": 2.0, "grad_clip_unit": "zfree_objective"}
    assert grad_clip_for(rel, o("sum", "raw")) == 52.0
    assert grad_clip_for(rel, o("sum", "dist_norm")) == 2.0
    assert grad_clip_for(rel, o("sum", "tokcc_a0.25")) == 2.0
    assert grad_clip_for(rel, o("mean", "dist_tokcc_0.05_0.95")) == pytest.approx(2.0)
    assert grad_clip_for({**rel, "grad_clip": 0}, o("sum", "raw")) == 0.0  # none stays none
    cfg, _ = tiny_cfg(grad_clip={"mean": 1.0, "sum": 30.0})
    assert cfg["train"]["grad_clip"] == {"mean": 1.0, "sum": 30.0}


def test_corrupt_checkpoint_is_moved_aside_and_the_cell_restarts(base, tmp_path, capsys):
    cfg, cell = tiny_cfg(steps=2, eval_every=2)
    ck = tmp_path / "out" / "checkpoints" / "last.pt"
    ck.parent.mkdir(parents=True)
    ck.write_bytes(os.urandom(4096))  # random bytes, as after a disk fault
    summary = run(cfg, cell, base, tmp_path / "out")
    out = capsys.readouterr().out
    assert "is unreadable" in out and "moved aside" in out and "starting from step 0" in out
    assert "weights_only=False" not in out  # never the advice to unpickle untrusted data
    assert summary["steps"] == 2 and list(ck.parent.glob("last.pt.corrupt-*"))
    # provenance: the code, host and times the cell ran with
    assert summary["code_version"] and summary["host"] and summary["started_at"] <= summary["finished_at"]


def test_progress_lines_name_step_loss_rate_and_eta():
    from latentstrat.runtime.progress import Progress

    lines = []
    p = Progress("c", 4, every=0.0, log=lambda m, flush=True: lines.append(m))
    for s in range(1, 5):
        p.update(s, 2.0, 100)
    assert len(lines) == 4 and lines[-1].startswith("[c] step 4/4 loss 2.0000")
    assert "tokens/s" in lines[0] and "ETA" in lines[0]
