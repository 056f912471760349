"""The command-line tools a user can discover: --help everywhere, help on every option, one spelling
per option, one-line errors for a bad config file, and confounds caught at config time."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest
import yaml

from latentstrat.bench.__main__ import COMMANDS
from latentstrat.cells import arm_differences
from latentstrat.config import ConfigError, load_config
from latentstrat.config import main as config_main

ENTRY_POINTS = [
    "latentstrat.config",
    "latentstrat.status",
    "latentstrat.report.__main__",
    "latentstrat.base.data",
    "latentstrat.base.entangle",
    "latentstrat.base.reference",
    "latentstrat.base.shipped",
    *(module for module, _ in COMMANDS.values()),
]


class Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def parser_of(module: str, monkeypatch) -> argparse.ArgumentParser:
    """The ArgumentParser a module's main builds (stopped at parse_args, nothing run)."""

    def capture(self, *a, **k):
        raise Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(Captured) as got:
        importlib.import_module(module).main(["--help"])
    return got.value.parser


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_option_has_help_and_one_spelling(module, monkeypatch):
    p = parser_of(module, monkeypatch)
    assert p.description and len(p.description) > 20, f"{module}: no description"
    assert p.description.rstrip().endswith((".", ")")), f"{module}: description cut mid-sentence: {p.description!r}"
    for action in p._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{module}: option {action.option_strings or action.dest} has no help text"
        # one spelling across tools: the collection config is --configfile (as for snakemake), a JSON
        # switch is a switch
        assert "--config" not in action.option_strings, f"{module}: --config (use --configfile)"
        if "--json" in action.option_strings:
            assert action.nargs == 0, f"{module}: --json takes a value here; elsewhere it is a switch"


def test_bench_help_names_every_command():
    r = subprocess.run([sys.executable, "-m", "latentstrat.bench", "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name, (_, what) in COMMANDS.items():
        assert f"  {name}  " in r.stdout or f"  {name} " in r.stdout, name
        assert what in r.stdout
    bad = subprocess.run([sys.executable, "-m", "latentstrat.bench", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command 'nope'" in bad.stderr and "calibrate" in bad.stderr


def test_config_help_exits_0():
    r = subprocess.run([sys.executable, "-m", "latentstrat.config", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "configfile" in r.stdout and "does not exist" not in r.stdout


def test_bad_config_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("collection: [x\nbase: y\n")
    for path, says in ((bad, "not valid YAML (line"), (tmp_path / "missing.yaml", "does not exist")):
        r = subprocess.run(
            [sys.executable, "-m", "latentstrat.base.data", "--configfile", str(path)], capture_output=True, text=True
        )
        assert r.returncode != 0
        assert "Traceback" not in r.stderr and says in r.stderr and str(path) in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# ----------------------------------------------------------------------------- confounds at config time


def _with_arm(tmp_path, settings: dict, **arm) -> object:
    cfg = yaml.safe_load(open("config/quick.yaml"))
    cfg["comparison_arms"] = [{"name": "matched_mean", "settings": {"token_aggregation": "mean", **settings}, **arm}]
    cfg.setdefault("report", {})["primary_contrast"] = "matched_mean"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_confounded_primary_contrast_is_an_error_naming_the_key(tmp_path, capsys):
    path = _with_arm(tmp_path, {"latent_dim": 32})
    with pytest.raises(ConfigError, match=r"primary_contrast.*confounded.*latent_dim.*confounded: true"):
        load_config(path)
    assert config_main([str(path)]) == 1
    err = capsys.readouterr().err
    assert "confounded" in err and "latent_dim" in err


def test_confound_declared_meant_is_printed(tmp_path, capsys):
    path = _with_arm(tmp_path, {"beta_schedule": "lin100"}, confounded=True)
    assert config_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "confounded by beta_schedule (declared)" in out and "(the primary contrast)" in out


def test_matched_and_aa_arms_read_so(tmp_path):
    matched = {d.arm: d for d in arm_differences(load_config(_with_arm(tmp_path, {})))}["matched_mean"]
    assert matched.keys == ("token_aggregation",) and not matched.confounded
    aa = arm_differences(load_config("config/quick-aa.yaml"))[0]
    assert aa.keys == () and not aa.confounded and "A/A" in aa.text()
    # a non-primary confounded arm is allowed, and printed as confounded
    cfg = load_config("config/followup.yaml")
    lin100 = {d.arm: d for d in arm_differences(cfg)}["mean_lin100"]
    assert lin100.confounded and "beta_schedule" in lin100.keys


def test_every_cell_id_quoted_in_the_docs_is_one_the_code_writes():
    """Cell ids in README.md and docs/ parse, and print back unchanged (an example id that lacks a
    part real ids have, e.g. `_sched-lin300_`, would not be the id of the cell it names)."""
    import re
    from pathlib import Path

    from latentstrat.cells import cell_id, normalize_settings, parse_cell_id, schema_cell_defaults

    root = Path(__file__).resolve().parents[1]
    found = 0
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for cid in re.findall(r"`(agg-[A-Za-z0-9_.-]+)`", doc.read_text()):
            settings = normalize_settings({**schema_cell_defaults(), **parse_cell_id(cid)})
            assert cell_id(settings) == cid, f"{doc.name}: {cid} is written {cell_id(settings)}"
            found += 1
    assert found >= 2
    # the default collection's ids carry their schedule
    cfg = load_config("config/config.yaml")
    from latentstrat.cells import expand_cells

    assert "agg-sum_fam-raw_beta-0.01_sched-lin300_seed-314159" in {c.cell_id for c in expand_cells(cfg)}
