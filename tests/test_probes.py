import numpy as np
import pandas as pd
import pytest

from latentstrat.cell import probes
from latentstrat.cell.probes import linear_probe
from latentstrat.io import read_parquet, write_parquet

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
                rows.append(
                    {
                        "cell_id": "c1",
                        "task": task,
                        "example_id": f"{task}-{s}-{k}",
                        "strategy": s,
                        "followed_strategy": followed,
                        "ambiguous": k % 5 == 0,
                        "router_z": list(z + 0.1 * rng.standard_normal(6)),
                        "router_mu": list(np.zeros(6)),  # x alone tells nothing: z carries the strategy
                        "posterior_mu": list(rng.standard_normal(6)),
                    }
                )
    return pd.DataFrame(rows)


def test_probe_task_and_global(tmp_path):
    rng = np.random.default_rng(5)
    df = _records(rng)
    rec = tmp_path / "records.parquet"
    write_parquet(df, rec)
    out = probes.probe_task(CFG["probes"], rec, "sorting", tmp_path / "probes" / "sorting.parquet")
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
    assert list(out["probe"]) == ["within_task_router", "router_information", "router_mu_information", "posterior"]
    # per probed example: its id, label and out-of-fold correctness (the bootstrap's input)
    router = r.loc["within_task_router"]
    assert len(router["example_ids"]) == len(router["labels"]) == len(router["oof_correct"]) == 30
    assert np.mean(router["oof_correct"]) == pytest.approx(router["accuracy"], abs=0.02)
    assert all(i.startswith("sorting-") for i in router["example_ids"])

    g = probes.probe_global(CFG["probes"], rec, tmp_path / "probes" / "global.parquet").iloc[0]
    assert (g["task"], g["probe"], g["n_classes"], g["n"]) == ("global", "global_router", 5, 75)
    assert g["status"] == "ok"


def test_probe_task_na_row_and_errors(tmp_path):
    rng = np.random.default_rng(6)
    df = _records(rng, n_per=4)  # 3 followed per strategy < 5 folds
    rec = tmp_path / "records.parquet"
    write_parquet(df, rec)
    back = probes.probe_task(CFG["probes"], rec, "addition", tmp_path / "a.parquet").set_index("probe")
    assert back.loc["within_task_router", "status"] == "na"
    assert "fewer than folds=5" in back.loc["within_task_router", "reason"]
    assert back.loc["within_task_router", "dropped"] == "column:3, left:3, right:3"
    with pytest.raises(ValueError, match="no rows for task 'nope'"):
        probes.probe_task(CFG["probes"], rec, "nope", tmp_path / "b.parquet")
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        probes.probe_task(CFG["probes"], tmp_path / "missing.parquet", "addition", tmp_path / "c.parquet")
    write_parquet(df.drop(columns=["router_z"]), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="router_z"):
        probes.probe_global(CFG["probes"], tmp_path / "bad.parquet", tmp_path / "d.parquet")


def test_shuffled_control_can_be_skipped():
    rng = np.random.default_rng(7)
    y = np.repeat(["a", "b"], 20)
    X = _onehot(y, 0.1, rng)
    full = linear_probe(X, y, folds=4)
    quick = linear_probe(X, y, folds=4, shuffled_control=False)
    assert quick.accuracy == full.accuracy and quick.chance == full.chance
    assert np.isnan(quick.shuffled_accuracy) and not np.isnan(full.shuffled_accuracy)


# ----------------------------------------------------------------------------- the probe's model


def test_cv_is_scikit_learns_pipeline_on_our_folds():
    """The accuracy probe is make_pipeline(StandardScaler(), LogisticRegression()) fitted on each
    training fold of stratified_folds: the same out-of-fold predictions as scikit-learn's
    cross_val_predict on those folds."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import PredefinedSplit, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(9)
    y = rng.permutation(np.repeat(["a", "b", "c"], [50, 30, 20]))
    X = rng.standard_normal((100, 12)) * rng.uniform(0.2, 5, 12)
    X[:, 0] += (y == "a") * 1.5
    res = linear_probe(X, y, folds=5, seed=3, shuffled_control=False)
    fold = probes.stratified_folds(y, 5, 3)
    pred = cross_val_predict(
        make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)), X, y, cv=PredefinedSplit(fold)
    )
    assert list(res.oof_correct) == list(pred == y)


# ----------------------------------------------------------------------------- information


def _separable(labels, rng, d=8):
    """Features in which the label is written in the first dimension (+-3), plus noise."""
    X = rng.standard_normal((len(labels), d))
    X[:, 0] = [3.0 * sorted(set(labels)).index(s) for s in labels]
    return X


def test_information_of_an_empty_z_is_about_0():
    """z independent of the strategy: with the L2 strength chosen on held-out log-loss, the probe
    falls back to the class frequencies and gains about 0 bits (a probe with C = 1 reads far
    below 0 on 64-dimensional noise)."""
    rng = np.random.default_rng(20)
    for k, n in ((2, 300), (3, 300)):
        y = rng.permutation(np.repeat([f"s{i}" for i in range(k)], n // k))
        res = probes.information_probe(rng.standard_normal((n, 64)), y, folds=5, seed=0)
        assert res.status == "ok" and abs(res.bits) < 0.02 * np.log2(k), (k, res.bits)
        assert res.C <= 1e-2  # the inner CV picked strong regularization on noise


def _top_bits(prior, n_train):
    """The most bits an example can gain: the probe certain and right, its p = 1 mixed with the
    class frequency at weight 1 / n_train (probes.mixed_probability)."""
    return float(np.log2(probes.mixed_probability(1.0, prior, n_train)) - np.log2(prior))


def test_information_when_z_fixes_the_strategy_is_the_entropy_of_the_followed_mix():
    """Hand-computed: z fixes the strategy, 60 of one and 20 of the other (stratified 5-fold:
    every training fold holds 48 and 16, frequencies 3/4 and 1/4). Each example gains
    -log2(frequency) bits, less the mixing with the frequencies at weight 1/64:
    log2(4/3) + log2(1 - 1/256) = 0.409 for the common one, 2 + log2(1 - 3/256) = 1.983 for the
    rare one; their mean is H(3/4, 1/4) = 0.811 bits less 0.007. A balanced pair gains 1 bit
    each less 0.011."""
    rng = np.random.default_rng(21)
    y = rng.permutation(np.repeat(["a", "b"], [60, 20]))
    res = probes.information_probe(_separable(y, rng), y, folds=5, seed=0)
    bits = dict(zip(res.labels, res.oof_bits))
    top_a, top_b = _top_bits(0.75, 64), _top_bits(0.25, 64)
    assert (top_a, top_b) == (pytest.approx(0.4094, abs=1e-4), pytest.approx(1.9830, abs=1e-4))
    assert top_a - 0.005 < bits["a"] <= top_a and top_b - 0.005 < bits["b"] <= top_b
    h = -(0.75 * np.log2(0.75) + 0.25 * np.log2(0.25))
    assert h == pytest.approx(0.8113, abs=1e-4)
    assert res.bits == pytest.approx(0.75 * top_a + 0.25 * top_b, abs=0.005)
    y = np.repeat(["a", "b"], 40)
    assert probes.information_probe(_separable(y, rng), y, folds=5).bits == pytest.approx(_top_bits(0.5, 64), abs=0.005)


def test_information_of_a_collapsed_mix_is_0():
    """One strategy followed (the other too rare to stratify is dropped): nothing for z to tell,
    0 bits whatever z is; an accuracy probe on the same cell reads 0.98 of majority rate."""
    rng = np.random.default_rng(22)
    y = np.array(["a"] * 296 + ["b"] * 4)
    X = _separable(y, rng)
    res = probes.information_probe(X, y, folds=5)
    assert res.status == "ok" and res.bits == 0.0 and set(res.oof_bits) == {0.0} and res.n == 296
    assert res.dropped == "b:4" and "0 bits" in res.reason


def test_router_information_row_normalizes_by_the_data_mix_over_all_test_examples(tmp_path):
    """Per task: bits summed over the followed generations, over all the task's test examples
    and the entropy of their true strategies. In _records a quarter of the generations follow no
    strategy (0 bits) and z fixes the rest, balanced: 1 bit each, so 0.75 bits per example over
    H = 1 bit (sorting: 2 strategies)."""
    rng = np.random.default_rng(23)
    rec = tmp_path / "records.parquet"
    write_parquet(_records(rng), rec)
    r = (
        probes.probe_task(CFG["probes"], rec, "sorting", tmp_path / "p.parquet")
        .set_index("probe")
        .loc["router_information"]
    )
    assert r.status == "ok" and r.n_task == 40 and r.n == 30
    assert r.strategy_entropy == pytest.approx(1.0)
    # each followed example: 1 bit less the mixing at weight 1/24 (24 training examples per fold)
    assert r.information == pytest.approx(0.75 * _top_bits(0.5, 24), abs=0.005)
    assert 0.75 * _top_bits(0.5, 24) == pytest.approx(0.7272, abs=1e-4)
    assert len(r.oof_bits) == len(r.example_ids) == 30
    # addition: 3 strategies, 15 followed each of 20: log2(3) bits each (less the mixing) over H = log2(3)
    a = (
        probes.probe_task(CFG["probes"], rec, "addition", tmp_path / "a.parquet")
        .set_index("probe")
        .loc["router_information"]
    )
    assert a.information == pytest.approx(0.75 * _top_bits(1 / 3, 36) / np.log2(3), abs=0.01)


# ----------------------------------------------------------------------------- folds


@pytest.mark.parametrize(
    "counts,folds",
    [((10, 10), 5), ((7, 13, 5), 5), ((3, 4, 5, 6, 30), 3), ((2, 2), 2), ((295, 5), 5), ((11, 9, 17, 6, 8, 12), 4)],
)
def test_stratified_folds(counts, folds):
    rng = np.random.default_rng(14)
    y = rng.permutation(np.repeat([f"s{i}" for i in range(len(counts))], counts))
    fold = probes.stratified_folds(y, folds, seed=0)
    assert fold.shape == (len(y),) and set(fold.tolist()) == set(range(folds))
    parts = [set(np.flatnonzero(fold == f).tolist()) for f in range(folds)]
    assert sum(len(p) for p in parts) == len(y) and set().union(*parts) == set(range(len(y)))  # disjoint, cover
    for label, count in zip(sorted(set(y)), counts):
        per_fold = np.array([np.sum(y[list(p)] == label) for p in parts])
        assert np.all(np.abs(per_fold - count / folds) < 1), (label, per_fold)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert np.array_equal(probes.stratified_folds(y, folds, seed=0), fold)
    if len(y) >= 10:
        assert not np.array_equal(probes.stratified_folds(y, folds, seed=1), fold)
    else:  # few possible assignments: some other seed gives another one
        assert any(not np.array_equal(probes.stratified_folds(y, folds, seed=s), fold) for s in range(1, 6))


def test_stratified_folds_need_two_folds():
    with pytest.raises(ValueError, match="folds >= 2"):
        probes.stratified_folds(np.array(["a", "b"]), 1, seed=0)


# ----------------------------------------------------------------------------- controls


def test_separable_two_classes_are_probed_perfectly():
    """Positive control by hand: feature 0 is +1 for one class and -1 for the other, the rest
    noise; every held-out example is classified right. Negative control: random labels on random
    features score near chance."""
    rng = np.random.default_rng(15)
    y = np.repeat(["left", "right"], 30)
    X = rng.standard_normal((60, 6))
    X[:, 0] = np.where(y == "left", -1.0, 1.0)
    res = linear_probe(X, y, folds=5, seed=0)
    assert res.accuracy == 1.0 and all(res.oof_correct) and res.corrected == 1.0
    assert abs(res.shuffled_accuracy - 0.5) <= 0.2
    y_random = rng.permutation(np.repeat(["a", "b", "c"], 100))
    res = linear_probe(rng.standard_normal((300, 16)), y_random, folds=5, seed=0)
    assert abs(res.accuracy - 1 / 3) <= 0.08 and abs(res.corrected) <= 0.12


def test_probe_cell_writes_every_task_and_the_global_probe_equal_to_one_at_a_time(tmp_path):
    """The probe job: one process per cell, the records read once; each file equal to the one the
    task's own probe writes."""
    rng = np.random.default_rng(24)
    rec = tmp_path / "records.parquet"
    write_parquet(_records(rng), rec)
    outs = [tmp_path / "cell" / f"{n}.parquet" for n in ("addition", "sorting", "global")]
    probes.probe_cell(CFG["probes"], rec, ["addition", "sorting"], outs)
    for task, path in zip(("addition", "sorting"), outs):
        one = probes.probe_task(CFG["probes"], rec, task, tmp_path / f"{task}.parquet")
        pd.testing.assert_frame_equal(read_parquet(path), read_parquet(tmp_path / f"{task}.parquet"))
        assert len(one) == 4
    probes.probe_global(CFG["probes"], rec, tmp_path / "g.parquet")
    pd.testing.assert_frame_equal(read_parquet(outs[-1]), read_parquet(tmp_path / "g.parquet"))
    with pytest.raises(ValueError, match="2 tasks need 3 output paths"):
        probes.probe_cell(CFG["probes"], rec, ["addition", "sorting"], outs[:2])
