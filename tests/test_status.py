"""python -m latentstrat.status: cells x stages from files and the Slurm queue (fake jobs here;
tests/test_slurm.py runs it against a real cluster)."""
import json
import os
import time
from pathlib import Path

from latentstrat import host
from latentstrat.config import Paths, expand_cells, load_config
from latentstrat.status import collection_status, main, render, stage_outputs

ROOT = Path(__file__).resolve().parents[1]


def test_states_from_files_logs_and_slurm(tmp_path, capsys):
    cfg = load_config(ROOT / "config" / "smoke.yaml", overrides={"results_dir": str(tmp_path / "results")})
    p = Paths.from_config(cfg)
    cells = [c.cell_id for c in expand_cells(cfg)]
    done, failed, running, pending, stale = cells[:5]
    tasks = list(cfg["data"]["tasks"])
    for cid in (done, stale):
        for files in stage_outputs(p, cid, tasks).values():
            for f in files:
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text("{}")
    now = host.code_version()["code_version"]
    (p.train_dir(done) / "summary.json").write_text(json.dumps({"code_version": now}))
    (p.train_dir(stale) / "summary.json").write_text(json.dumps({"code_version": "0ld0ld0ld0ld"}))
    log = p.log_path("train", failed)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("step 3/6\nTraceback (most recent call last):\n  ...\nValueError: checkpoint x is broken\n")
    old = time.time() - 3600
    os.utime(log, (old, old))
    jobs = [{"id": "101", "state": "RUNNING", "comment": f"rule_train_wildcards_{running}"},
            {"id": "102", "state": "PENDING", "comment": f"rule_evaluate_wildcards_{pending}"},
            {"id": "99", "state": "COMPLETED", "comment": f"rule_train_wildcards_{pending}"}]
    for f in stage_outputs(p, pending, tasks)["train"]:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("{}")
    st = collection_status(cfg, jobs=jobs)
    by = {c["cell_id"]: {s: v["state"] for s, v in c["stages"].items()} for c in st["cells"]}
    assert by[done] == dict.fromkeys(["train", "evaluate", "probes", "metrics"], "done")
    assert by[stale]["train"] == "stale"
    assert by[failed]["train"] == "failed"
    assert next(c for c in st["cells"] if c["cell_id"] == failed)["stages"]["train"]["detail"].startswith("ValueError")
    assert by[running]["train"] == "running" and by[pending] == {"train": "done", "evaluate": "pending",
                                                                 "probes": "missing", "metrics": "missing"}
    assert st["summary"] == f"2/{len(cells)} cells done, 1 running, 1 failed, 1 stale"
    text = render(st)
    assert "Slurm job 101" in text and "ValueError: checkpoint x is broken" in text and text.endswith(st["summary"])
    # the command: --json and a missing config in one line
    assert main(["--configfile", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
