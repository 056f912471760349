"""Where a collection stands: its base (data, entangle, reference, step 0) and cells x stages as
done / corrupt / running / pending / failed / missing / stale, from the files the jobs write and
the Slurm queue (no workflow graph is built).

    python -m latentstrat.status --configfile config/config.yaml [--json]
    python -m latentstrat.status --configfile config/config.yaml --rerun-corrupt [-- snakemake args]
    python -m latentstrat.status --configfile config/config.yaml --requests [--margin 1.5]
    python -m latentstrat.status --configfile config/config.yaml --jobs 2   # the ETA at 2 jobs at once

- done: the stage's outputs exist and read (parquet, safetensors, json) (stale: done, but the
  cell was trained with other code than the working tree's; see the Collection Metadata section
  of a report);
- corrupt: an output exists but does not read (named in the detail); `--rerun-corrupt` reruns
  exactly the jobs that wrote such files, and everything downstream of them, through Snakemake
  (`--forcerun` on those files; default snakemake arguments `--cores 2`);
- running / pending: a Slurm job of that stage and cell is running / waiting, or (a local run)
  its log (a train job writes a progress line every 30 s) changed in the last 2 minutes;
- failed: its Slurm job ended in a failed state, or its log ends in an error (the last line is
  shown);
- missing: none of these.

A running train job shows its step, total and ETA (the progress file it rewrites with each log
line, paths.PROGRESS_FILE). The collection's ETA: the jobs left (per cell, its stages not done)
times each stage's median measured wall time in this collection (its benchmark files), a running
train job counted by its own ETA, spread over the jobs that run at once (`--jobs`; default the cell
jobs running now); unknown while a stage left has no measured job yet.

`--requests` reads the benchmark file every job writes and prints, per rule, the largest
measured wall time and peak memory and the `mem_mb` / `runtime` a Slurm job of that rule should
request (latentstrat.status.sizing).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from latentstrat.cells import expand_cells, init_id
from latentstrat.config import ConfigError, load_config
from latentstrat.io import unreadable
from latentstrat.paths import Paths
from latentstrat.runtime import host
from latentstrat.runtime.progress import read_progress
from latentstrat.stages import BASE_STAGES, BY_NAME, CELL_STAGES
from latentstrat.stages import names as stage_names
from latentstrat.status import sizing

SLURM_RULES = {name: (name,) for name in (*CELL_STAGES, *BASE_STAGES)}
FAILED_STATES = {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
RECENT_S = 120


def slurm_jobs() -> list[dict]:
    """Jobs Slurm knows (squeue -t all: recent finished ones too), with the rule and cell the
    executor plugin writes into each job's comment; [] where Slurm is absent."""
    if shutil.which("squeue") is None:
        return []
    try:
        out = subprocess.run(
            ["squeue", "-h", "-t", "all", "-o", "%i|%T|%k"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    jobs = []
    for line in out.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3:
            jobs.append({"id": parts[0], "state": parts[1], "comment": parts[2]})
    return jobs


def _slurm_state(jobs, stage: str, cid: str):
    """(state, job id) of the newest Slurm job of this stage and cell, or (None, None)."""
    mine = [j for j in jobs if cid in j["comment"] and any(f"rule_{r}" in j["comment"] for r in SLURM_RULES[stage])]
    if not mine:
        return None, None
    j = max(mine, key=lambda j: int(j["id"].split("_")[0]) if j["id"].split("_")[0].isdigit() else 0)
    return j["state"], j["id"]


def slurm_peak_mb(job: str | None) -> float:
    """A finished Slurm job's peak memory (sacct MaxRSS, MB); NaN where sacct has none."""
    if not job or shutil.which("sacct") is None:
        return math.nan
    try:
        out = subprocess.run(
            ["sacct", "-n", "-P", "-j", str(job), "-o", "MaxRSS"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return math.nan
    scale = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}
    peaks = [
        float(v[:-1]) * scale[v[-1]] for v in out.split() if v and v[-1] in scale and v[:-1].replace(".", "").isdigit()
    ]
    return max(peaks, default=math.nan)


def memory_detail(rule: str, job: str | None, measured, peak_of=slurm_peak_mb) -> str:
    """A job Slurm killed for memory: its own peak (sacct), the largest peak measured for the rule
    (its benchmark files), and the request to set (the larger one times 1.5)."""
    own = peak_of(job)
    row = measured[measured.rule == rule] if len(measured) else measured
    bench = float(row.max_rss_mb.iloc[0]) if len(row) and not math.isnan(row.max_rss_mb.iloc[0]) else math.nan
    peaks = [x for x in (own, bench) if not math.isnan(x)]
    said = [f"this job reached {own:.0f} MB" if not math.isnan(own) else "",
            f"finished {rule} jobs peaked at {bench:.0f} MB" if not math.isnan(bench) else ""]  # fmt: skip
    text = "killed for memory by Slurm (OUT_OF_MEMORY)" + "".join(f"; {x}" for x in said if x)
    if peaks:
        mem = sizing.mem_request(max(peaks))
        return text + f"; set `set-resources: {rule}: mem_mb: {mem}` in the Slurm profile (peak x 1.5)"
    return text + f"; raise `set-resources: {rule}: mem_mb` in the Slurm profile (no peak measured yet)"


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _log_failed(path: Path) -> bool:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return "Traceback (most recent call last)" in text or "\nError" in text


def _recently_written(paths) -> bool:
    now = time.time()
    return any(f.exists() and now - f.stat().st_mtime < RECENT_S for f in paths)


def stage_outputs(p: Paths, cid: str, tasks: list[str]) -> dict[str, list[Path]]:
    """A cell's outputs per cell stage (their declarations' files)."""
    return {s: [Path(f) for f in p.stage_files(s, cid, tasks=tasks).values()] for s in CELL_STAGES}


def base_outputs(cfg: dict, p: Paths) -> dict[str, list[Path]]:
    """The base stages' outputs (their declarations' files), and each step-0 validation the
    collection's cells start from (`step0:<init>`)."""
    mode = cfg["entangle"]["mode"]
    out = {s: [Path(f) for f in p.stage_files(s, mode=mode).values()] for s in stage_names("base")}
    for iid in sorted({init_id(c.settings) for c in expand_cells(cfg)}):
        for s in stage_names("init"):
            out[f"{s}:{iid}"] = [Path(f) for f in p.stage_files(s, iid).values()]
    return out


def stage_state(
    files: list[Path], log: Path, slurm: tuple, checkpoint: Path | None = None, also: list[Path] = ()
) -> dict:
    """{state, job, detail} of one job from its outputs, its log and its Slurm job. `also`: files
    the job writes beside its declared outputs (a trained cell's adapters), read as well; one
    that does not read marks the job corrupt through its first output."""
    state, job = slurm
    if all(f.exists() for f in files):
        bad = next(((f, why) for f in [*files, *also] if (why := unreadable(f))), None)
        if bad:
            return {
                "state": "corrupt",
                "job": job,
                "detail": f"{bad[0]}: {bad[1]}",
                "file": str(bad[0] if bad[0] in files else files[0]),
            }
        return {"state": "done", "job": job, "detail": ""}
    if state in ("RUNNING", "COMPLETING", "CONFIGURING"):
        return {"state": "running", "job": job, "detail": ""}
    if state in ("PENDING", "REQUEUED", "SUSPENDED"):
        return {"state": "pending", "job": job, "detail": ""}
    if state == "OUT_OF_MEMORY":
        return {"state": "failed", "job": job, "detail": "killed for memory by Slurm (OUT_OF_MEMORY)", "oom": True}
    if state in FAILED_STATES or (state is None and log.exists() and _log_failed(log)):
        return {"state": "failed", "job": job, "detail": _last_line(log) or f"Slurm state {state}"}
    if state is None and _recently_written([log] + ([checkpoint] if checkpoint else [])):
        return {"state": "running", "job": job, "detail": "its log was written in the last 2 minutes (local run)"}
    have = sum(f.exists() for f in files)
    if not have and not log.exists():  # not started yet
        return {"state": "pending", "job": job, "detail": ""}
    return {"state": "missing", "job": job, "detail": f"{have}/{len(files)} outputs" if have else ""}


def collection_status(cfg: dict, jobs: list[dict] | None = None) -> dict:
    """{"base": {stage: {state, job, detail}}, "cells": [{cell_id, arm, stages: {stage: {state, job,
    detail}}}], "corrupt": [files], "summary": str}."""
    p = Paths.from_config(cfg)
    jobs = slurm_jobs() if jobs is None else jobs
    now_code = host.code_version()["code_version"]
    tasks = list(cfg["data"]["tasks"])
    base = {}
    for stage, files in base_outputs(cfg, p).items():
        rule, _, iid = stage.partition(":")
        log = p.log_path(rule, iid)
        base[stage] = stage_state(files, log, _slurm_state(jobs, rule, iid) if iid else _slurm_state(jobs, rule, ""))
    cells = []
    for c in expand_cells(cfg):
        cid, stages = c.cell_id, {}
        outputs = stage_outputs(p, cid, tasks)
        for stage in CELL_STAGES:
            st = stage_state(
                outputs[stage],
                p.log_path(stage, cid),
                _slurm_state(jobs, stage, cid),
                p.train_dir(cid) / "checkpoints" / "last.pt" if stage == "train" else None,
                p.trained_weight_files(cid) if stage == "train" else (),
            )
            if stage == "train" and st["state"] == "running":
                prog = read_progress(p.progress_path(cid))
                if prog:
                    st = {**st, "progress": prog, "detail": progress_text(prog)}
            if stage == "train" and st["state"] == "done":
                code = json.loads(Path(p.train_files(cid)["summary"]).read_text()).get("code_version")
                if code and code != now_code:
                    st = {**st, "state": "stale", "detail": f"trained with {code}, working tree is {now_code}"}
            stages[stage] = st
        cells.append({"cell_id": cid, "arm": c.arm, "stages": stages})
    killed = [(rule.partition(":")[0], v) for rule, v in base.items() if v.get("oom")]
    killed += [(s, v) for c in cells for s, v in c["stages"].items() if v.get("oom")]
    if killed:  # the peaks measured so far and the request each rule should make
        table = sizing.measured(p)
        for rule, v in killed:
            v["detail"] = memory_detail(rule, v["job"], table)
    done = sum(all(s["state"] in ("done", "stale") for s in c["stages"].values()) for c in cells)
    running = sum(any(s["state"] == "running" for s in c["stages"].values()) for c in cells)
    failed = sum(any(s["state"] == "failed" for s in c["stages"].values()) for c in cells)
    corrupt_cells = sum(any(s["state"] == "corrupt" for s in c["stages"].values()) for c in cells)
    stale = sum(c["stages"]["train"]["state"] == "stale" for c in cells)
    corrupt = [s["file"] for s in base.values() if s["state"] == "corrupt"]
    corrupt += [s["file"] for c in cells for s in c["stages"].values() if s["state"] == "corrupt"]
    base_line = ", ".join(base_states(base, skip_done=True))
    n = len(cells)
    jobs_done = ", ".join(
        f"{BY_NAME[s].done_word} {sum(c['stages'][s]['state'] in ('done', 'stale') for c in cells)}/{n}"
        for s in CELL_STAGES
    )
    summary = (
        f"{p.collection}: base: {base_line or 'done'}; {done}/{n} cells done ({jobs_done}), "
        f"{running} running, {failed} failed"
        + (f" ({len(killed)} killed for memory)" if killed else "")
        + (f", {corrupt_cells} corrupt" if corrupt_cells else "")
        + (f", {stale} stale" if stale else "")
    )
    report = p.report_dir / "brief.yaml"
    return {
        "collection": cfg["collection"],
        "results_dir": str(p.results),
        "report": str(p.report_dir) if report.exists() else None,
        "base": base,
        "cells": cells,
        "corrupt": corrupt,
        "summary": summary,
    }


def duration(seconds: float) -> str:
    """`2 h 05 min`, `14 min`, `40 s`."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min" if s >= 60 else f"{s} s"


def progress_text(prog: dict) -> str:
    eta = "" if prog["eta_s"] is None else f", ETA {duration(prog['eta_s'])}"
    return f"{prog['unit']} {prog['done']}/{prog['total']}{eta}"


def train_estimate(status: dict, walls: dict) -> float:
    """A train job's wall time: measured in this collection (`walls`), else from the running
    train jobs' progress (steps done in the time so far, at that pace to the end); NaN before
    either."""
    if math.isfinite(walls.get("train", math.nan)):
        return walls["train"]
    whole = []
    for c in status["cells"]:
        prog = c["stages"]["train"].get("progress")
        if prog and prog.get("eta_s") is not None and 0 < prog["done"] < prog["total"]:
            whole.append(prog["eta_s"] * prog["total"] / (prog["total"] - prog["done"]))
    return statistics.median(whole) if whole else math.nan


def collection_eta(status: dict, walls: dict, jobs: int) -> dict:
    """The time left: per cell, each stage not done costs its median measured wall time (`walls`:
    stage -> seconds), a running train job its own ETA; a stage not measured yet costs its
    declared share of a train job (stages.Stage.share_of_train: `estimated` names it), from the
    first finished or running train on; the sum spread over `jobs` jobs at once (the stages of one
    cell run in order, cells are independent). `seconds` is NaN before any train has measured
    or shown its pace (`unmeasured` names the stages)."""
    left, unmeasured, estimated, n_jobs = 0.0, set(), set(), 0
    train = train_estimate(status, walls)
    for c in status["cells"]:
        for stage in CELL_STAGES:
            st = c["stages"][stage]
            if st["state"] in ("done", "stale"):
                continue
            n_jobs += 1
            prog = st.get("progress")
            if prog and prog.get("eta_s") is not None:
                left += prog["eta_s"]
            elif math.isfinite(walls.get(stage, math.nan)):
                left += walls[stage]
            elif math.isfinite(train) and BY_NAME[stage].share_of_train is not None:
                left += train * BY_NAME[stage].share_of_train
                estimated.add(stage)
            else:
                unmeasured.add(stage)
    jobs = max(int(jobs), 1)
    seconds = math.nan if unmeasured else left / jobs
    return {
        "seconds": seconds,
        "jobs_left": n_jobs,
        "parallel": jobs,
        "unmeasured": sorted(unmeasured),
        "estimated": [s for s in CELL_STAGES if s in estimated],
    }


def eta_text(eta: dict, walls: dict, report: str | None = None) -> str:
    if not eta["jobs_left"]:
        if report:
            return f"collection ETA: every cell done; the report is in {report}"
        return "collection ETA: every cell done (the aggregate and the report follow)"
    if eta["unmeasured"]:
        return f"collection ETA: {unmeasured_text(eta)} ({eta['jobs_left']} cell jobs left)"
    guessed = (
        f"; {', '.join(eta['estimated'])} from their share of a train job until measured"
        if eta.get("estimated")
        else ""
    )
    return (
        f"collection ETA: about {duration(eta['seconds'])} ({eta['jobs_left']} cell jobs left at "
        f"{eta['parallel']} at once; {per_job_text(walls)}{guessed})"
    )


def unmeasured_text(eta: dict) -> str:
    return "unknown until a train job has finished or shown its pace in this collection"


def per_job_text(walls: dict) -> str:
    measured = [f"{k} {duration(v)}" for k, v in walls.items() if math.isfinite(v)]
    if not measured:
        return "no job of this collection measured yet (the pace so far)"
    return "median per job measured here: " + ", ".join(measured)


def base_states(base: dict, skip_done: bool = False) -> list[str]:
    """The base stages' states in words: the shared stages one by one (`data done`), the step-0
    validations (one per init, as many as pairs) counted per state (`12 step0 missing`)."""
    out = [f"{k} {v['state']}" for k, v in base.items() if not k.startswith("step0:")]
    step0 = Counter(v["state"] for k, v in base.items() if k.startswith("step0:"))
    out += [f"{n} step0 {state}" for state, n in sorted(step0.items())]
    return [x for x in out if not (skip_done and x.endswith(" done"))]


def render(status: dict) -> str:
    lines = [
        f"collection {status['collection']} (results in {status['results_dir']})",
        "base: " + "  ".join(base_states(status["base"])),
    ]
    notes = [
        f"  {k}: {v['state']}"
        + (f" (Slurm job {v['job']})" if v["job"] else "")
        + (f": {v['detail']}" if v["detail"] else "")
        for k, v in status["base"].items()
        if v["state"] not in ("done", "missing")
    ]
    width = max(len(c["cell_id"]) for c in status["cells"]) if status["cells"] else 10
    lines.append(f"{'cell':<{width}}  " + "  ".join(f"{s:<9}" for s in CELL_STAGES))
    for c in status["cells"]:
        row = []
        for s in CELL_STAGES:
            st = c["stages"][s]
            row.append(f"{st['state']:<9}")
            if (
                st["state"] in ("failed", "stale", "corrupt")
                or (st["job"] or st.get("progress"))
                and st["state"] != "done"
            ):
                notes.append(
                    f"  {c['cell_id']} {s}: {st['state']}"
                    + (f" (Slurm job {st['job']})" if st["job"] else "")
                    + (f": {st['detail']}" if st["detail"] else "")
                )
        lines.append(f"{c['cell_id']:<{width}}  " + "  ".join(row))
    if status["corrupt"]:
        notes.append(
            f"  {len(status['corrupt'])} unreadable output(s): `python -m latentstrat.status --configfile "
            "<config> --rerun-corrupt` reruns the jobs that wrote them and what depends on them"
        )
    return "\n".join(lines + notes + [status["summary"]] + ([status["eta_text"]] if status.get("eta_text") else []))


def start_line(cfg: dict, parallel: int | None, configfile: str = "config/config.yaml") -> str:
    """The line a run starts with: cells done and left, and the time left at `parallel` cell jobs
    at once from this collection's measured jobs (status.collection_eta)."""
    st = collection_status(cfg, jobs=[])
    walls = stage_walls(Paths.from_config(cfg))
    eta = collection_eta(st, walls, parallel or 1)
    n = len(st["cells"])
    left = sum(any(s["state"] not in ("done", "stale") for s in c["stages"].values()) for c in st["cells"])
    head = f"{n} cells, {left} to run"
    if not eta["jobs_left"]:
        return f"{head}: every cell done"
    if eta["unmeasured"]:
        return (
            f"{head}: time {unmeasured_text(eta)} (then `python -m latentstrat.status --configfile {configfile}` "
            "gives the ETA; the README "
            "gives the main job's time per core count)"
        )
    return f"{head}: about {duration(eta['seconds'])} at {eta['parallel']} cell job(s) at once ({per_job_text(walls)})"


def stage_walls(p: Paths) -> dict:
    """Per cell stage, the median wall seconds of this collection's measured jobs (NaN: none yet)."""
    table = sizing.measured(p).set_index("rule")
    return {stage: float(table.median_wall_s.get(stage, math.nan)) for stage in CELL_STAGES}


def rerun_corrupt_command(configfile: str, corrupt: list[str], snakemake_args: list[str]) -> list[str]:
    """Snakemake forcing the jobs that wrote the unreadable files (and so everything downstream)."""
    return ["snakemake", "--configfile", configfile, *(snakemake_args or ["--cores", "2"]), "--forcerun", *corrupt]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.status", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", default="config/config.yaml", help="the collection config (as for snakemake)")
    ap.add_argument("--json", action="store_true", help="print the status as JSON instead of a table")
    ap.add_argument(
        "--rerun-corrupt",
        action="store_true",
        help="rerun the jobs whose outputs do not read, and what depends on them (arguments after -- go "
        "to snakemake; default --cores 2)",
    )
    ap.add_argument(
        "--requests",
        action="store_true",
        help="per rule, the measured wall time and peak memory of the jobs run so far and the Slurm "
        "mem_mb / runtime they call for, as a set-resources block for the profile (latentstrat.status.sizing)",
    )
    ap.add_argument("--margin", type=float, default=1.5, help="with --requests: requested / measured (default 1.5)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="cell jobs that run at once, for the collection's ETA (default: those running now; a local run: "
        "--cores / resources.threads)",
    )
    ap.add_argument("snakemake_args", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.snakemake_args and not a.rerun_corrupt:  # words for snakemake only go with --rerun-corrupt
        print(
            f"error: unrecognized arguments: {' '.join(a.snakemake_args)} (the collection is --configfile FILE)",
            file=sys.stderr,
        )
        return 2
    try:
        cfg = load_config(a.configfile)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    paths = Paths.from_config(cfg)
    if not paths.results.is_dir():
        print(
            f"error: results_dir {paths.results} of {a.configfile} does not exist: nothing has run for collection "
            f"{paths.collection} here (check --configfile and results_dir)",
            file=sys.stderr,
        )
        return 2
    if a.requests:
        table = sizing.measured(Paths.from_config(cfg))
        if not table.jobs.any():
            print(
                f"error: no benchmark file under {Paths.from_config(cfg).bench_dir} yet: run some jobs first",
                file=sys.stderr,
            )
            return 2
        print(sizing.render(table, sizing.requests(table, a.margin), a.margin))
        return 0
    st = collection_status(cfg)
    walls = stage_walls(Paths.from_config(cfg))
    running = sum(any(s["state"] == "running" for s in c["stages"].values()) for c in st["cells"])
    st["eta"] = collection_eta(st, walls, a.jobs or running or 1)
    st["eta_text"] = eta_text(st["eta"], walls, st.get("report"))
    if not a.rerun_corrupt:
        print(json.dumps(st, indent=2) if a.json else render(st))
        return 0
    if not st["corrupt"]:
        print("no unreadable outputs: nothing to rerun")
        return 0
    cmd = rerun_corrupt_command(a.configfile, st["corrupt"], a.snakemake_args)
    print("unreadable: " + ", ".join(st["corrupt"]) + "\n" + " ".join(cmd), flush=True)
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    return subprocess.run([snakemake, *cmd[1:]]).returncode


if __name__ == "__main__":
    sys.exit(main())
