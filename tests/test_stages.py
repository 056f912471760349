"""The stages are declared once (latentstrat.stages): every declared stage has its rule file and an
entry that takes one job, the tables read from the declaration agree with it, and a toy stage
added in the three places docs/architecture.md names ("Adding a stage") runs in the workflow."""

import inspect
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

from latentstrat import stages
from latentstrat.io import PRODUCERS
from latentstrat.paths import BENCH_RULES, CELL_JOB_FOLDER
from latentstrat.stages import BASE_STAGES
from latentstrat.stages import CELL_STAGES as STATUS_STAGES
from workflow_helpers import ROOT, SNAKEMAKE, copy_workflow, snakemake, tiny_collection


def test_every_declared_stage_has_its_rule_file_and_an_entry_taking_one_job():
    rule_files = {f.stem for f in (ROOT / "workflow" / "rules").glob("*.smk")} - {"common"}
    assert rule_files == set(stages.names())
    for s in stages.STAGES:
        text = (ROOT / "workflow" / "rules" / f"{s.name}.smk").read_text()
        assert re.search(rf"^(rule|checkpoint) {s.name}:", text, re.M), s.name
        assert 'script:\n        "../scripts/stage.py"' in text, s.name
        assert list(inspect.signature(stages.entry(s.name)).parameters) == ["job"], s.name


def test_the_tables_read_from_the_declaration():
    assert BENCH_RULES == stages.names()
    assert STATUS_STAGES == ("train", "evaluate", "probes", "tabulate")
    assert BASE_STAGES == ("data", "entangle", "reference", "step0")
    assert CELL_JOB_FOLDER == {
        "step0": "step0",
        "train": "train",
        "evaluate": "evaluate",
        "probes": "probe",
        "tabulate": "tabulate",
    }
    assert PRODUCERS["probes"] == "probe" and PRODUCERS["cells"] == "tabulate"
    # the negative control: an unknown stage or level is an error that names it
    for bad in (lambda: stages.entry("nope"), lambda: stages.names("nope")):
        try:
            bad()
        except (KeyError, ValueError) as e:
            assert "nope" in str(e)
        else:
            raise AssertionError("an unknown stage passed")


TOY_RULE = """
rule vocabulary:
    input:
        tokenizer=f"{BASE}/data/tokenizer.json",
    output:
        size=f"{BASE}/vocabulary/size.json",
    log:
        f"{BASE}/logs/vocabulary.log",
    benchmark:
        f"{BASE}/benchmarks/vocabulary.tsv"
    params:
        settings=settings("vocabulary"),
    script:
        "../scripts/stage.py"
"""

TOY_ENTRY = """
import json

from latentstrat.encoding import load_tokenizer


def run(job):
    tok = load_tokenizer(job.folder("tokenizer"))
    print("vocabulary of", job.config["data"]["tasks"])
    job_out = job.output["size"]
    with open(job_out, "w") as f:
        json.dump({"size": len(tok), "threads": job.threads}, f)
"""


def test_a_stage_added_in_three_places_runs(tmp_path):
    wd = copy_workflow(tmp_path)
    shutil.rmtree(wd / "src")
    shutil.copytree(
        ROOT / "src" / "latentstrat", wd / "src" / "latentstrat", ignore=shutil.ignore_patterns("__pycache__")
    )
    # 1. the declaration
    decl = wd / "src" / "latentstrat" / "stages.py"
    text = decl.read_text()
    anchor = '    Stage(\n        "entangle",\n'
    assert anchor in text
    decl.write_text(
        text.replace(
            anchor,
            '    Stage("vocabulary", "base", "vocabulary", {"size": "size.json"}, "vocabulary", '
            '"latentstrat.base.vocabulary:run", sections=("data",)),\n' + anchor,
        )
    )
    # 2. the rule file; 3. the entry
    (wd / "workflow" / "rules" / "vocabulary.smk").write_text(TOY_RULE)
    (wd / "src" / "latentstrat" / "base" / "vocabulary.py").write_text(TOY_ENTRY)

    cfg = tiny_collection(wd, "toy-stage", {"beta": [0.01]})
    env = {**os.environ, "PYTHONPATH": str(wd / "src")}
    base = yaml.safe_load((wd / "config" / "smoke.yaml").read_text())["base"]
    target = wd / "results" / "base" / base / "vocabulary" / "size.json"
    # the workflow's final targets come from the declarations: a dry run of the collection plans it
    dry = subprocess.run(
        [SNAKEMAKE, "--configfile", str(cfg), "-n"], cwd=wd, env=env, capture_output=True, text=True, timeout=600
    )
    assert dry.returncode == 0 and re.search(r"^vocabulary\s+1$", dry.stdout, re.M), (dry.stdout + dry.stderr)[-3000:]
    out = subprocess.run(
        [SNAKEMAKE, "--configfile", str(cfg), "--cores", "1", str(target)],
        cwd=wd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    size = json.loads(target.read_text())
    tokenizer = json.loads((target.parent.parent / "data" / "tokenizer.json").read_text())
    assert size == {"size": len(tokenizer["model"]["vocab"]), "threads": 1}
    bench = target.parent.parent / "benchmarks" / "vocabulary.tsv"
    assert bench.exists()  # the benchmark folder came from the declaration (level base)
    assert "vocabulary of" in (target.parent.parent / "logs" / "vocabulary.log").read_text()
    # the status command's sizing reads the new stage's benchmarks from the declaration
    probe = subprocess.run(
        [sys.executable, "-c", "from latentstrat.paths import BENCH_RULES; print(BENCH_RULES)"],
        env=env,
        capture_output=True,
        text=True,
        cwd=wd,
    )
    assert "'vocabulary'" in probe.stdout, probe.stderr


def test_a_rule_file_that_moves_a_file_alone_is_an_error_naming_it(tmp_path):
    """The rules show their path templates; the package (latentstrat.paths) reads the same files.
    A template edited in the rule file alone stops the workflow before any job, naming the rule,
    the file and both paths; the unedited copy loads (the positive control)."""
    wd = copy_workflow(tmp_path)
    ok = snakemake(wd, "-n")
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-2000:]
    rule_file = wd / "workflow" / "rules" / "train.smk"
    text = rule_file.read_text()
    assert '/train/history.parquet"' in text
    rule_file.write_text(text.replace('/train/history.parquet"', '/train/hist.parquet"'))
    bad = snakemake(wd, "-n")
    assert bad.returncode != 0
    err = bad.stdout + bad.stderr
    assert "rule train (workflow/rules/train.smk): its history is" in err and "hist.parquet" in err, err[-2000:]
    assert "/train/history.parquet" in err and "edit both together" in err
