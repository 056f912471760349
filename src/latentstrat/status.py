"""Where a collection stands: cells x stages as done / running / pending / failed / missing /
stale, from the files the jobs write and the Slurm queue (no workflow graph is built).

    python -m latentstrat.status --configfile config/config.yaml [--json]

- done: the stage's outputs exist (stale: done, but the cell was trained with other code than
  the working tree's; see the Collection Metadata section of a report);
- running / pending: a Slurm job of that stage and cell is running / waiting, or (a local run)
  its log (a train job writes a progress line every 30 s) changed in the last 2 minutes;
- failed: its Slurm job ended in a failed state, or its log ends in an error (the last line is
  shown);
- missing: none of these.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from latentstrat import host
from latentstrat.config import ConfigError, Paths, expand_cells, load_config

STAGES = ("train", "evaluate", "probes", "metrics")
SLURM_RULES = {"train": ("train",), "evaluate": ("evaluate",), "probes": ("probe_task", "probe_global"),
               "metrics": ("metrics",)}
FAILED_STATES = {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
RECENT_S = 120


def slurm_jobs() -> list[dict]:
    """Jobs Slurm knows (squeue -t all: recent finished ones too), with the rule and cell the
    executor plugin writes into each job's comment; [] where Slurm is absent."""
    if shutil.which("squeue") is None:
        return []
    try:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%T|%k"], capture_output=True, text=True,
                             timeout=30).stdout
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
    train = p.train_files(cid)
    return {"train": [Path(train["cell_model"]), Path(train["summary"])],
            "evaluate": [p.records_path(cid)],
            "probes": [Path(f) for f in p.probe_files(cid, tasks)],
            "metrics": [p.metrics_path(cid)]}


def collection_status(cfg: dict, jobs: list[dict] | None = None) -> dict:
    """{"cells": [{cell_id, arm, stages: {stage: {state, job, detail}}}], "summary": str}."""
    p = Paths.from_config(cfg)
    jobs = slurm_jobs() if jobs is None else jobs
    now_code = host.code_version()["code_version"]
    tasks = list(cfg["data"]["tasks"])
    cells = []
    for c in expand_cells(cfg, validated=True):
        cid, stages = c.cell_id, {}
        outputs = stage_outputs(p, cid, tasks)
        for stage in STAGES:
            files = outputs[stage]
            state, job = _slurm_state(jobs, stage, cid)
            log = p.log_path(stage, cid)
            detail = ""
            if all(f.exists() for f in files):
                status = "done"
                if stage == "train":
                    try:
                        code = json.loads(files[1].read_text()).get("code_version")
                    except (OSError, json.JSONDecodeError):
                        code = None
                    if code and code != now_code:
                        status, detail = "stale", f"trained with {code}, working tree is {now_code}"
            elif state in ("RUNNING", "COMPLETING", "CONFIGURING"):
                status = "running"
            elif state in ("PENDING", "REQUEUED", "SUSPENDED"):
                status = "pending"
            elif state in FAILED_STATES or (state is None and log.exists() and _log_failed(log)):
                status, detail = "failed", _last_line(log) or f"Slurm state {state}"
            elif state is None and _recently_written([log] + ([p.train_dir(cid) / "checkpoints" / "last.pt"]
                                                             if stage == "train" else [])):
                status, detail = "running", "its log was written in the last 2 minutes (local run)"
            else:
                status = "missing"
                have = sum(f.exists() for f in files)
                detail = f"{have}/{len(files)} outputs" if have else ""
            stages[stage] = {"state": status, "job": job, "detail": detail}
        cells.append({"cell_id": cid, "arm": c.arm, "stages": stages})
    done = sum(all(s["state"] in ("done", "stale") for s in c["stages"].values()) for c in cells)
    running = sum(any(s["state"] == "running" for s in c["stages"].values()) for c in cells)
    failed = sum(any(s["state"] == "failed" for s in c["stages"].values()) for c in cells)
    stale = sum(c["stages"]["train"]["state"] == "stale" for c in cells)
    summary = f"{done}/{len(cells)} cells done, {running} running, {failed} failed" + (f", {stale} stale" if stale else "")
    return {"collection": cfg["collection"], "cells": cells, "summary": summary}


def render(status: dict) -> str:
    width = max(len(c["cell_id"]) for c in status["cells"]) if status["cells"] else 10
    lines = [f"{'cell':<{width}}  " + "  ".join(f"{s:<9}" for s in STAGES)]
    notes = []
    for c in status["cells"]:
        row = []
        for s in STAGES:
            st = c["stages"][s]
            row.append(f"{st['state']:<9}")
            if st["state"] in ("failed", "stale") or (st["job"] and st["state"] != "done"):
                notes.append(f"  {c['cell_id']} {s}: {st['state']}" + (f" (Slurm job {st['job']})" if st["job"] else "")
                             + (f": {st['detail']}" if st["detail"] else ""))
        lines.append(f"{c['cell_id']:<{width}}  " + "  ".join(row))
    return "\n".join(lines + notes + [status["summary"]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m latentstrat.status", description=__doc__.splitlines()[0])
    ap.add_argument("--configfile", default="config/config.yaml", help="the collection config (as for snakemake)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        cfg = load_config(a.configfile)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    st = collection_status(cfg)
    print(json.dumps(st, indent=2) if a.json else render(st))
    return 0


if __name__ == "__main__":
    sys.exit(main())
