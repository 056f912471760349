"""Evaluate stage, probes on its records and the per-cell metrics row, on a cell of the shared
tiny base (two tasks, a random tiny entangled model, a few train steps)."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from base_helpers import TINY, base_folders
from latentstrat import encoding, metrics
from latentstrat.cell import probes, tabulate
from latentstrat.cell.evaluate import RECORD_COLUMNS, evaluate_cell, select_test_rows
from latentstrat.cell.probes import PROBE_COLUMNS
from latentstrat.cell.train import train_cell
from latentstrat.cells import expand_cells
from latentstrat.config import load_config
from latentstrat.io import read_parquet, write_parquet
from latentstrat.modeling.scoring import score_generations
from latentstrat.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]

CELL_STAGES = {
    "primary_arm": "sum",
    "cell": {"latent_dim": 8, "reconstruction_family": "dist_tokcc_0.05_0.95"},
    "train": {
        "steps": 3,
        "batch_size": 8,
        "eval_every": 3,
        "checkpoint_every": 3,
        "val_probe_per_task": 6,
        "val_decode_per_task": 1,
    },
    "evaluate": {"max_new_tokens": 24, "batch_size": 8},
}


@pytest.fixture(scope="module")
def smoke(tiny_base, tmp_path_factory):
    """A dist+tokcc cell on the shared tiny base, trained a few steps, evaluated, probed and
    reduced to its metrics row."""
    root = tmp_path_factory.mktemp("cell")
    cfg = json.loads(json.dumps(TINY))
    for k, v in CELL_STAGES.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
    cfg = load_config(cfg=cfg)
    cell = expand_cells(cfg)[0].to_json()
    folders, td = base_folders(tiny_base), root / "train"
    train_cell(cfg, cell, folders, td, threads=1)
    rec_path = root / "evaluate" / "records.parquet"
    evaluate_cell(cfg, cell, folders, td, rec_path, threads=1)
    probe_paths = [root / "probes" / f"{t}.parquet" for t in cfg["data"]["tasks"]] + [
        root / "probes" / "global.parquet"
    ]
    for t, p in zip(cfg["data"]["tasks"], probe_paths):
        probes.probe_task(cfg["probes"], rec_path, t, p)
    probes.probe_global(cfg["probes"], rec_path, probe_paths[-1])
    tabulate.write_cell_row(cell, rec_path, probe_paths, root / "row.parquet")
    return dict(
        cfg=cfg,
        cell=cell,
        root=root,
        folders=folders,
        train_dir=td,
        records=rec_path,
        probe_paths=probe_paths,
        row=root / "row.parquet",
    )


def test_records_schema(smoke):
    rec = read_parquet(smoke["records"])
    assert list(rec.columns) == RECORD_COLUMNS
    test = encoding.load_split(smoke["folders"].data, "test")
    assert len(rec) == len(test) == 20
    assert sorted(zip(rec.task, rec.example_id)) == sorted(zip(test.task, test.example_id))
    D = smoke["cell"]["latent_dim"]
    assert all(len(v) == D for col in ("router_z", "router_mu", "posterior_mu") for v in rec[col])
    assert (rec.n_generated <= 24).all() and (rec.n_generated >= 1).all()
    assert (rec.cell_id == smoke["cell"]["cell_id"]).all()
    # followed strategy = the single match; ambiguous generation = several matches
    n = rec.matched_strategies.map(len)
    assert (rec.followed_strategy.notna() == (n == 1)).all()
    assert (rec.generation_ambiguous == (n > 1)).all()


def test_per_example_losses_follow_the_family_identities(smoke):
    rec = read_parquet(smoke["records"])
    scales = json.loads((smoke["folders"].reference / "scales.json").read_text())
    s_ref = scales["S_ref"]["sum"]
    # dist_norm_i = raw_i / S_ref; active = 0.05 dist_norm + 0.95 tokcc (the cell's family)
    np.testing.assert_allclose(rec.base_relative_reconstruction * s_ref, rec.reconstruction_loss, rtol=1e-5)
    np.testing.assert_allclose(
        rec.active_reconstruction_objective,
        0.05 * rec.base_relative_reconstruction + 0.95 * rec.tokcc_reconstruction_loss,
        rtol=1e-5,
    )
    assert (rec.kl_prior_loss >= -1e-6).all()
    # sum aggregation: raw_i is a sum of n_supervised token NLLs, each > 0
    assert (rec.reconstruction_loss > 0).all()


def test_metrics_row_recomputed_from_records_with_task_verifiers(smoke):
    rec = read_parquet(smoke["records"])
    row = read_parquet(smoke["row"]).iloc[0]
    correct = [TASKS[t].final_answer_correct(x, y) for t, x, y in zip(rec.task, rec.x, rec.y_generated)]
    matched = [len(TASKS[t].matching_strategies(x, y)) >= 1 for t, x, y in zip(rec.task, rec.x, rec.y_generated)]
    assert row.final_answer_accuracy == pytest.approx(np.mean(correct))
    assert row.strategy_match_rate == pytest.approx(np.mean(matched))
    assert list(rec.correct) == correct
    assert row.n_test == 20
    for m in metrics.LOSS_METRICS:
        assert row[m] == pytest.approx(rec[m].mean())
    assert row.cell_id == smoke["cell"]["cell_id"] and row.arm == "sum"
    assert row.family_label == "dist+tokcc 0.05/0.95"
    assert row.beta_label == {0.01: "beta=.01", 0.1: "beta=.1", 1.0: "beta=1"}[smoke["cell"]["beta"]]
    assert row.token_aggregation == "sum" and row.latent_dim == 8


def test_metric_identities_on_the_row(smoke):
    row = read_parquet(smoke["row"]).iloc[0].to_dict()
    for m in metrics.METRICS:
        assert m in row
    for p in metrics.PROBE_METRICS:
        assert f"{p}_chance" in row and f"{p}_shuffled" in row
    _check_identities(row)
    scales = json.loads((smoke["folders"].reference / "scales.json").read_text())
    assert row["inferred_zfree_reference_scale"] == pytest.approx(scales["S_ref"]["sum"], rel=1e-5)


def _check_identities(row):
    def same(a, b):
        return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)

    assert same(row["matched_router_score"], row["within_task_router_probe"] * row["strategy_match_rate"])
    if row.get("posterior_probe_task_list") == row.get("within_task_router_probe_task_list"):  # same tasks
        assert same(row["posterior_router_probe_gap"], row["posterior_probe"] - row["within_task_router_probe"])
    assert same(row["inferred_zfree_reference_scale"], row["reconstruction_loss"] / row["base_relative_reconstruction"])
    assert same(row["kl_over_active_reconstruction"], row["kl_prior_loss"] / row["active_reconstruction_objective"])


def test_score_generations_positive_and_negative_controls():
    rows = []
    for task in ("sorting_algorithms", "multidigit_addition"):
        import random

        rng = random.Random(1)
        for s in TASKS[task].strategies:
            x = TASKS[task].sample_input(rng)
            rows.append({"task": task, "x": x, "strategy": s, "y": TASKS[task].render(x, s)})
    df = pd.DataFrame(rows)
    good = score_generations(df, df.y.tolist())
    assert good.correct.all()
    assert all(s in m for s, m in zip(df.strategy, good.matched_strategies))
    bad = score_generations(df, ["answer"] * len(df))
    assert not bad.correct.any()
    assert (bad.matched_strategies.map(len) == 0).all() and bad.followed_strategy.isna().all()


def test_select_test_rows():
    df = pd.DataFrame({"task": ["b", "a", "a", "b", "a"], "example_id": ["b2", "a3", "a1", "b1", "a2"]})
    sub = select_test_rows(df, 2)
    assert list(zip(sub.task, sub.example_id)) == [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")]
    assert len(select_test_rows(df, None)) == 5


def test_missing_and_corrupt_checkpoint_named(smoke, tmp_path):
    folders, td = smoke["folders"], smoke["train_dir"]
    cfg, cell = smoke["cfg"], smoke["cell"]
    empty = tmp_path / "empty_train"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=str(empty / "heads" / "heads.safetensors")):
        evaluate_cell(cfg, cell, folders, empty, tmp_path / "r.parquet", threads=1)
    import shutil

    bad = tmp_path / "bad_train"
    shutil.copytree(td, bad)
    w = bad / "adapters" / "generator" / "adapter_model.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(ValueError, match=f"cell {cell['cell_id']}: trained generator adapter {w} is unreadable"):
        evaluate_cell(cfg, cell, folders, bad, tmp_path / "r.parquet", threads=1)
    # weights of a different latent size: named, with the cell
    other = dict(cell, latent_dim=3)
    with pytest.raises(ValueError, match=f"cell {other['cell_id']}: {td / 'heads' / 'config.json'} does not fit"):
        evaluate_cell(cfg, other, folders, td, tmp_path / "r.parquet", threads=1)
    assert not (tmp_path / "r.parquet").exists()


def test_write_cell_metrics_hand_computed(tmp_path):
    cfg = load_config(ROOT / "config" / "smoke.yaml")
    cell = expand_cells(cfg)[0].to_json()
    cid = cell["cell_id"]
    rec = pd.DataFrame(
        {
            "cell_id": cid,
            "task": ["t1", "t1", "t2", "t2"],
            "example_id": ["a", "b", "c", "d"],
            "strategy": "s",
            "x": "x",
            "y_true": "y",
            "y_generated": "y",
            "matched_strategies": [["s"], [], ["s", "u"], ["u"]],
            "followed_strategy": ["s", None, None, "u"],
            "generation_ambiguous": [False, False, True, False],
            "ambiguous": False,
            "correct": [True, False, True, True],
            "router_z": [[0.0, 0.0]] * 4,
            "router_mu": [[0.0, 0.0]] * 4,
            # posterior minus router mean: dim 0 varies by 0.0075 (population variance), dim 1 by 0.547
            "posterior_mu": [[0.0, 1.0], [0.0, -1.0], [0.0, 0.5], [0.2, 0.0]],
            "n_supervised": 5,
            "n_generated": 5,
            "reconstruction_loss": [2.0, 4.0, 6.0, 8.0],
            "base_relative_reconstruction": [1.0, 2.0, 3.0, 4.0],
            "tokcc_reconstruction_loss": [1.0, 1.0, 1.0, 1.0],
            "kl_prior_loss": [0.5, 0.5, 1.5, 1.5],
            "active_reconstruction_objective": [2.0, 4.0, 6.0, 8.0],
        }
    )[RECORD_COLUMNS]
    write_parquet(rec, tmp_path / "records.parquet")

    def prow(task, probe, acc, chance, shuf, status="ok"):
        return dict(
            cell_id=cid,
            task=task,
            probe=probe,
            accuracy=acc,
            chance=chance,
            shuffled_accuracy=shuf,
            corrected=(acc - chance) / (1 - chance),
            n=10,
            n_classes=2,
            folds=2,
            n_dropped=0,
            dropped="",
            status=status,
            reason="" if status == "ok" else "few",
            example_ids=[],
            labels=[],
            oof_correct=[],
        )

    def info(task, ids, bits, entropy):
        """A router_information row: the bits of its probed examples over the task's 2 test
        examples and the data's strategy entropy."""
        return dict(
            cell_id=cid,
            task=task,
            probe="router_information",
            information=sum(bits) / 2 / entropy,
            strategy_entropy=entropy,
            n_task=2,
            status="ok",
            reason="",
            example_ids=ids,
            oof_bits=bits,
        )

    p1 = pd.DataFrame(
        [
            prow("t1", "within_task_router", 0.8, 0.5, 0.4),
            info("t1", ["a"], [1.0], 1.0),
            prow("t1", "posterior", 1.0, 0.5, 0.5),
        ]
    )
    p2 = pd.DataFrame(
        [
            prow("t2", "within_task_router", 0.6, 0.7, 0.6),
            info("t2", ["d"], [0.4], 2.0),
            prow("t2", "posterior", math.nan, 0.5, math.nan, "na"),
        ]
    )
    g = pd.DataFrame([prow("global", "global_router", 0.9, 0.25, 0.3)])
    paths = [tmp_path / f"{n}.parquet" for n in ("t1", "t2", "global")]
    for df, p in zip((p1, p2, g), paths):
        write_parquet(df.reindex(columns=PROBE_COLUMNS), p)
    row = tabulate.write_cell_row(cell, tmp_path / "records.parquet", paths, tmp_path / "m.parquet").iloc[0]
    assert row.final_answer_accuracy == pytest.approx(0.75)
    assert row.strategy_match_rate == pytest.approx(0.75)
    assert row.within_task_router_probe == pytest.approx(0.7)
    assert row.within_task_router_probe_chance == pytest.approx(0.6)
    assert row.within_task_router_probe_shuffled == pytest.approx(0.5)
    assert row.posterior_probe == pytest.approx(1.0) and row.posterior_probe_tasks == 1  # the na task is left out
    assert row.global_router_probe == pytest.approx(0.9)
    assert row.matched_router_score == pytest.approx(0.7 * 0.75)
    # chance-corrected: t1 (0.8 - 0.5) / 0.5 = 0.6, t2 (0.6 - 0.7) / 0.3 = -1/3 (below chance)
    assert row.within_task_router_probe_corrected == pytest.approx((0.6 - 1 / 3) / 2)
    # router information: t1 1 bit over 2 examples and 1 bit of entropy = 0.5, t2 0.4 / 2 / 2 = 0.1
    assert row.router_information == pytest.approx(0.3) and row.router_information_tasks == 2
    assert row.active_units == 1
    assert row.within_task_router_probe_task_list == "t1,t2" and row.posterior_probe_task_list == "t1"
    # the gap over the one task both probes cover (t1: 1.0 - 0.8), not 1.0 - mean(0.8, 0.6)
    assert row.posterior_router_probe_gap == pytest.approx(0.2)
    assert row.reconstruction_loss == pytest.approx(5.0)
    assert row.inferred_zfree_reference_scale == pytest.approx(2.0)
    assert row.kl_over_active_reconstruction == pytest.approx(1.0 / 5.0)
    _check_identities(row.to_dict())
    assert read_parquet(tmp_path / "m.parquet").shape[0] == 1

    # wrong cell, missing probe task
    other = dict(cell, cell_id="agg-mean_fam-raw_beta-1_seed-1")
    with pytest.raises(ValueError, match="belong to cell"):
        tabulate.write_cell_row(other, tmp_path / "records.parquet", paths, tmp_path / "m2.parquet")
    with pytest.raises(ValueError, match=r"lack the within_task_router probe of \['t2'\]"):
        tabulate.write_cell_row(cell, tmp_path / "records.parquet", [paths[0], paths[2]], tmp_path / "m2.parquet")
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        tabulate.write_cell_row(cell, tmp_path / "nope.parquet", paths, tmp_path / "m2.parquet")
