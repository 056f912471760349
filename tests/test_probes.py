import numpy as np
import pandas as pd
import pytest

from latentstrat import probes
from latentstrat.io import read_parquet, write_parquet
from latentstrat.probes import linear_probe

CFG = {"probes": {"folds": 5, "seed": 0, "max_iter": 1000}}


def _onehot(labels, noise, rng, extra=4):
    classes = sorted(set(labels))
    X = np.zeros((len(labels), len(classes) + extra))
    for i, s in enumerate(labels):
        X[i, classes.index(s)] = 1.0
    return X + noise * rng.standard_normal(X.shape)


def test_positive_control_onehot_plus_noise():
    rng = np.random.default_rng(0)
    y = np.repeat(["bubble", "insertion", "selection"], 40)
    res = linear_probe(_onehot(y, 0.1, rng), y, folds=5, seed=0)
    assert res.status == "ok" and res.reason == ""
    assert res.accuracy >= 0.95
    assert res.chance == pytest.approx(1 / 3)
    assert (res.n, res.n_classes, res.folds) == (120, 3, 5)
    # shuffled control on the same informative features: near chance, far below accuracy
    assert abs(res.shuffled_accuracy - res.chance) <= 0.12
    assert res.accuracy - res.shuffled_accuracy > 0.5


def test_negative_control_random_features():
    rng = np.random.default_rng(1)
    y = np.repeat(["a", "b", "c"], 200)
    res = linear_probe(rng.standard_normal((600, 8)), y, folds=5, seed=0)
    assert res.status == "ok"
    assert abs(res.accuracy - 1 / 3) <= 0.05
    assert abs(res.shuffled_accuracy - 1 / 3) <= 0.05


def test_chance_is_majority_rate():
    rng = np.random.default_rng(2)
    y = np.array(["a"] * 14 + ["b"] * 6)
    res = linear_probe(rng.standard_normal((20, 3)), y, folds=3)
    assert res.chance == pytest.approx(0.7)
    assert res.status == "ok"


def test_deterministic_given_seed():
    rng = np.random.default_rng(3)
    y = np.repeat(["a", "b"], 25)
    X = _onehot(y, 1.0, rng)
    assert linear_probe(X, y, seed=4) == linear_probe(X, y, seed=4)


def test_rare_class_is_dropped_not_the_task():
    rng = np.random.default_rng(4)
    # two classes, one too rare for 5 folds: dropping it leaves one class -> na, named
    y = np.array(["a"] * 10 + ["b"] * 3)
    res = linear_probe(rng.standard_normal((13, 2)), y, folds=5)
    assert res.status == "na" and res.n_dropped == 3 and res.dropped == "b:3"
    assert "b:3" in res.reason and "folds=5" in res.reason
    assert np.isnan(res.accuracy) and np.isnan(res.shuffled_accuracy) and res.chance == 1.0
    # three classes, one rare: the probe runs on the other two (chance from those), the drop recorded
    y = np.array(["a"] * 30 + ["b"] * 20 + ["c"] * 4)
    X = rng.standard_normal((54, 3))
    X[y == "a", 0] += 4.0  # a is separable from b
    res = linear_probe(X, y, folds=5)
    assert res.status == "ok" and res.n == 50 and res.n_classes == 2 and res.dropped == "c:4"
    assert res.chance == pytest.approx(0.6) and res.accuracy > 0.9
    assert res.corrected == pytest.approx((res.accuracy - 0.6) / 0.4)


def test_chance_corrected_score_separates_collapse_from_information():
    """A collapsed cell: 295 of 300 generations follow one strategy; random z gets the chance
    accuracy 0.983 but a corrected score near 0. An informative cell with balanced classes and
    a lower raw accuracy (0.9) has the far higher corrected score."""
    rng = np.random.default_rng(0)
    y = np.array(["a"] * 295 + ["b"] * 5)
    collapsed = linear_probe(rng.standard_normal((300, 8)), y, folds=5)
    assert collapsed.accuracy > 0.95 and abs(collapsed.corrected) < 0.3
    y2 = np.array(["a"] * 150 + ["b"] * 150)
    X2 = rng.standard_normal((300, 8))
    X2[:, 0] += np.where(y2 == "a", 1.3, -1.3)
    informative = linear_probe(X2, y2, folds=5)
    assert informative.accuracy < collapsed.accuracy and informative.corrected > collapsed.corrected + 0.5


def test_na_single_class_and_empty():
    res = linear_probe(np.ones((8, 2)), ["a"] * 8, folds=2)
    assert res.status == "na" and "1 class" in res.reason
    res = linear_probe(np.zeros((0, 2)), [], folds=2)
    assert res.status == "na" and res.n == 0


def test_bad_features_raise():
    with pytest.raises(ValueError, match="NaN"):
        linear_probe(np.array([[np.nan], [1.0], [2.0], [3.0]]), ["a", "a", "b", "b"], folds=2)
    with pytest.raises(ValueError, match="labels"):
        linear_probe(np.ones((3, 2)), ["a", "b"], folds=2)


def _records(rng, n_per=20):
    rows = []
    for task, strategies in [("sorting", ["bubble", "insertion"]), ("addition", ["left", "right", "column"])]:
        for s_i, s in enumerate(strategies):
            for k in range(n_per):
                z = np.zeros(6)
                z[s_i] = 3.0
                followed = s if k % 4 else None  # a quarter did not follow one strategy
                rows.append({"cell_id": "c1", "task": task, "example_id": f"{task}-{s}-{k}", "strategy": s,
                             "followed_strategy": followed,
                             "ambiguous": k % 5 == 0,
                             "router_z": list(z + 0.1 * rng.standard_normal(6)),
                             "posterior_mu": list(rng.standard_normal(6))})
    return pd.DataFrame(rows)


def test_probe_task_and_global(tmp_path):
    rng = np.random.default_rng(5)
    df = _records(rng)
    rec = tmp_path / "records.parquet"
    write_parquet(df, rec)
    out = probes.probe_task(CFG, rec, "sorting", tmp_path / "probes" / "sorting.parquet")
    back = read_parquet(tmp_path / "probes" / "sorting.parquet")
    assert list(back.columns) == probes.PROBE_COLUMNS
    r = back.set_index("probe")
    # router: 15 of 20 per strategy followed one; z informative
    assert r.loc["within_task_router", "n"] == 30
    assert r.loc["within_task_router", "accuracy"] >= 0.95
    # posterior: 16 of 20 unambiguous per strategy; features random -> near chance (0.5)
    assert r.loc["posterior", "n"] == 32
    assert abs(r.loc["posterior", "accuracy"] - 0.5) <= 0.25
    assert (back["cell_id"] == "c1").all() and (back["task"] == "sorting").all()
    assert len(out) == 2
    # per probed example: its id, label and out-of-fold correctness (the bootstrap's input)
    router = r.loc["within_task_router"]
    assert len(router["example_ids"]) == len(router["labels"]) == len(router["oof_correct"]) == 30
    assert np.mean(router["oof_correct"]) == pytest.approx(router["accuracy"], abs=0.02)
    assert all(i.startswith("sorting-") for i in router["example_ids"])

    g = probes.probe_global(CFG, rec, tmp_path / "probes" / "global.parquet").iloc[0]
    assert (g["task"], g["probe"], g["n_classes"], g["n"]) == ("global", "global_router", 5, 75)
    assert g["status"] == "ok"


def test_probe_task_na_row_and_errors(tmp_path):
    rng = np.random.default_rng(6)
    df = _records(rng, n_per=4)  # 3 followed per strategy < 5 folds
    rec = tmp_path / "records.parquet"
    write_parquet(df, rec)
    back = probes.probe_task(CFG, rec, "addition", tmp_path / "a.parquet").set_index("probe")
    assert back.loc["within_task_router", "status"] == "na"
    assert "fewer than folds=5" in back.loc["within_task_router", "reason"]
    assert back.loc["within_task_router", "dropped"] == "column:3, left:3, right:3"
    with pytest.raises(ValueError, match="no rows for task 'nope'"):
        probes.probe_task(CFG, rec, "nope", tmp_path / "b.parquet")
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        probes.probe_task(CFG, tmp_path / "missing.parquet", "addition", tmp_path / "c.parquet")
    write_parquet(df.drop(columns=["router_z"]), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="router_z"):
        probes.probe_global(CFG, tmp_path / "bad.parquet", tmp_path / "d.parquet")


def test_shuffled_control_can_be_skipped():
    rng = np.random.default_rng(7)
    y = np.repeat(["a", "b"], 20)
    X = _onehot(y, 0.1, rng)
    full = linear_probe(X, y, folds=4)
    quick = linear_probe(X, y, folds=4, shuffled_control=False)
    assert quick.accuracy == full.accuracy and quick.chance == full.chance
    assert np.isnan(quick.shuffled_accuracy) and not np.isnan(full.shuffled_accuracy)
