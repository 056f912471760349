"""A collection that moves between machines (latentstrat.archive, docs/archive.md): finished pairs
exported with checksums, read by a fresh workflow instead of their jobs (`snakemake -n` lists no
cell job of theirs, the report builds from them), and a partial, tampered, half-pair or
mixed-code archive refused with the file named before any job runs."""

import json
import shlex
import shutil
from pathlib import Path

import pytest

from latentstrat import archive
from latentstrat.cells import expand_cells, pair_priorities
from latentstrat.config import load_config
from latentstrat.paths import Paths
from workflow_helpers import copy_workflow, dry_run, rules, snakemake, tiny_collection

# ----------------------------------------------------------------------------- fast


def test_a_pairs_cells_share_a_priority_and_pairs_come_in_replicate_order():
    cells = expand_cells(load_config("config/config.yaml"))
    prio = pair_priorities(cells)
    by = {}
    for c in cells:
        by.setdefault(prio[c.cell_id], []).append(c)
    assert len(by) == 29  # 12 settings x their replicates
    for members in by.values():  # one setting and seed, one cell per arm
        assert (
            len({(c.settings["reconstruction_family"], c.settings["beta"], c.settings["seed"]) for c in members}) == 1
        )
        assert len({c.arm for c in members}) == len(members) in (2, 3)
    # every setting's first seed before any second seed, every second before any third
    seed_rank = {p: members[0].settings["seed"] - 314159 for p, members in by.items()}
    ranks = [seed_rank[p] for p in sorted(by, reverse=True)]
    assert ranks == sorted(ranks)


def test_the_plan_prints_a_snakemake_command_that_targets_the_cells_left(tmp_path, capsys):
    from snakemake.cli import get_argument_parser

    cfg = load_config("config/config.yaml")
    tmp = tmp_path / "c.yaml"
    tmp.write_text(f"extends: {Path('config/config.yaml').resolve()}\nresults_dir: {tmp_path / 'results'}\n")
    assert archive.main(["plan", "--configfile", str(tmp)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "snakemake" in x)
    args = get_argument_parser().parse_args(shlex.split(line)[4:])  # after "nice -n 19 .venv/bin/snakemake"
    assert [str(p) for p in args.configfile] == [str(tmp)]
    assert len(args.targets) == len(expand_cells(cfg)) == 66
    assert all(t.endswith("/row.parquet") for t in args.targets)


def _machines(cpu="AMD EPYC", cap="AVX-512 + native bf16", code="abc"):
    return [{"cpu": cpu, "cpu_capability": cap, "code_hash": code}] * 3


def test_a_pair_is_whole_only_on_one_cpu_model_and_one_code():
    assert archive.pair_problem({"a": _machines(), "b": _machines()}) is None
    # the same capability words on another CPU model: not one machine
    assert "different machines" in archive.pair_problem({"a": _machines(), "b": _machines(cpu="Intel Xeon")})
    assert "different machines" in archive.pair_problem({"a": _machines(), "b": _machines(code="def")})
    # a resumed cell whose second segment ran elsewhere
    moved = _machines()[:1] + [{"cpu": "Intel Xeon", "cpu_capability": "AVX-512 + native bf16", "code_hash": "abc"}]
    assert "different machines" in archive.pair_problem({"a": moved, "b": _machines()})
    # a value not recorded is unknown, not a pass
    assert "does not record its cpu" in archive.pair_problem({"a": _machines(cpu=None), "b": _machines()})


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny collection (2 settings x 2 seeds, sum vs mean: 4 pairs) run to the end, exported."""
    wd = copy_workflow(tmp_path_factory.mktemp("archive-src"))
    tiny_collection(
        wd,
        "arch",
        {"reconstruction_family": ["dist_norm"], "beta": [0.01, 0.1]},
        comparison_arms=[{"name": "matched_mean", "settings": {"token_aggregation": "mean"}}],
        replicates={"extra_seeds": 1},
    )
    r = snakemake(wd, "--cores", "2", "-q", configfile="config/arch.yaml", timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    cfg = load_config(wd / "config" / "arch.yaml")
    out = archive.export(Paths.from_config(cfg), Paths.from_config(cfg), expand_cells(cfg), log=lambda m: None)
    assert len(out["exported"]) == 8 and not out["skipped"] and out["cells"] == 8
    return wd, cfg


def _fresh(tmp_path, wd, cfg):
    """A fresh copy of the workflow holding only the archive (no base, no cell)."""
    new = copy_workflow(tmp_path)
    shutil.copy(wd / "config" / "arch.yaml", new / "config" / "arch.yaml")
    src = archive.archive_dir(Paths.from_config(cfg))
    dst = new / "results" / "archive" / cfg["collection"]
    shutil.copytree(src, dst)
    return new, dst


@pytest.mark.slow
def test_a_fresh_workflow_runs_no_archived_cell_and_reports_from_the_archive(trained, tmp_path):
    wd, cfg = trained
    new, _ = _fresh(tmp_path, wd, cfg)
    rc, jobs, out = dry_run(new, configfile="config/arch.yaml", config=[f"results_dir={new / 'results'}"])
    assert rc == 0, out[-3000:]
    n = rules(jobs)
    assert not {"train", "evaluate", "probes", "tabulate", "step0"} & set(n), n
    assert n["aggregate"] == n["report"] == 1
    r = snakemake(new, "--cores", "2", "-q", configfile="config/arch.yaml", timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    report = new / "results" / "arch" / "report"
    brief = (report / "brief.yaml").read_text()
    assert "complete: 8" in brief
    assert not list((new / "results" / "base").rglob("train/summary.json"))  # no cell trained here


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["tamper", "no_manifest", "half_pair", "other_tables"])
def test_a_damaged_archive_stops_the_workflow_naming_the_file(trained, tmp_path, damage):
    wd, cfg = trained
    new, dst = _fresh(tmp_path, wd, cfg)
    cell = sorted((dst / "cells").iterdir())[0]
    manifest = json.loads((dst / archive.MANIFEST).read_text())
    if damage == "tamper":
        (cell / "row.parquet").write_bytes((cell / "row.parquet").read_bytes() + b"x")
        want = f"{cell / 'row.parquet'} does not match its checksum"
    elif damage == "no_manifest":
        (dst / archive.MANIFEST).unlink()
        want = "has cells but no manifest.json: a partial copy"
    elif damage == "half_pair":
        del manifest["cells"][cell.name]
        (dst / archive.MANIFEST).write_text(json.dumps(manifest))
        want = "holds half of a pair"
    else:
        manifest["tables_version"] = -1
        (dst / archive.MANIFEST).write_text(json.dumps(manifest))
        want = "cell tables version -1"
    rc, _, out = dry_run(new, configfile="config/arch.yaml", config=[f"results_dir={new / 'results'}"])
    assert rc != 0 and want in out, out[-2000:]


@pytest.mark.slow
def test_a_pair_with_another_code_is_not_exported(trained, tmp_path):
    wd, cfg = trained
    cells = expand_cells(cfg)
    src = Paths.from_config(cfg)
    dest = Paths.from_config({**cfg, "results_dir": str(tmp_path / "results")})
    first = next(iter(archive.pairs_of(cells).values()))
    summary = archive.source_files(src, first[0])["summary"]
    saved = summary.read_text()
    try:
        s = json.loads(saved)
        s["hosts"][0]["code_hash"] = "0000000000000000"
        summary.write_text(json.dumps(s))
        out = archive.export(src, dest, cells, log=lambda m: None)
    finally:
        summary.write_text(saved)
    assert len(out["exported"]) == 6 and not set(first) & set(out["exported"])
    (why,) = [w for k, w in out["skipped"].items() if first[0] in k]
    assert "different machines or code" in why and "0000000000000000" in why
