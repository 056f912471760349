"""Reconstruction families (latentstrat.families): parsing, labels, the schema pattern generated
from the declarations, each family's formula and z-free value by hand, and the recipe for adding
one (docs/architecture.md) followed once: a toy family declared here trains a cell."""

import json
import re

import pandas as pd
import pytest
import torch
import yaml

from base_helpers import TINY, base_folders
from latentstrat import families as F
from latentstrat.cells import expand_cells
from latentstrat.config import ConfigError, load_config
from latentstrat.modeling.objective import reconstruction_per_example
from latentstrat.schema import SCHEMA_PATH, parsed_schema


def test_parsing_and_labels():
    f = F.parse_family("dist_tokcc_0.05_0.95")
    assert (f.kind, f["p"], f["q"], f.alpha) == ("dist_tokcc", 0.05, 0.95, 0.25)
    assert F.parse_family("dist_tokcc_0.05_0.95_a1").alpha == 1.0
    assert F.parse_family("tokcc_a0.5").alpha == 0.5
    assert F.parse_family("raw").alpha == F.DEFAULT_ALPHA  # every cell logs tokcc at the default exponent
    labels = {
        "raw": "raw",
        "dist_norm": "dist norm",
        "tokcc_a0.25": "tokcc a.25",
        "tokcc_a1": "tokcc a1",
        "dist_tokcc_0.05_0.95": "dist+tokcc 0.05/0.95",
        "dist_tokcc_0.05_0.95_a0.5": "dist+tokcc 0.05/0.95 a.5",
    }
    assert {n: F.family_label(n) for n in labels} == labels
    for bad in ("tokcc", "raw2", "dist_tokcc_0.05", "Raw"):
        with pytest.raises(ValueError, match=f"unknown reconstruction family '{bad}'.*tokcc_a<alpha>"):
            F.parse_family(bad)
    with pytest.raises(ValueError, match="malformed number"):
        F.parse_family("tokcc_a0..5")


def test_the_schema_pattern_is_generated_from_the_declarations():
    pattern = parsed_schema()["$defs"]["family"]["pattern"]
    assert pattern == F.name_pattern()
    assert "pattern" not in yaml.safe_load(SCHEMA_PATH.read_text())["$defs"]["family"]  # one place: the declarations
    for name in ("raw", "dist_norm", "tokcc_a0.25", "dist_tokcc_0.05_0.95", "dist_tokcc_0.05_0.95_a1"):
        assert re.fullmatch(pattern, name), name
    for name in ("tokcc", "raw ", "dist_norm_x", "bogus"):
        assert not re.fullmatch(pattern, name), name


def test_each_family_by_hand():
    """Two examples, sum aggregation: l = [[1, 3], [2, pad]], b = [[1, 1], [3, pad]]."""
    l = torch.tensor([[1.0, 3.0], [2.0, 0.0]])
    b = torch.tensor([[1.0, 1.0], [3.0, 0.0]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    scales = {"S_ref": 2.0, "T_ref": 4.0}
    w1, w3 = 1.001**0.25, 3.001**0.25
    raw = [4.0, 2.0]
    dist_norm = [2.0, 1.0]
    tokcc = [(w1 * 1 + w1 * 3) / 4.0, (w3 * 2) / 4.0]
    want = {
        "raw": raw,
        "dist_norm": dist_norm,
        "tokcc_a0.25": tokcc,
        "dist_tokcc_0.5_2": [0.5 * d + 2 * t for d, t in zip(dist_norm, tokcc)],
    }
    zfree = {"raw": 2.0, "dist_norm": 1.0, "tokcc_a0.25": 1.0, "dist_tokcc_0.5_2": 2.5}
    for name, active in want.items():
        fam = F.parse_family(name)
        out = reconstruction_per_example(l, b, m, fam, "sum", scales)
        assert set(out) == {*F.TERMS, "active"}
        assert out["raw"].tolist() == raw and out["dist_norm"].tolist() == dist_norm
        assert out["tokcc"].tolist() == pytest.approx(tokcc)
        assert out["active"].tolist() == pytest.approx(active), name
        assert fam.zfree(scales) == pytest.approx(zfree[name]), name


def test_only_raw_is_not_normalized():
    names = ("raw", "dist_norm", "tokcc_a0.25", "dist_tokcc_0.05_0.95")
    assert [F.parse_family(n).normalized for n in names] == [False, True, True, True]


def test_a_kind_is_declared_once():
    with pytest.raises(ValueError, match="'raw' is declared twice"):
        F.declare(F.KINDS["raw"])


@pytest.fixture
def toy_family(monkeypatch):
    """`half_dist_w<w>`: w times the base-relative reconstruction, declared as the recipe says."""
    kind = F.Kind(
        name="half_dist",
        syntax="half_dist_w<w>",
        pattern=r"half_dist_w(?P<w>[0-9.]+)",
        label=lambda f: f"half dist {f['w']:g}",
        active=lambda f, t: f["w"] * t["dist_norm"],
        zfree=lambda f, s: f["w"],
        normalized=True,
    )
    monkeypatch.setitem(F.KINDS, kind.name, kind)
    return kind


def test_a_declared_toy_family_trains_a_cell(toy_family, tiny_base, tmp_path):
    """The recipe followed once: one declaration, and the config accepts the name, the cell
    trains one step on it, its history logs the family's objective (w x base-relative, so 0.5 at
    step 0 where base-relative is 1) and its gradient clip is in the family's z-free unit."""
    from latentstrat.cell.train import train_cell

    cfg = json.loads(json.dumps(TINY))
    cfg["grid"]["reconstruction_family"] = ["half_dist_w0.5"]
    cfg["train"].update(steps=1, eval_every=1)
    cfg = load_config(cfg=cfg)
    (cell,) = [c.to_json() for c in expand_cells(cfg)]
    assert cell["cell_id"].startswith("agg-sum_fam-half_dist_w0.5_")
    assert F.family_label(cell["reconstruction_family"]) == "half dist 0.5"
    b = tiny_base
    summary = train_cell(cfg, cell, base_folders(b), tmp_path, threads=1)
    assert summary["steps"] == 1
    h = pd.read_parquet(tmp_path / "history.parquet")
    h = h[h.task == "all"].pivot(index="step", columns="metric", values="value")
    assert h.loc[0, "base_relative_reconstruction"] == pytest.approx(1.0, abs=1e-5)
    for step in (0, 1):
        assert h.loc[step, "active_reconstruction_objective"] == pytest.approx(
            0.5 * h.loc[step, "base_relative_reconstruction"], rel=1e-6
        )
    assert h.loc[1, "active_reconstruction_objective"] != h.loc[0, "active_reconstruction_objective"]
    c = cfg["train"]["grad_clip"]
    c = c[cell["token_aggregation"]] if isinstance(c, dict) else c
    assert cfg["train"]["grad_clip_unit"] == "zfree_objective" and c > 0
    assert h.loc[1, "grad_clip"] == pytest.approx(0.5 * c)


def test_a_name_no_family_declares_is_a_config_error_naming_the_key():
    cfg = json.loads(json.dumps(TINY))
    cfg["grid"]["reconstruction_family"] = ["raw", "half_dist_w0.5"]
    with pytest.raises(ConfigError, match=r"grid\.reconstruction_family\[1\].*'half_dist_w0.5'.*expected raw"):
        load_config(cfg=cfg)
