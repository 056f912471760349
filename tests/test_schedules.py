"""KL weight schedules (latentstrat.schedules): each factor by hand, the schema's pattern and the
config's error generated from the declarations, and the recipe for adding one followed once: a
toy schedule declared here trains a cell (as the toy family and aggregation do)."""

import json

import pandas as pd
import pytest

from base_helpers import TINY, base_folders
from latentstrat import schedules as S
from latentstrat.cells import expand_cells
from latentstrat.config import ConfigError, load_config
from latentstrat.modeling.objective import Objective

CELL = {
    "token_aggregation": "sum",
    "reconstruction_family": "raw",
    "beta": 0.1,
    "posterior_variance_weight": 0.0,
    "router_marginal_kl_weight": 0.0,
}


def test_each_declared_schedule_by_hand():
    constant, lin = S.parse_schedule("constant"), S.parse_schedule("lin100")
    assert (constant.kind, constant.warmup, lin.kind, lin.warmup, lin["steps"]) == ("constant", 0, "linear", 100, 100)
    assert [constant.factor(t) for t in (0, 1, 500)] == [1.0, 1.0, 1.0]
    assert [lin.factor(t) for t in (0, 25, 100, 300)] == pytest.approx([0.0, 0.25, 1.0, 1.0])
    o = Objective.with_scales({**CELL, "beta_schedule": "lin100"}, {"S_ref": 1.0, "T_ref": 1.0})
    assert [o.beta_at(t) for t in (0, 25, 100, 300)] == pytest.approx([0.0, 0.025, 0.1, 0.1])
    assert Objective.with_scales({**CELL, "beta_schedule": "constant"}, {}).beta_at(0) == 0.1
    for bad in ("cosine", "lin0", "lin", "constant1"):
        with pytest.raises(ValueError, match=rf"unknown beta schedule '{bad}' \(expected constant or lin<N>\)"):
            S.parse_schedule(bad)


def test_a_schedule_is_declared_once_and_unknown_names_are_config_errors():
    with pytest.raises(ValueError, match="'linear' is declared twice"):
        S.declare(S.KINDS["linear"])
    cfg = json.loads(json.dumps(TINY))
    cfg["grid"] = {"beta_schedule": ["lin300", "cosine"]}
    with pytest.raises(
        ConfigError, match=r"beta_schedule.*unknown beta schedule 'cosine' \(expected constant or lin<N>\)"
    ):
        load_config(cfg=cfg)


@pytest.fixture
def toy_schedule(monkeypatch):
    """`hold<N>`: no KL for the first N steps, then all of it; declared as the recipe says."""
    kind = S.Kind(
        name="hold",
        syntax="hold<N>",
        pattern=r"hold(?P<steps>[1-9][0-9]*)",
        factor=lambda s, step: 0.0 if step < s["steps"] else 1.0,
        warmup=lambda s: s["steps"],
    )
    monkeypatch.setitem(S.KINDS, kind.name, kind)
    return kind


def test_a_declared_toy_schedule_trains_a_cell(toy_schedule, tiny_base, tmp_path):
    """One declaration: the config accepts `hold2`, the cell's id names it, and the cell trains
    with beta_t 0 at steps 0 and 1 and the cell's beta from step 2 on (its history, by hand)."""
    from latentstrat.cell.train import train_cell

    cfg = json.loads(json.dumps(TINY))
    cfg["grid"] = {"reconstruction_family": ["dist_norm"], "beta_schedule": ["hold2"], "beta": [0.5]}
    cfg["train"].update(steps=3, eval_every=1)
    cfg = load_config(cfg=cfg)
    (cell,) = [c.to_json() for c in expand_cells(cfg)]
    assert "sched-hold2" in cell["cell_id"]

    b = tiny_base
    summary = train_cell(cfg, cell, base_folders(b), tmp_path / "cell", threads=1)
    assert summary["steps"] == 3
    h = pd.read_parquet(tmp_path / "cell" / "history.parquet")
    beta_t = h[(h.task == "all") & (h.metric == "beta_t")].set_index("step").value
    assert beta_t.to_dict() == pytest.approx({0: 0.0, 1: 0.0, 2: 0.5, 3: 0.5})
