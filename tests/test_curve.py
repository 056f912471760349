"""bench curve: a cell's learning curve from the trainer's own validation (tiny CPU run)."""

import json

import pandas as pd
import pytest
import yaml

from base_helpers import TINY, make_base
from latentstrat.bench.curve import main as curve_main
from latentstrat.bench.curve import plot_curves
from latentstrat.config import load_config


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    root = tmp_path_factory.mktemp("curve")
    raw = json.loads(json.dumps(TINY))
    raw["results_dir"] = str(root / "results")
    make_base(root / "results" / "base" / raw["base"], load_config(cfg=raw))
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return root, path


def test_curve_prints_checkpoints_with_chance_levels_and_examples_seen(collection, capsys):
    root, cfg = collection
    out = root / "curves"
    args = ["--configfile", str(cfg), "--cell", "token_aggregation=mean,beta=0.5", "--set", "train.steps=4"]
    args += ["--set", "train.batch_size=6", "--eval-every", "2", "--out", str(out)]
    assert curve_main(args) == 0
    printed = capsys.readouterr().out
    assert "agg-mean_fam-tokcc_a0.25_beta-0.5" in printed and "| router chance |" in printed
    (csv,) = out.glob("*/curve.csv")
    t = pd.read_csv(csv)
    assert t.step.tolist() == [0, 2, 4] and t.examples_seen.tolist() == [0, 12, 24]
    assert t.base_relative[0] == pytest.approx(1.0, abs=1e-4)  # step 0 is the z-free model
    for c in ("router_chance", "posterior_chance"):  # majority-class rates of the probed examples
        assert t[c].between(0.5, 1.0).all(), c
    assert t.clipped_fraction[1:].between(0, 1).all() and (t.lr == 0.001).all() and (t.batch_size == 6).all()
    # a second call reads the finished cell back instead of training it again
    written = {
        p: p.stat().st_mtime_ns for p in (csv.parent / "history.parquet", csv.parent / "checkpoints" / "last.pt")
    }
    assert curve_main(args) == 0
    assert all(p.stat().st_mtime_ns == m for p, m in written.items())
    assert pd.read_csv(csv).equals(t)
    fig = root / "curves.png"
    assert len(plot_curves(out, fig)) == 3 and fig.stat().st_size > 0


def test_curve_names_a_missing_base_before_training(tmp_path, collection):
    raw = yaml.safe_load(collection[1].read_text())
    raw["results_dir"] = str(tmp_path / "nowhere")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit, match="the base of .* is not built .*snakemake --configfile"):
        curve_main(["--configfile", str(cfg), "--out", str(tmp_path / "o")])


def test_collection_curves_read_the_workflows_cells_back_and_train_none(collection, capsys):
    from latentstrat.cell.train import train_cell
    from latentstrat.cells import expand_cells
    from latentstrat.paths import Paths

    root, cfg_path = collection
    out = root / "collection-curves"
    assert curve_main(["--configfile", str(cfg_path), "--collection", "--out", str(out)]) == 0
    (cell,) = expand_cells(load_config(cfg_path))
    assert f"not trained yet: {cell.cell_id}" in capsys.readouterr().out and not list(out.rglob("curve.csv"))
    cfg = load_config(cfg_path)
    p = Paths.from_config(cfg)  # the workflow's train job, as Snakemake runs it
    train_cell(cfg, cell.to_json(), p.base_folders, p.train_dir(cell.cell_id), threads=1)
    assert curve_main(["--configfile", str(cfg_path), "--collection", "--out", str(out)]) == 0
    t = pd.read_csv(out / cell.cell_id / "curve.csv")
    assert t.step.tolist() == [0, 3, 6]  # the config's own eval_every
    assert not (out / cell.cell_id / "history.parquet").exists()  # read back, not trained again
