"""The Snakemake workflow, through dry runs in a copy of the workflow (its own .snakemake/).

Rerun cases run against a fake complete collection: every output file created, then stamped
in DAG order with Snakemake's touch executor (which also records params/code metadata), so the
dry runs see exactly what a finished collection would.
"""

import os
import re
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from latentstrat.cells import expand_cells, init_id
from latentstrat.config import Base, load_config
from latentstrat.io import dump_json
from latentstrat.paths import Paths
from workflow_helpers import copy_workflow, dry_run, outputs_of, rules, snakemake, tiny_collection

CELL_RULES = {"train", "evaluate", "probes", "tabulate"}


# ----------------------------------------------------------------------------- grid


@pytest.fixture(scope="module")
def wd(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("wf"))


def test_default_config_lists_sum_grid_and_comparison_arm(wd):
    rc, jobs, out = dry_run(wd, configfile="config/config.yaml")
    assert rc == 0, out[-3000:]
    train = [c for r, c, _ in jobs if r == "train"]
    assert len(train) == len(set(train)) == 66
    # 12 settings + 17 replicates: a second seed at every beta, a third at 0.1 and for raw at 0.01
    assert sum(c.startswith("agg-sum_fam-") for c in train) == 29
    assert sum(c.startswith("agg-mean_") for c in train) == 29  # the matched arm
    assert sum(c.startswith("agg-sum_scaled_fam-raw_") for c in train) == 8  # scale or weighting: raw alone
    assert all("_sched-lin300_" in c for c in train)  # the same warm-up in both arms
    second = [c for c in train if c.endswith("seed-314160")]
    assert len(second) == 27  # every setting, both arms, and raw's sum_scaled cells
    third = [c for c in train if c.endswith("seed-314161")]
    assert len(third) == 12 and all("beta-0.1_" in c or "fam-raw_beta-0.01_" in c for c in third)
    assert "agg-sum_fam-raw_beta-1_sched-lin300_seed-314159" in train  # 1 == 1.0, canonical id
    n = rules(jobs)
    assert (n["data"], n["entangle"], n["reference"], n["aggregate"], n["report"]) == (1, 1, 1, 1, 1)
    assert n["probes"] == n["tabulate"] == n["evaluate"] == 66  # one probe job per cell, every task in it
    # one step-0 validation per pair: the two arms of a setting and replicate seed start from one
    # model (their training seed), every other cell from its own
    assert n["step0"] == 29
    # no job groups: a group beside the base checkpoints stops a run (workflow/rules/probes.smk)
    assert "group job" not in out.lower()


def test_smoke_and_aa_configs_list_their_step0_jobs(wd):
    """The smoke collection (24 cells, 12 pairs) runs 12 step-0 validations; the A/A collection
    (42 cells, both arms `sum`, no two cells with one training seed) 42, and lists every job."""
    rc, jobs, out = dry_run(wd, configfile="config/smoke.yaml")
    assert rc == 0, out[-3000:]
    n = rules(jobs)
    assert (n["train"], n["step0"]) == (24, 12), n
    rc, jobs, out = dry_run(wd, configfile="config/aa.yaml")
    assert rc == 0, out[-3000:]
    n = rules(jobs)
    assert (n["train"], n["evaluate"], n["tabulate"], n["step0"], n["report"]) == (42, 42, 42, 42, 1), n
    train = [c for r, c, _ in jobs if r == "train"]
    assert sum(c.endswith(("seed-271828", "seed-271829")) for c in train) == 16
    assert sum(c.endswith("seed-271830") for c in train) == 5


def test_config_overrides_expand_any_axes(wd):
    rc, jobs, out = dry_run(
        wd,
        config=[
            "grid={reconstruction_family: [raw, dist_norm], beta: [0.01, 0.1], token_aggregation: [mean, sum]}",
            "seeds=[1, 2]",
            "comparison_arms=[]",
        ],
    )
    assert rc == 0, out[-3000:]
    train = sorted(c for r, c, _ in jobs if r == "train")
    assert len(train) == 16
    assert {re.search(r"seed-(\d+)", c)[1] for c in train} == {"1", "2"}
    assert sum(c.startswith("agg-mean_fam-dist_norm_beta-0.1_") for c in train) == 2


def test_one_and_one_point_zero_are_one_beta(wd):
    rc, jobs, out = dry_run(wd, config=["grid={beta: [1, 1.0]}", "comparison_arms=[]"])
    assert rc == 0, out[-3000:]
    assert rules(jobs)["train"] == 4  # 4 families x one beta


@pytest.mark.parametrize(
    "config, key",
    [
        (["grid={reconstruction_family: [raw, tokcc_b0.5]}"], "grid.reconstruction_family[1]"),
        (["grid={beta: [0.1, -0.5]}"], "grid.beta[1]"),
        (["grid={beta: []}"], "grid.beta"),
        (["trian={steps: 3}"], "trian"),
        (["train={stpes: 3}"], "train.stpes"),
    ],
)
def test_bad_config_fails_before_any_job_naming_the_key(wd, config, key):
    rc, jobs, out = dry_run(wd, config=config)
    assert rc != 0
    assert "invalid collection config" in out and key in out, out[-2000:]
    assert jobs == [] and "Job stats" not in out
    assert not (wd / "results").exists()


def write_base_config(wd: Path) -> None:
    """What the data rule writes: the smoke config's base settings."""
    cfg = load_config(wd / "config" / "smoke.yaml", overrides={"results_dir": str(wd / "results")})
    dump_json(Base.of(cfg).settings(), wd / "results" / "base" / "smoke-v2" / "data" / "base_config.json")


def test_base_config_guard_names_changed_keys(tmp_path):
    wd = copy_workflow(tmp_path)
    write_base_config(wd)
    rc, _, out = dry_run(wd)
    assert rc == 0, out[-2000:]  # positive control: same settings pass
    rc, jobs, out = dry_run(wd, config=["entangle={steps: 21}", "data={test_per_task: 13}"])
    assert rc != 0 and jobs == []
    assert "data.test_per_task, entangle.steps differ" in out, out[-2000:]


# ----------------------------------------------------------------------------- rerun policy


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A workflow copy whose smoke collection looks finished (fake outputs + metadata)."""
    wd = copy_workflow(tmp_path_factory.mktemp("done"))
    rc, jobs, out = dry_run(wd)
    assert rc == 0, out[-3000:]
    for f in map(Path, outputs_of(out)):
        if f.name in ("aggregate", "figures", "figure_pages", "html"):
            f.mkdir(parents=True, exist_ok=True)
            (f / "x.png").touch()
        else:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.touch()
    # a model file of real size: larger than Snakemake's default checksum limit (1 MB)
    (wd / "results" / "base" / "smoke-v2" / "entangle" / "model" / "model.safetensors").write_bytes(os.urandom(3 << 20))
    write_base_config(wd)
    r = snakemake(wd, "--executor", "touch", "--forceall", "-c1", "-q")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    rc, jobs, out = dry_run(wd)
    assert rc == 0 and jobs == [], out[-3000:]  # nothing to do: the control for every case
    return wd


CELL = "agg-sum_fam-tokcc_a0.25_beta-0.1_zdim-8_seed-314159"


def cell_dirs(wd: Path, cid: str = CELL) -> list[Path]:
    """The cell's work (train/evaluate/probes, under its base) and its collection row (metrics)."""
    (work,) = (wd / "results" / "base" / "smoke-v2" / "cells").glob(f"w*/{cid}")
    return [work, wd / "results" / "smoke" / "cells" / cid]


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_deleting_one_cell_reruns_that_cell_and_the_collection_jobs(done):
    dirs = cell_dirs(done)
    asides = [done / f"aside{i}" for i in range(len(dirs))]
    for d, a in zip(dirs, asides):
        shutil.move(d, a)
    try:
        rc, jobs, out = dry_run(done)
    finally:
        for d, a in zip(dirs, asides):
            shutil.rmtree(d, ignore_errors=True)
            shutil.move(a, d)
    assert rc == 0, out[-3000:]
    assert {c for r, c, _ in jobs if r in CELL_RULES} == {CELL}
    assert rules(jobs) == Counter(train=1, evaluate=1, probes=1, tabulate=1, aggregate=1, report=1, all=1)


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_a_second_collection_on_the_base_reuses_its_cells_and_base(done):
    """A follow-up collection (another name, one more arm) on the same base and cell-work
    settings trains only its new cells; the shared ones and the base stages are not rerun."""
    extra = [
        "collection=smoke-followup",
        "comparison_arms=[{name: mean_lin100, settings: {token_aggregation: mean, beta_schedule: lin100}, "
        "grid: {beta: [0.01, 0.1]}}, "
        "{name: matched_mean, settings: {token_aggregation: mean}}]",
    ]
    rc, jobs, out = dry_run(done, config=extra)
    assert rc == 0, out[-3000:]
    trained = {c for r, c, _ in jobs if r == "train"}
    assert trained and all(c.startswith("agg-mean_") and "sched-lin100" in c for c in trained), trained
    assert not {"data", "entangle", "reference"} & set(rules(jobs))
    n_cells = len({c for r, c, _ in jobs if r == "tabulate"})
    assert n_cells == len(trained) + rules(dry_run(done, "--forceall")[1])["tabulate"]  # every row, new + shared
    # negative control: another train budget is other work, so every cell trains (base still shared)
    rc, jobs, out = dry_run(done, config=extra + ["train={steps: 7}"])
    assert rc == 0, out[-3000:]
    assert rules(jobs)["train"] == n_cells and not {"data", "entangle", "reference"} & set(rules(jobs))


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_corrupting_one_cells_metrics_reruns_from_there(done):
    metrics = done / "results" / "smoke" / "cells" / CELL / "row.parquet"
    st = metrics.stat()
    metrics.unlink()
    try:
        rc, jobs, out = dry_run(done)
    finally:
        metrics.touch()
        os.utime(metrics, (st.st_atime, st.st_mtime))
    assert rc == 0, out[-3000:]
    assert sorted((r, c) for r, c, _ in jobs) == sorted(
        [("tabulate", CELL), ("aggregate", None), ("report", None), ("all", None)]
    )


def edit_and_dry_run(done, code: Path):
    """Dry run after a real edit of `code` (Snakemake ignores a bare touch: same checksum)."""
    existed = code.exists()
    text = code.read_text() if existed else ""
    st = code.stat() if existed else None
    code.write_text(text + "# edited\n")
    os.utime(code, (time.time() + 3600, time.time() + 3600))
    try:
        return dry_run(done)
    finally:
        if existed:
            code.write_text(text)
            os.utime(code, (st.st_atime, st.st_mtime))
        else:
            code.unlink()


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_report_code_edit_reruns_only_report(done):
    rc, jobs, out = edit_and_dry_run(done, done / "src" / "latentstrat" / "report" / "__init__.py")
    assert rc == 0, out[-3000:]
    assert rules(jobs) == Counter(report=1, all=1)


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_aggregate_code_edit_reruns_only_aggregate_and_report(done):
    rc, jobs, out = edit_and_dry_run(done, done / "src" / "latentstrat" / "aggregate" / "contrasts.py")
    assert rc == 0, out[-3000:]
    assert rules(jobs) == Counter(aggregate=1, report=1, all=1)


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_editing_the_rule_script_reruns_nothing(done):
    """Every rule runs workflow/scripts/stage.py and code is not a rerun trigger: a refactor of
    the script never retrains (the report-code edit above is the positive control)."""
    rc, jobs, out = edit_and_dry_run(done, done / "workflow" / "scripts" / "stage.py")
    assert rc == 0, out[-3000:]
    assert jobs == [], out[-3000:]


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_report_config_edit_reruns_only_aggregate_and_report(done):
    rc, jobs, out = dry_run(done, config=["report={top_k: 7}"])
    assert rc == 0, out[-3000:]
    assert rules(jobs) == Counter(aggregate=1, report=1, all=1)


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_train_setting_edit_reruns_every_cell(done):  # control: params do reach the cell rules
    rc, jobs, out = dry_run(done, config=["train={steps: 7}"])
    assert rc == 0, out[-3000:]
    assert rules(jobs)["train"] == 24 and rules(jobs)["data"] == 0


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_adding_a_beta_adds_only_the_new_cells(done):
    rc, jobs, out = dry_run(done, config=["grid={beta: [0.01, 0.1, 1, 10]}"])
    assert rc == 0, out[-3000:]
    cells = {c for r, c, _ in jobs if r in CELL_RULES}
    # 4 families at the new beta, in both arms (the matched arm takes the primary grid's betas),
    # each pair from its own model: 4 new step-0 validations
    assert len(cells) == 8 and all("_beta-10_" in c for c in cells)
    assert sum(c.startswith("agg-sum_") for c in cells) == 4
    n = rules(jobs)
    assert n == Counter(step0=4, train=8, evaluate=8, probes=8, tabulate=8, aggregate=1, report=1, all=1), n


def _recreate(files, content=None):
    """Write each file again (its own bytes, or `content`), an hour newer than everything: as a
    re-installed shipped base or a re-run stage leaves it. Returns what to restore."""
    saved = [(f, f.read_bytes(), f.stat()) for f in files]
    later = time.time() + 3600
    for f, data, _ in saved:
        f.unlink()
        f.write_bytes(data if content is None else content(f, data))
        os.utime(f, (later, later))
    return saved


def _restore(saved):
    for f, data, st in saved:
        f.write_bytes(data)
        os.utime(f, (st.st_atime, st.st_mtime))


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_base_outputs_recreated_with_the_same_bytes_rerun_no_cell(done):
    """Deleting and re-creating the base's outputs (data, entangled model, reference, step 0)
    with identical bytes, as a re-installed shipped base does: Snakemake compares their checksums
    with the ones recorded when the cells ran (the 3 MB model too), so no cell or base job
    reruns. The entangle stage's quality record differs on every run (its timings): only
    aggregate and report read it."""
    base = done / "results" / "base" / "smoke-v2"
    files = [f for d in ("data", "entangle", "reference", "step0") for f in (base / d).rglob("*") if f.is_file()]
    assert any(f.name == "model.safetensors" and f.stat().st_size > 1 << 20 for f in files)
    saved = _recreate(files, content=lambda f, data: b'{"quality_s": 1.7}' if f.name == "quality.json" else data)
    try:
        rc, jobs, out = dry_run(done)
    finally:
        _restore(saved)
    assert rc == 0, out[-3000:]
    assert rules(jobs) == Counter(aggregate=1, report=1, all=1), out[-3000:]


@pytest.mark.slow  # a real tiny collection, then four one-stage reruns
def test_a_lost_base_folder_is_recreated_in_one_run_without_rerunning_the_cells(tmp_path):
    """On a finished collection, delete each base folder in turn (data, entangle, reference,
    step0) and run `snakemake` once: the lost stage runs, Snakemake decides again after it
    (the base stages are checkpoints), and no later job runs, because the files came back with
    the same bytes. The entangle stage's quality record differs on every run (its timings):
    aggregate and report, which read it, rerun after a lost entangle folder."""
    wd = copy_workflow(tmp_path)
    tiny_collection(wd, "lost-base", {"reconstruction_family": ["raw"], "beta": [0.1]})
    r = snakemake(wd, "--cores", "2", "-q", configfile="config/lost-base.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    base = wd / "results" / "base" / "smoke-v2"
    # what the later jobs read (the entangle stage's records carry timings: not compared)
    p = Paths.from_config(load_config(wd / "config" / "lost-base.yaml"))
    read = {**p.data_files(), **p.entangled_model_files(), **p.reference_files()}
    read = [Path(f) for f in read.values()] + [f for f in (base / "step0").rglob("*") if f.is_file()]
    before = {f: f.read_bytes() for f in read}
    for stage, reran in [
        ("data", set()),
        ("entangle", {"aggregate", "report"}),
        ("reference", set()),
        ("step0", set()),
    ]:
        shutil.rmtree(base / stage)
        r = snakemake(wd, "--cores", "2", configfile="config/lost-base.yaml")
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-3000:]
        assert "lost while later work exists" in out, out[-3000:]
        ran = set(re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):$", out, flags=re.M)) - {"all"}
        assert ran == {stage} | reran, (stage, ran)
        for f, data in before.items():
            if stage in f.relative_to(base).parts:
                assert f.read_bytes() == data, f
    assert dry_run(wd, configfile="config/lost-base.yaml")[1] == []


@pytest.mark.slow  # the rerun policy on a whole (touched) smoke collection
def test_one_changed_byte_of_the_data_reruns_every_cell(done):
    train = done / "results" / "base" / "smoke-v2" / "data" / "train.parquet"
    saved = _recreate([train], content=lambda f, data: data + b"\0")
    try:
        rc, jobs, out = dry_run(done)
    finally:
        _restore(saved)
    assert rc == 0, out[-3000:]
    n = rules(jobs)
    assert n["entangle"] == n["reference"] == 1 and n["train"] == n["evaluate"] == n["tabulate"] == 24, n
    assert dry_run(done)[1] == []  # the original bytes back: nothing to do again


def test_the_slurm_profile_as_a_user_types_it_gets_its_own_settings(wd):
    """`snakemake --profile slurm` also loads the workflow profile (profiles/default), whose
    values win: it must not cap the jobs' threads or turn keep-going off. The Qwen config's
    train jobs ask for 8 threads."""
    r = snakemake(wd, "-n", "--profile", "slurm", configfile="config/qwen25-05b.yaml")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    threads = re.findall(r"^\s+threads: (\d+)$", out, flags=re.M)
    assert threads.count("8") >= 20 and set(threads) <= {"2", "8"}, Counter(threads)
    assert "Using profiles slurm and workflow specific profile profiles/default" in out
    default = (wd / "workflow" / "profiles" / "default" / "config.yaml").read_text()
    assert not re.search(r"^(cores|jobs|keep-going):", default, flags=re.M)


def _model_job_resources(out: str) -> dict[str, set[str]]:
    """Per rule of a dry run, the `gpu=` and `gres=` requests its jobs print."""
    asked, rule = {}, None
    for line in out.splitlines():
        m = re.match(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):$", line)
        rule = m[1] if m else rule
        m = re.match(r"^\s+resources: (.*)$", line)
        if m and rule:
            kv = dict(x.split("=", 1) for x in m[1].split(", "))
            asked.setdefault(rule, set()).update(f"{k}={kv[k]}" for k in ("gpu", "gres") if k in kv)
    return asked


def test_gpu_jobs_ask_for_whole_gpus_or_for_a_share_of_one(wd):
    """`resources.gpu` whole GPUs per model job; `resources.slurm.gpu.gres` (shard:1) instead of
    them, so that Slurm places several cells on one GPU; cpu jobs ask for neither."""
    whole = _model_job_resources(dry_run(wd, config=["resources={'gpu': 1}"])[2])
    shared = _model_job_resources(
        dry_run(wd, config=["resources={'gpu': 1, 'slurm': {'gpu': {'gres': 'shard:1'}}}"])[2]
    )
    for asked, want in ((whole, "gpu=1"), (shared, "gres=shard:1")):
        assert asked["train"] == asked["evaluate"] == asked["entangle"] == {want}, asked
        assert asked["probes"] == asked["aggregate"] == set(), asked
    r = snakemake(wd, "-n", config=["resources={'gpu': 1, 'slurm': {'gpu': {'gres': 'shard:1', 'gpu_model': 'a100'}}}"])
    assert r.returncode != 0 and "gres and gpu_model" in r.stdout + r.stderr


def test_a_dry_run_beside_a_running_collection_prints_no_error(wd):
    """The README's way to look at a collection while a run holds its folder (`snakemake -n
    --nolock`) prints no lock error (Snakemake's dry run would still print its notice); without
    --nolock the notice stands (control)."""
    rc, jobs, out = dry_run(wd)
    outputs = outputs_of(out)
    assert rc == 0 and outputs
    locks = wd / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.output.lock").write_text("\n".join(str((wd / f).resolve()) for f in outputs) + "\n")
    try:
        rc, _, quiet = dry_run(wd, "--nolock")
        assert rc == 0 and "cannot be locked" not in quiet and "Error" not in quiet, quiet[-2000:]
        assert "cannot be locked" in dry_run(wd)[2]
    finally:
        (locks / "0.output.lock").unlink()


def test_a_reference_still_to_run_beside_a_finished_step0_is_not_lost(tmp_path):
    """Step 0 reads data and the entangled model, not the reference: between step 0 and the
    reference job a dry run says nothing about a lost base stage."""
    wd = copy_workflow(tmp_path)
    tiny_collection(wd, "order", {"reconstruction_family": ["raw"], "beta": [0.1]})
    cfg = load_config(wd / "config" / "order.yaml")
    p = Paths.from_config(cfg)
    step0 = [str(f) for c in expand_cells(cfg) for f in p.step0_files(init_id(c.settings)).values()]
    r = snakemake(wd, "--cores", "2", *step0, configfile="config/order.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert all(Path(f).exists() for f in step0)
    assert not any(Path(f).exists() for f in p.reference_files().values())
    rc, jobs, out = dry_run(wd, configfile="config/order.yaml")
    assert rc == 0 and "lost while later work exists" not in out and "reference" in rules(jobs)
