"""A stage's job (latentstrat.jobs.Job): built from its rule, it holds the config sections its
stage's declaration names and nothing else, its cell parsed and typed (cells.CellSettings)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from latentstrat.cells import Cell, CellSettings, expand_cells
from latentstrat.config import load_config
from latentstrat.jobs import Job, Sections
from latentstrat.rules import stage_settings

ROOT = Path(__file__).resolve().parents[1]


class _Files(list):
    """A rule's input or output as Snakemake gives them (named items; none here)."""

    def items(self):
        return []


def _job(cfg, stage, **params):
    """Job.from_rule over the `snakemake` object of one job of `stage`, its rule's params as
    common.smk gives them (`settings`: the sections the stage declares)."""
    items = {"settings": stage_settings(cfg, stage), **params}
    smk = SimpleNamespace(
        rule=stage,
        params=SimpleNamespace(items=items.items),
        input=_Files(),
        output=_Files(),
        threads=2,
        resources=SimpleNamespace(gpu=0),
        config=cfg,
    )
    return Job.from_rule(smk)


def test_a_job_reads_the_sections_its_stage_declares_and_no_other():
    cfg = load_config(ROOT / "config" / "smoke.yaml")
    cell = expand_cells(cfg)[0]
    job = _job(cfg, "evaluate", cell=cell.work_json())
    assert set(job.config) == {"resources", "base", "data", "backbone", "entangle", "lora", "train", "evaluate"}
    assert job.config["train"] == cfg["train"] and job.config["resources"] == {"gpu": 0, "threads": 2}
    for read in (lambda: job.config["probes"], lambda: job.config.get("report")):
        with pytest.raises(KeyError, match="stage evaluate reads config section '(probes|report)', which its"):
            read()
    # train reads `evaluate` and `probes` too, for its validation: beyond its params (step0 records them)
    assert {"evaluate", "probes"} <= set(_job(cfg, "train", cell=cell.work_json()).config)
    assert not {"evaluate", "probes"} & set(stage_settings(cfg, "train"))
    # the cell, parsed once and typed
    got = job.cell
    assert isinstance(got, Cell) and isinstance(got.settings, CellSettings)
    assert got.cell_id == cell.cell_id and got.settings == cell.settings and got.arm is None
    assert got.settings.reconstruction_family.label and isinstance(got.settings.beta, float)


def test_a_cells_settings_are_parsed_once_and_read_as_their_plain_values():
    cfg = load_config(ROOT / "config" / "config.yaml")
    c = next(c for c in expand_cells(cfg) if c.settings["reconstruction_family"].startswith("tokcc"))
    s = c.settings
    assert s.reconstruction_family.alpha == 0.25 and s.token_aggregation.length_weighted is True
    assert s.beta_schedule.warmup == 300 and s["beta_schedule"] == "lin300" and dict(s)["seed"] == s.seed
    assert Cell.from_json(c.to_json()) == c and Cell.from_json(c.work_json()).training_seed == c.training_seed
    with pytest.raises(ValueError, match="training seed 7 is not its settings' own"):
        Cell.from_json({**c.work_json(), "training_seed": 7})
    with pytest.raises(KeyError, match="cell settings lack beta"):
        CellSettings.parse({k: v for k, v in s.items() if k != "beta"})
    with pytest.raises(ValueError, match="unknown token aggregation 'median'"):
        s.replace(token_aggregation="median")
    assert Sections({"a": 1}, "x") == {"a": 1}
