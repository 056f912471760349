"""Slurm requests from the jobs' benchmark files (latentstrat.status.sizing): hand-computed requests,
unreadable and missing files, and a block that Snakemake's Slurm profile accepts."""

import math
import subprocess
import sys

import pytest
import yaml

from latentstrat.config import load_config
from latentstrat.paths import BENCH_RULES, Paths
from latentstrat.status import sizing
from workflow_helpers import ROOT, copy_workflow, dry_run, rules, snakemake

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def bench(path, wall, rss):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{wall}\t0:00:00\t{rss}\t0\t0\t0\t0\t0\t0\t0\n")


@pytest.fixture
def paths(tmp_path):
    cfg = load_config(ROOT / "config" / "smoke.yaml", overrides={"results_dir": str(tmp_path / "results")})
    return Paths.from_config(cfg)


def test_requests_are_the_largest_measured_job_times_the_margin(paths):
    bench(paths.bench_path("train", "cell-a"), 250.0, 880.0)
    bench(paths.bench_path("train", "cell-b"), 610.0, 901.0)  # the slowest and the largest decide
    bench(paths.bench_path("evaluate", "cell-a"), 30.0, "NA")  # too short to sample memory
    bench(paths.bench_path("data"), 5.0, 120.0)
    (paths.bench_path("probes", "cell-a")).parent.mkdir(parents=True)
    paths.bench_path("probes", "cell-a").write_text("s\th:m")  # a job killed mid-write
    table = sizing.measured(paths)
    assert list(table.rule) == list(BENCH_RULES)
    t = table.set_index("rule")
    assert t.loc["train", "jobs"] == 2 and t.loc["train", "max_wall_s"] == 610.0 and t.loc["train", "max_rss_mb"] == 901
    assert t.loc["probes", "jobs"] == 0 and t.loc["probes", "unreadable"] == 1
    assert math.isnan(t.loc["evaluate", "max_rss_mb"])
    req = sizing.requests(table, margin=1.5)
    # 901 MB x 1.5 = 1351.5 -> 1400; 610 s x 1.5 = 915 s -> 16 min; data: 180 MB -> the 500 MB floor, 5 min floor
    assert req["train"] == {"mem_mb": 1400, "runtime": 16}
    assert req["evaluate"] == {"runtime": 5}  # no memory measured: the workflow's value stays
    assert req["data"] == {"mem_mb": 500, "runtime": 5}
    assert set(req) == {"train", "evaluate", "data"}  # unmeasured rules keep the defaults
    text = sizing.render(table, req, 1.5)
    assert "not measured" in text and "1 unreadable" not in text  # probes has no readable job at all
    assert yaml.safe_load(text.split("runtime in minutes):\n")[1]) == {"set-resources": req}
    with pytest.raises(ValueError, match="margin 0.9"):
        sizing.requests(table, margin=0.9)


def test_the_bench_paths_are_the_ones_the_rules_write(tmp_path):
    """The sizing reads the benchmark files at Paths.bench_path; the workflow refuses to load when
    a rule writes its benchmark elsewhere (check_layout), so the two cannot drift apart."""
    wd = copy_workflow(tmp_path)
    rule_file = wd / "workflow" / "rules" / "evaluate.smk"
    text = rule_file.read_text()
    assert "/benchmarks/evaluate/{{cell}}.tsv" in text
    rule_file.write_text(text.replace("/benchmarks/evaluate/{{cell}}.tsv", "/benchmarks/eval/{{cell}}.tsv"))
    out = snakemake(wd, "-n")
    err = out.stdout + out.stderr
    assert out.returncode != 0 and "rule evaluate (workflow/rules/evaluate.smk): its benchmark is" in err, err[-2000:]
    p = Paths.from_config(load_config(ROOT / "config" / "smoke.yaml"))
    assert p.bench_path("evaluate", "{cell}").parts[-2:] == ("evaluate", "{cell}.tsv")
    assert str(p.bench_path("evaluate", "{cell}")).replace(str(p.results), str(wd / "results")) in err


@pytest.mark.slow
def test_the_requests_block_is_accepted_by_a_slurm_dry_run(tmp_path):
    """`status --requests` on a collection's benchmark files prints a block that `snakemake -n
    --profile slurm` takes (appended to the Slurm profile)."""
    wd = copy_workflow(tmp_path)
    cfg_path = wd / "config" / "sized.yaml"
    cfg_path.write_text(f"extends: smoke.yaml\nresults_dir: {wd / 'results'}\n")
    p = Paths.from_config(load_config(cfg_path))
    for rule in BENCH_RULES:
        bench(p.bench_path(rule, "x"), 70.0, 300.0)
    out = subprocess.run(
        [sys.executable, "-m", "latentstrat.status", "--configfile", str(cfg_path), "--requests"],
        cwd=wd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    block = out.stdout.split("runtime in minutes):\n")[1]
    assert yaml.safe_load(block)["set-resources"]["train"] == {"mem_mb": 500, "runtime": 5}
    prof = wd / "workflow" / "profiles" / "slurm" / "config.yaml"
    prof.write_text(prof.read_text() + "\n" + block)
    rc, jobs, dout = dry_run(wd, "--profile", "slurm", configfile="config/sized.yaml")
    assert rc == 0, dout[-2000:]
    assert rules(jobs)["train"] >= 1, dout[-2000:]
