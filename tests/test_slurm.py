"""The smoke collection through `snakemake --profile slurm` on a real (one-node) Slurm cluster.

Needs Debian's slurm-wlm + munge. Uses the cluster named by $SLURM_CONF if it answers; else
starts one with .ci/slurm/start.sh (root only) and stops it afterwards. Skipped, with the
reason, when neither works. The grid is the smoke collection's, cut to one family x 2 betas
(no comparison arm) to fit 2 CPU cores; every rule still runs as Slurm jobs.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from latentstrat.cells import expand_cells
from latentstrat.config import load_config
from latentstrat.paths import Paths
from workflow_helpers import copy_workflow, dry_run, rules, tiny_collection

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
GRID = ["grid={reconstruction_family: [tokcc_a0.25], beta: [0.01, 0.1]}", "comparison_arms=[]"]
CELL = "agg-sum_fam-tokcc_a0.25_beta-0.1_zdim-8_seed-314159"


def sinfo_ok(env) -> bool:
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and any(s in r.stdout for s in ("idle", "mixed", "allocated"))


@pytest.fixture(scope="module")
def slurm_env():
    env = dict(os.environ)
    if os.environ.get("SLURM_CONF") and sinfo_ok(env):
        yield env
        return
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip("Slurm not reachable (sinfo fails) and slurm-wlm/munge not installed")
    if os.geteuid() != 0:
        pytest.skip("Slurm not reachable (sinfo fails) and starting one needs root")
    r = subprocess.run([str(ROOT / ".ci/slurm/start.sh")], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"could not start the local Slurm cluster: {r.stderr[-500:]}")
    env["SLURM_CONF"] = r.stdout.strip().split("=", 1)[1]
    assert sinfo_ok(env), "cluster started but sinfo does not show the node"
    yield env
    subprocess.run([str(ROOT / ".ci/slurm/stop.sh")], capture_output=True, timeout=120)


def slurm_run(wd, env, *args, configfile=None):
    """`snakemake --profile slurm` in `wd`: the cut smoke collection (GRID, results under wd),
    or the collection config `configfile`; `args` (targets, options) come first, since
    `--configfile` and `--config` take every word after them."""
    # the CI node: 2 CPUs, no sacct;
    # its jobs take 10-15 s, so the first status check comes after 4 s, not the profile's 10 (the
    # plugin adds 10 s to the interval after each round that finds no job finished)
    collection = (
        ["--configfile", configfile]
        if configfile
        else ["--configfile", "config/smoke.yaml", "--config", f"results_dir={wd / 'results'}", *GRID]
    )
    cmd = [
        SNAKEMAKE,
        *args,
        "--profile",
        "slurm",
        "--cores",
        "2",
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "4",
        *collection,
    ]
    return subprocess.Popen(cmd, cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def status_of(wd, env):
    """`python -m latentstrat.status` as a user would run it (the smoke config, this run's
    results folder and grid): cell -> stage -> (state, Slurm job id)."""
    import json

    cfg = wd / "status.yaml"
    cfg.write_text(
        f"extends: {wd / 'config' / 'smoke.yaml'}\nresults_dir: {wd / 'results'}\n"
        "grid: {reconstruction_family: [tokcc_a0.25], beta: [0.01, 0.1]}\ncomparison_arms: []\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "latentstrat.status", "--configfile", str(cfg), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=wd,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    st = json.loads(r.stdout)
    return {c["cell_id"]: {s: (v["state"], v["job"]) for s, v in c["stages"].items()} for c in st["cells"]}


def jobs_of(env, rule, cell):
    r = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%k"], env=env, capture_output=True, text=True)
    return [line.split("|")[:2] for line in r.stdout.splitlines() if f"rule_{rule}" in line and cell in line]


def test_smoke_collection_on_slurm_and_cancelled_cell_reruns_alone(slurm_env, tmp_path):
    wd = copy_workflow(tmp_path)  # with `slurm` -> workflow/profiles/slurm, as in the repository
    env = {**slurm_env, "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}

    # 1. the whole (cut) smoke collection, every job a Slurm job
    p = slurm_run(wd, env)
    out, _ = p.communicate(timeout=3000)
    assert p.returncode == 0, out[-4000:]
    report = wd / "results" / "smoke" / "report"
    assert (report / "results.md").exists() and (report / "brief.yaml").exists()
    assert "Submitted" in out or "submitted" in out
    rc, jobs, dout = dry_run(wd, config=GRID)
    assert rc == 0 and jobs == [], dout[-2000:]

    # 2. rerun one cell and cancel its train job mid-run: the run fails, the partial report lists it
    for d in [*(wd / "results" / "base").glob(f"*/cells/*/{CELL}"), wd / "results" / "smoke" / "cells" / CELL]:
        shutil.rmtree(d)
    p = slurm_run(wd, env, "--retries", "0")
    deadline = time.time() + 600
    cancelled = None
    seen_running = None
    while time.time() < deadline and cancelled is None:
        for jid, state in jobs_of(env, "train", CELL):
            if state == "RUNNING":
                seen_running = status_of(wd, env)  # the status command, mid-run
                subprocess.run(["scancel", jid], env=env, check=True)
                cancelled = jid
        time.sleep(1)
    out, _ = p.communicate(timeout=1200)
    assert cancelled, "never saw the cell's train job running\n" + out[-3000:]
    assert p.returncode != 0, out[-3000:]
    brief = (report / "brief.yaml").read_text()
    assert CELL in brief  # listed as incomplete by the onerror partial report
    assert seen_running[CELL]["train"] == ("running", cancelled)
    others = {c: s for c, s in seen_running.items() if c != CELL}
    assert all(s["train"][0] == "done" for s in others.values()), others
    after = status_of(wd, env)
    assert after[CELL]["train"] == ("failed", cancelled)  # CANCELLED in the queue
    assert all(s["tabulate"][0] == "done" for c, s in after.items() if c != CELL)

    # 3. the next run does only that cell (+ collection jobs), to completion
    rc, jobs, dout = dry_run(wd, config=GRID)
    assert rc == 0, dout[-2000:]
    assert {c for r, c, _ in jobs if c} == {CELL}
    assert rules(jobs)["train"] == 1 and rules(jobs)["aggregate"] == 1
    p = slurm_run(wd, env)
    out, _ = p.communicate(timeout=1800)
    assert p.returncode == 0, out[-4000:]
    assert CELL not in (report / "brief.yaml").read_text().split("incomplete:")[1].split("\n")[0]


def test_a_requeued_train_job_resumes_from_its_checkpoint_and_ends_equal(slurm_env, tmp_path):
    """`scontrol requeue` of a running train job after its first checkpoint (what preemption does):
    the job checkpoints on SIGTERM, goes back to the queue (the profile's slurm-requeue), runs
    again, resumes from that step, and the cell ends with the adapters and heads of an
    uninterrupted run (the same cell retrained locally)."""
    wd = copy_workflow(tmp_path)
    env = {**slurm_env, "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}
    cfg = tiny_collection(
        wd,
        "requeue",
        {"reconstruction_family": ["raw"], "beta": [0.1]},
        train={"steps": 60, "eval_every": 60, "checkpoint_every": 5},
    )
    p = Paths.from_config(load_config(cfg))
    (cid,) = [c.cell_id for c in expand_cells(load_config(cfg))]
    train_dir = p.train_dir(cid)
    summary = str(train_dir / "summary.json")

    def local(*args):  # the same collection, run here (not on Slurm)
        r = subprocess.run(
            [SNAKEMAKE, *args, "--cores", "2", "--configfile", str(cfg)],
            cwd=wd,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]

    # the base stages locally (what this test is not about), then the cell's train job on Slurm
    local(summary, "--omit-from", "train")
    run = slurm_run(wd, env, summary, configfile=str(cfg))
    requeued, released, seen, deadline = None, False, [], time.time() + 900
    while time.time() < deadline and not released and run.poll() is None:
        for jid, state in jobs_of(env, "train", cid):
            seen.append(state)
            if requeued is None and state == "RUNNING" and (train_dir / "checkpoints" / "last.pt").exists():
                subprocess.run(["scontrol", "requeue", jid], env=env, check=True)
                requeued = jid
            elif requeued == jid and state in ("PENDING", "REQUEUED", "REQUEUE_FED"):
                # Slurm holds a requeued job for a while (BeginTime); the test releases it at once
                r = subprocess.run(["scontrol", "update", f"jobid={jid}", "StartTime=now"], env=env)
                released = r.returncode == 0
        time.sleep(0.5)
    out, _ = run.communicate(timeout=1200)
    states = " ".join(dict.fromkeys(seen))
    assert requeued and released, f"train job states seen: {states}\n" + out[-3000:]
    assert run.returncode == 0, out[-4000:]
    log = p.log_path("train", cid).read_text()
    assert "resumed from step" in log, log[-2000:]
    assert int(log.split("resumed from step")[1].split()[0]) >= 5
    files = [
        "adapters/generator/adapter_model.safetensors",
        "adapters/posterior/adapter_model.safetensors",
        "heads/heads.safetensors",
    ]
    requeued_bytes = {f: (train_dir / f).read_bytes() for f in files}
    shutil.rmtree(train_dir)  # checkpoints too: the local run trains from step 0, uninterrupted
    local(summary)
    assert "resumed from step" not in p.log_path("train", cid).read_text()
    for f in files:
        assert (train_dir / f).read_bytes() == requeued_bytes[f], f
