"""python -m latentstrat.status: cells x stages from files and the Slurm queue (fake jobs here;
tests/test_slurm.py runs it against a real cluster)."""

import json
import math
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from latentstrat.cells import expand_cells
from latentstrat.config import load_config
from latentstrat.paths import Paths
from latentstrat.runtime import host
from latentstrat.status import collection_status, main, render, stage_outputs

ROOT = Path(__file__).resolve().parents[1]


def write_outputs(files, code_version: str) -> None:
    """Readable stand-ins for a stage's outputs: parquet, safetensors, json (the summary's code version)."""
    import pandas as pd
    import torch
    from safetensors.torch import save_file

    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".parquet":
            pd.DataFrame({"a": [1.0, 2.0]}).to_parquet(f)
        elif f.suffix == ".safetensors":
            save_file({"w": torch.ones(3)}, str(f))
        else:
            f.write_text(json.dumps({"code_version": code_version}))


def test_states_from_files_logs_and_slurm(tmp_path, capsys):
    cfg = load_config(ROOT / "config" / "smoke.yaml", overrides={"results_dir": str(tmp_path / "results")})
    p = Paths.from_config(cfg)
    cells = [c.cell_id for c in expand_cells(cfg)]
    done, failed, running, pending, stale = cells[:5]
    tasks = list(cfg["data"]["tasks"])
    now = host.code_version()["code_version"]
    for cid, code in ((done, now), (stale, "0ld0ld0ld0ld")):
        for files in stage_outputs(p, cid, tasks).values():
            write_outputs(files, code)
    log = p.log_path("train", failed)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("step 3/6\nTraceback (most recent call last):\n  ...\nValueError: checkpoint x is broken\n")
    old = time.time() - 3600
    os.utime(log, (old, old))
    jobs = [
        {"id": "101", "state": "RUNNING", "comment": f"rule_train_wildcards_{running}"},
        {"id": "102", "state": "PENDING", "comment": f"rule_evaluate_wildcards_{pending}"},
        {"id": "99", "state": "COMPLETED", "comment": f"rule_train_wildcards_{pending}"},
    ]
    write_outputs(stage_outputs(p, pending, tasks)["train"], now)
    st = collection_status(cfg, jobs=jobs)
    by = {c["cell_id"]: {s: v["state"] for s, v in c["stages"].items()} for c in st["cells"]}
    assert by[done] == dict.fromkeys(["train", "evaluate", "probes", "tabulate"], "done")
    assert by[stale]["train"] == "stale"
    assert by[failed]["train"] == "failed"
    assert next(c for c in st["cells"] if c["cell_id"] == failed)["stages"]["train"]["detail"].startswith("ValueError")
    assert by[running]["train"] == "running" and by[pending] == {
        "train": "done",
        "evaluate": "pending",
        "probes": "pending",  # not started: no output, no log
        "tabulate": "pending",
    }
    n = len(cells)
    assert st["summary"].endswith(
        f"; 2/{n} cells done (trained 3/{n}, evaluated 2/{n}, probed 2/{n}, tabulated 2/{n}), 1 running, 1 failed, "
        "1 stale"
    )
    text = render(st)
    assert "Slurm job 101" in text and "ValueError: checkpoint x is broken" in text and text.endswith(st["summary"])
    # the command: --json and a missing config in one line
    assert main(["--configfile", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_unreadable_outputs_are_corrupt_and_the_base_is_in_the_summary(tmp_path, capsys):
    cfg = load_config(ROOT / "config" / "smoke.yaml", overrides={"results_dir": str(tmp_path / "results")})
    p = Paths.from_config(cfg)
    tasks = list(cfg["data"]["tasks"])
    cid = expand_cells(cfg)[0].cell_id
    for files in stage_outputs(p, cid, tasks).values():
        write_outputs(files, host.code_version()["code_version"])

    def by_stage(st):
        return {s: v["state"] for s, v in next(c for c in st["cells"] if c["cell_id"] == cid)["stages"].items()}

    st = collection_status(cfg, jobs=[])
    assert by_stage(st) == dict.fromkeys(("train", "evaluate", "probes", "tabulate"), "done") and st["corrupt"] == []
    # the base: nothing built yet (no output, no log), every base stage pending and named in the summary
    assert st["base"]["data"]["state"] == st["base"]["reference"]["state"] == "pending"
    assert st["summary"].startswith(
        "smoke: base: data pending, entangle pending, reference pending, 12 step0 pending;"
    )  # smoke: 12 pairs, the collection named
    records = p.records_path(cid)
    good = records.read_bytes()
    records.write_bytes(good[:8] + os.urandom(len(good) - 16) + good[-8:])  # random bytes inside, magic kept
    weights = p.train_dir(cid) / "adapters" / "posterior" / "adapter_model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(os.urandom(64))  # not a declared output: the train job's heads are forced
    st = collection_status(cfg, jobs=[])
    assert by_stage(st)["evaluate"] == "corrupt" and by_stage(st)["train"] == "corrupt"
    heads = p.train_dir(cid) / "heads" / "heads.safetensors"
    assert set(st["corrupt"]) == {str(records), str(heads)} and "1 corrupt" in st["summary"]
    train = next(c for c in st["cells"] if c["cell_id"] == cid)["stages"]["train"]
    assert train["detail"].startswith(f"{weights}: ")
    text = render(st)
    assert f"evaluate: corrupt: {records}" in text and "--rerun-corrupt" in text
    # a stage that reads such a file names it, the job that wrote it and the command
    from latentstrat.io import read_parquet

    with pytest.raises(
        ValueError,
        match=r"evaluate records .*records.parquet is unreadable .* the evaluate job that "
        r"wrote it must run again: `python -m latentstrat.status .* --rerun-corrupt`",
    ):
        read_parquet(records, "evaluate records")
    # a base stage's output too
    write_outputs([Path(p.data_files()["train"])], "")
    st = collection_status(cfg, jobs=[])
    assert st["base"]["data"]["state"] == "missing"  # not every data output exists yet
    write_outputs([Path(f) for f in p.stage_files("data").values()], "")  # every file its declaration names
    Path(p.data_files()["tokenizer"]).write_text("{not json")
    st = collection_status(cfg, jobs=[])
    assert st["base"]["data"]["state"] == "corrupt" and p.data_files()["tokenizer"] in st["corrupt"]


@pytest.mark.slow
def test_a_corrupt_cell_output_is_found_and_rerun_with_everything_downstream(tmp_path):
    """A finished one-cell collection; random bytes into the cell's evaluate records; the status
    shows them corrupt; --rerun-corrupt reruns evaluate, probes, metrics, aggregate and report
    (not train), and the cell's metrics come back equal to before."""
    import sys

    import pandas as pd

    from workflow_helpers import copy_workflow, snakemake, tiny_collection

    wd = copy_workflow(tmp_path)
    cfg_path = tiny_collection(wd, "corrupt", {"reconstruction_family": ["raw"], "beta": [0.1]})
    r = snakemake(wd, "--cores", "2", "-q", configfile="config/corrupt.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    cfg = load_config(cfg_path)
    p = Paths.from_config(cfg)
    (cid,) = [c.cell_id for c in expand_cells(cfg)]
    records, metrics, summary = p.records_path(cid), p.row_path(cid), p.train_dir(cid) / "summary.json"
    before = pd.read_parquet(metrics)
    train_mtime = summary.stat().st_mtime_ns
    good = records.read_bytes()
    records.write_bytes(good[:8] + os.urandom(len(good) - 16) + good[-8:])
    status = [sys.executable, "-m", "latentstrat.status", "--configfile", "config/corrupt.yaml"]
    out = subprocess.run(status, cwd=wd, capture_output=True, text=True, timeout=120).stdout
    assert f"{cid} evaluate: corrupt: {records}" in out and "1 corrupt" in out, out
    r = subprocess.run(
        status + ["--rerun-corrupt", "--", "--cores", "2"], cwd=wd, capture_output=True, text=True, timeout=600
    )
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    ran = re.findall(r"^Finished jobid: \d+ \(Rule: (\w+)\)", log, flags=re.M)
    assert sorted(ran) == sorted(["evaluate", "probes", "tabulate", "aggregate", "report", "all"]), ran
    assert summary.stat().st_mtime_ns == train_mtime  # train did not rerun
    pd.testing.assert_frame_equal(pd.read_parquet(metrics), before)
    out = subprocess.run(status, cwd=wd, capture_output=True, text=True, timeout=120).stdout
    tail = out.rstrip().splitlines()[-2:]
    assert tail[0].endswith(
        "base: done; 1/1 cells done (trained 1/1, evaluated 1/1, probed 1/1, tabulated 1/1), 0 running, 0 failed"
    ), out
    assert tail[1].startswith("collection ETA: every cell done; the report is in ") and tail[1].endswith("/report"), out


def test_a_running_cell_shows_its_step_and_the_collection_an_eta(tmp_path, capsys):
    """The train job's progress file (written by progress.Progress as the cell trains) gives the
    running cell's step, total and ETA; the measured jobs' median wall times give the collection's."""
    from latentstrat.runtime.progress import Progress
    from latentstrat.status import collection_eta, eta_text

    cfg = load_config(ROOT / "config" / "smoke.yaml", overrides={"results_dir": str(tmp_path / "results")})
    p = Paths.from_config(cfg)
    cells = [c.cell_id for c in expand_cells(cfg)]
    done, running = cells[:2]
    tasks = list(cfg["data"]["tasks"])
    for files in stage_outputs(p, done, tasks).values():
        write_outputs(files, host.code_version()["code_version"])
    # the done cell's jobs were measured (Snakemake benchmark files): train 600 s, the rest 60 s each
    for rule, wall in (("train", 600.0), ("evaluate", 60.0), ("probes", 60.0), ("tabulate", 60.0)):
        b = p.bench_path(rule, done)
        b.parent.mkdir(parents=True, exist_ok=True)
        b.write_text(f"s\th:m:s\tmax_rss\n{wall}\t0:00:00\t100.0\n")
    # a running train job: its progress line after 751 of 1200 steps, 1.5 s a step
    log = p.log_path("train", running)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[x] step 751/1200\n")
    lines = []
    prog = Progress(running, 1200, every=0.0, log=lambda *a, **k: lines.append(a[0]), path=p.progress_path(running))
    prog.t0 -= 751 * 1.5
    prog.update(751, 1.0, 10)
    assert "step 751/1200" in lines[-1]
    st = collection_status(cfg, jobs=[])
    train = next(c for c in st["cells"] if c["cell_id"] == running)["stages"]["train"]
    assert train["state"] == "running" and train["detail"].startswith("step 751/1200, ETA 11 min")
    assert abs(train["progress"]["eta_s"] - 449 * 1.5) < 5
    assert f"{running} train: running: step 751/1200, ETA 11 min" in render(st)
    # the collection: the running train's ETA plus the median per job of every stage left, at 2 jobs at once
    eta = collection_eta(st, {"train": 600.0, "evaluate": 60.0, "probes": 60.0, "tabulate": 60.0}, 2)
    left_cells = len(cells) - 2
    want = (449 * 1.5 + 3 * 60 + left_cells * (600 + 3 * 60)) / 2
    assert eta["jobs_left"] == 4 + 4 * left_cells and abs(eta["seconds"] - want) < 5
    # a stage with no measured job costs its declared share of a train job (evaluate 0.05, probes
    # 0.025, tabulate 0.003), from the first measured train on
    share = 600 * (0.05 + 0.025 + 0.003)
    early = collection_eta(st, {"train": 600.0}, 2)
    assert early["unmeasured"] == [] and early["estimated"] == ["evaluate", "probes", "tabulate"]
    assert abs(early["seconds"] - (449 * 1.5 + share + left_cells * (600 + share)) / 2) < 5
    # before any train has finished, the running one's pace: 1200 steps at 1.5 s
    pace = collection_eta(st, {}, 2)
    whole = 1200 * 1.5
    assert abs(pace["seconds"] - (449 * 1.5 + whole * 0.078 + left_cells * whole * 1.078) / 2) < 10
    assert "from their share of a train job until measured" in eta_text(pace, {})
    # nothing measured and no train running: unknown, and said so
    idle = {**st, "cells": [c for c in st["cells"] if c["cell_id"] != running]}
    assert collection_eta(idle, {}, 2)["unmeasured"] == sorted(["train", "evaluate", "probes", "tabulate"])


def test_the_status_command_exits_non_zero_on_an_error(tmp_path):
    """`python -m latentstrat.status` as a script runs it: its exit code is main's (2 for a
    config that does not load, or --requests with nothing measured), not always 0."""
    import sys

    bad = subprocess.run(
        [sys.executable, "-m", "latentstrat.status", "--configfile", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "nope.yaml" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"extends: {ROOT / 'config' / 'smoke.yaml'}\nresults_dir: {tmp_path / 'results'}\n")
    (tmp_path / "results").mkdir()
    none = subprocess.run(
        [sys.executable, "-m", "latentstrat.status", "--configfile", str(cfg), "--requests"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert none.returncode == 2 and "no benchmark file" in none.stderr
    # a stray word (a config path without --configfile) and a results folder that does not exist:
    # one-line errors, non-zero, never the default collection at 0 cells
    for args, want in (
        (["config/quick.yaml"], "unrecognized arguments: config/quick.yaml"),
        (["--configfile", str(cfg), "results/nonexistent"], "unrecognized arguments: results/nonexistent"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "latentstrat.status", *args], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2 and want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    gone = tmp_path / "g.yaml"
    gone.write_text(f"extends: {ROOT / 'config' / 'smoke.yaml'}\nresults_dir: {tmp_path / 'nowhere'}\n")
    r = subprocess.run(
        [sys.executable, "-m", "latentstrat.status", "--configfile", str(gone)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "nowhere of " in r.stderr and "does not exist" in r.stderr and "smoke" in r.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "latentstrat.status", "--configfile", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and ok.stdout.startswith(f"collection smoke (results in {tmp_path / 'results'})")
    from latentstrat.status import per_job_text

    assert per_job_text({"train": float("nan")}) == "no job of this collection measured yet (the pace so far)"
    assert per_job_text({"train": 600.0, "evaluate": float("nan")}) == "median per job measured here: train 10 min"


def test_a_job_killed_for_memory_says_so_with_the_peak_and_the_request(tmp_path):
    """Slurm's OUT_OF_MEMORY: the cell's stage reads failed, killed for memory, with the peak the
    rule's finished jobs reached (their benchmark files) and the mem_mb to set (peak x 1.5)."""
    from latentstrat.status import memory_detail, sizing

    cfg = load_config(ROOT / "config" / "smoke.yaml", overrides={"results_dir": str(tmp_path / "results")})
    p = Paths.from_config(cfg)
    cells = [c.cell_id for c in expand_cells(cfg)]
    bench = p.bench_path("train", cells[1])
    bench.parent.mkdir(parents=True, exist_ok=True)
    bench.write_text("s\th:m:s\tmax_rss\n61.2\t0:01:01\t2301.5\n")
    jobs = [{"id": "103", "state": "OUT_OF_MEMORY", "comment": f"rule_train_wildcards_{cells[0]}"}]
    st = collection_status(cfg, jobs=jobs)
    train = next(c for c in st["cells"] if c["cell_id"] == cells[0])["stages"]["train"]
    assert train["state"] == "failed" and train["detail"].startswith("killed for memory by Slurm (OUT_OF_MEMORY)")
    assert "finished train jobs peaked at 2302 MB" in train["detail"]
    assert "set `set-resources: train: mem_mb: 3500`" in train["detail"]  # 2301.5 x 1.5 -> 3500 (to 100 MB)
    assert "1 failed (1 killed for memory)" in st["summary"] and "killed for memory" in render(st)
    # the job's own peak (sacct) counts when larger; nothing measured: the advice still names the rule
    table = sizing.measured(p)
    assert "mem_mb: 6000" in memory_detail("train", "103", table, peak_of=lambda job: 4000.0)
    empty = table.iloc[0:0]
    assert "raise `set-resources: evaluate: mem_mb`" in memory_detail(
        "evaluate", None, empty, peak_of=lambda j: math.nan
    )
