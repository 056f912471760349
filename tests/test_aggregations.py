"""Token aggregations (latentstrat.aggregations): each formula and its inverse by hand, the schema's
names generated from the declarations, and the recipe for adding one followed once: a toy
aggregation declared here trains a cell (as the toy family does in test_families)."""

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from base_helpers import TINY
from latentstrat import aggregations as A
from latentstrat.base.reference import compute_scales
from latentstrat.cell.tabulate import summed_nll
from latentstrat.cells import expand_cells
from latentstrat.config import ConfigError, load_config
from latentstrat.modeling.objective import aggregate_tokens
from latentstrat.paths import BaseFolders
from latentstrat.schema import parsed_schema

V = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # n_i = 3 and 2; the 9 is padding


def test_each_declared_aggregation_by_hand_and_undone_by_the_metrics():
    want = {"mean": [6 / 3, 9 / 2], "sum": [6.0, 9.0], "sum_scaled": [6 / 2.5, 9 / 2.5]}
    for name, values in want.items():
        got = aggregate_tokens(V, MASK, name, n_bar=2.5)
        assert got.tolist() == pytest.approx(values), name
        records = pd.DataFrame({"reconstruction_loss": got.numpy(), "n_supervised": [3, 2]})
        assert summed_nll(records, name, n_bar=2.5).tolist() == pytest.approx([6.0, 9.0]), name
    assert [A.AGGREGATIONS[n].length_weighted for n in ("mean", "sum", "sum_scaled")] == [False, True, True]
    with pytest.raises(ValueError, match="sum_scaled needs n_bar > 0"):
        aggregate_tokens(V, MASK, "sum_scaled", n_bar=0)


def test_an_aggregation_is_declared_once_and_unknown_names_are_config_errors():
    with pytest.raises(ValueError, match="'sum' is declared twice"):
        A.declare(A.AGGREGATIONS["sum"])
    assert parsed_schema()["$defs"]["aggregation"]["enum"] == ["mean", "sum", "sum_scaled"]
    cfg = json.loads(json.dumps(TINY))
    cfg["grid"]["token_aggregation"] = ["sum", "median"]
    with pytest.raises(ConfigError, match=r"token_aggregation.*'median'"):
        load_config(cfg=cfg)


@pytest.fixture
def toy_aggregation(monkeypatch):
    """`sum_sqrt`: the sum over the square root of the trace's length, declared as the recipe says."""
    agg = A.Aggregation(
        name="sum_sqrt",
        divisor=lambda n, n_bar: n**0.5,
        length_weighted=False,
    )
    monkeypatch.setitem(A.AGGREGATIONS, agg.name, agg)
    return agg


def test_a_declared_toy_aggregation_trains_a_cell(toy_aggregation, tiny_base, tmp_path):
    """One declaration: the config accepts it, the reference stage measures its scales, and a cell
    trains on it; at step 0 (the entangled model) its raw reconstruction is the mean over the
    validation split of sum_t b_it / sqrt(n_i), by hand, and base-relative is 1."""
    from latentstrat.cell.train import train_cell

    cfg = json.loads(json.dumps(TINY))
    cfg["grid"] = {"reconstruction_family": ["dist_norm"], "token_aggregation": ["sum_sqrt"]}
    cfg["train"].update(steps=1, eval_every=1)
    cfg = load_config(cfg=cfg)
    (cell,) = [c.to_json() for c in expand_cells(cfg)]
    assert cell["cell_id"].startswith("agg-sum_sqrt_fam-dist_norm_")

    reference = tmp_path / "reference"  # the base's reference stage, its scales measured with the toy declared
    shutil.copytree(tiny_base["reference_dir"], reference)
    tokens = pd.read_parquet(reference / "tokens.parquet")
    scales = compute_scales(tokens, [0.25])
    (reference / "scales.json").write_text(json.dumps(scales))
    val = tokens[tokens.split == "validation"]
    by_hand = float(np.mean([np.sum(b) / math.sqrt(len(b)) for b in val.b]))
    assert scales["S_ref"]["sum_sqrt"] == pytest.approx(by_hand, rel=1e-6)

    b = tiny_base
    summary = train_cell(
        cfg, cell, BaseFolders(b["data_dir"], b["entangle_dir"], reference), tmp_path / "cell", threads=1
    )
    assert summary["steps"] == 1 and summary["S_ref"] == pytest.approx(by_hand, rel=1e-6)
    h = pd.read_parquet(tmp_path / "cell" / "history.parquet")
    h = h[h.task == "all"].pivot(index="step", columns="metric", values="value")
    assert h.loc[0, "reconstruction_loss"] == pytest.approx(by_hand, rel=1e-4)
    assert h.loc[0, "base_relative_reconstruction"] == pytest.approx(1.0, abs=1e-4)
    assert h.loc[1, "reconstruction_loss"] != h.loc[0, "reconstruction_loss"]
