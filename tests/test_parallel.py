"""Data parallelism over CPU processes (latentstrat.runtime.parallel, entangle.processes): the entangle
step split over two processes computes the one-process step, repeats exactly, and a failing
or diverging worker is an error that names it."""

import os
from pathlib import Path

import pandas as pd
import pytest
import torch

import parallel_helpers
from latentstrat.base import data, entangle
from latentstrat.modeling.backbone import load_entangled
from latentstrat.runtime import parallel
from workflow_helpers import smoke_cfg

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def workers_import_helpers(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    data.build_dataset(smoke_cfg()["data"], d)
    return d


def _run(data_dir, out, processes, threads):
    entangle.run_entangle(
        smoke_cfg(steps=5, batch_size=8, processes=processes), data_dir, out, threads=threads, log=lambda m: None
    )
    hist = pd.read_parquet(out / "history.parquet")
    hist = hist[~hist.metric.isin(["tokens_per_s", "elapsed_s"])].reset_index(drop=True)
    weights = torch.cat([p.detach().flatten() for p in load_entangled(out).parameters()])
    return hist, weights


@pytest.mark.slow
def test_two_processes_compute_the_one_process_step_and_repeat_exactly(data_dir, tmp_path):
    one_h, one_w = _run(data_dir, tmp_path / "one", processes=1, threads=1)
    dp_h, dp_w = _run(data_dir, tmp_path / "dp", processes=2, threads=2)
    assert len(dp_h) == len(one_h) and (dp_h.metric == "train_loss").sum() == 1
    # the same updates: only the order of the float32 sums differs (each rank sums its half)
    assert dp_h.value.values == pytest.approx(one_h.value.values, rel=1e-5)
    assert torch.allclose(dp_w, one_w, atol=1e-5)
    val = dp_h[(dp_h.metric == "validation_loss") & (dp_h.task == "all")].set_index("step").value
    assert val[5] < val[0]  # it trained
    # one thread per rank: a rerun gives the same weights, bit for bit
    again_h, again_w = _run(data_dir, tmp_path / "again", processes=2, threads=2)
    pd.testing.assert_frame_equal(again_h, dp_h)
    assert torch.equal(again_w, dp_w)
    quality = pd.read_json(tmp_path / "dp" / "quality.json", typ="series")
    assert quality["training"]["processes"] == 2 and quality["training"]["torch_threads"] == 1


def test_all_reduce_sums_over_ranks():
    with parallel.workers(2, parallel_helpers.sum_ranks):
        assert parallel_helpers.sum_ranks(0, 2) == 3.0  # 1 + 2


def test_diverged_ranks_are_an_error():
    with pytest.raises(RuntimeError, match="ranks diverged"):
        with parallel.workers(2, parallel_helpers.diverge):
            parallel_helpers.diverge(0, 2)


def test_a_failing_worker_is_named_with_its_error():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 exit code 1:.*ValueError: boom from rank 1"):
        with parallel.workers(2, parallel_helpers.crash):
            parallel_helpers.crash(0, 2)


def test_processes_off_the_cpu_fail_before_training(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(entangle, "device_for", lambda cfg: torch.device("cuda"))
    with pytest.raises(ValueError, match=r"entangle\.processes is 2.*cuda"):
        entangle.run_entangle(smoke_cfg(processes=2), data_dir, tmp_path / "out", threads=2, log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_a_worker_that_cannot_load_its_job_fails_at_once(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "")  # the worker cannot import parallel_helpers to unpickle its function
    with pytest.raises(
        RuntimeError, match=r"(?s)failed to start: rank 1 exit code 1:.*No module named 'parallel_helpers'"
    ):
        with parallel.workers(2, parallel_helpers.sum_ranks):
            pytest.fail("the body must not run")
