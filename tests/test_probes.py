import subprocess
import sys

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
                rows.append(
                    {
                        "cell_id": "c1",
                        "task": task,
                        "example_id": f"{task}-{s}-{k}",
                        "strategy": s,
                        "followed_strategy": followed,
                        "ambiguous": k % 5 == 0,
                        "router_z": list(z + 0.1 * rng.standard_normal(6)),
                        "posterior_mu": list(rng.standard_normal(6)),
                    }
                )
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


# ----------------------------------------------------------------------------- the probe's model


def test_importing_and_running_the_probe_does_not_import_sklearn():
    code = (
        "import sys, numpy as np; import latentstrat.probes as p; print('sklearn' in sys.modules); "
        "y = np.repeat(['a', 'b', 'c'], 10); p.linear_probe(np.random.default_rng(0).standard_normal((30, 4)), y); "
        "print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]


def _dataset(seed, n, d, k, separation):
    """n examples in d dims, k classes (all present) with class means `separation` apart, features
    on different scales and offsets (so standardization matters), one constant feature."""
    rng = np.random.default_rng(seed)
    codes = np.concatenate([np.arange(k), rng.integers(0, k, n - k)])
    X = separation * rng.standard_normal((k, d))[codes] + rng.standard_normal((n, d))
    X = X * rng.uniform(0.2, 5.0, d) + rng.uniform(-10.0, 10.0, d)
    X[:, 0] = 3.0
    return X, np.array([f"class{c}" for c in codes])


# (seed, n, d, k, separation): 2, 3, 6 and more classes; separable, informative and pure noise
DATASETS = [
    (0, 40, 8, 2, 4.0),
    (1, 300, 64, 2, 0.0),
    (2, 120, 32, 2, 0.3),
    (3, 60, 16, 3, 4.0),
    (4, 200, 64, 3, 0.3),
    (5, 250, 12, 3, 0.0),
    (6, 150, 24, 6, 3.0),
    (7, 300, 64, 6, 0.2),
    (8, 90, 40, 8, 0.0),
    (9, 280, 48, 10, 1.0),
]


@pytest.mark.parametrize("seed,n,d,k,separation", DATASETS)
def test_fit_matches_sklearn_logistic_regression(seed, n, d, k, separation):
    """Train on four folds, predict the fifth: the same labels and probabilities as scikit-learn's
    make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)) fitted on the same fold."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = _dataset(seed, n, d, k, separation)
    te = probes.stratified_folds(y, 5, seed) == 0
    X_tr, X_te = probes._standardize(X[~te], X[te])
    ours = probes._fit_logistic(X_tr, y[~te], max_iter=1000)
    ref = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(X[~te], y[~te])
    assert list(ours.classes) == list(ref.classes_)
    assert ours.coef.shape == ref[-1].coef_.shape == ((1, d) if k == 2 else (k, d))
    assert np.mean(ours.predict(X_te) == ref.predict(X[te])) >= 0.99
    assert np.abs(ours.predict_proba(X_te) - ref.predict_proba(X[te])).max() < 1e-3
    assert np.abs(ours.predict_proba(X_tr) - ref.predict_proba(X[~te])).max() < 1e-3


@pytest.mark.parametrize("seed,n,d,k,separation", DATASETS[::3])
def test_cv_matches_sklearn_pipeline_on_the_same_folds(seed, n, d, k, separation):
    """The whole cross-validation (scaler and model refitted per fold) against scikit-learn's
    pipeline on the same folds: the same out-of-fold predictions."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = _dataset(seed, n, d, k, separation)
    acc, correct = probes._cv_accuracy(X, y, folds=5, seed=seed, max_iter=1000)
    fold = probes.stratified_folds(y, 5, seed)
    ref_correct, ref_accs = np.zeros(n, dtype=bool), []
    for f in range(5):
        te = fold == f
        ref = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(X[~te], y[~te])
        ref_correct[te] = ref.predict(X[te]) == y[te]
        ref_accs.append(np.mean(ref_correct[te]))
    assert np.mean(correct == ref_correct) >= 0.99
    assert acc == pytest.approx(np.mean(ref_accs), abs=0.02)


def test_binary_fit_is_one_coefficient_vector_not_a_two_class_softmax():
    """Two classes: one vector w (P(second class) = sigmoid(w.x + b), penalty 0.5 ||w||^2), as
    scikit-learn fits it. A 2-class softmax penalizes both vectors, which halves the effective
    penalty on their difference, so it would give a different model; the control shows the data
    tell the two apart."""
    from scipy.optimize import minimize
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    X, y = _dataset(11, 40, 10, 2, 1.0)  # few examples: the penalty matters
    Xs = StandardScaler().fit_transform(X)
    ours = probes._fit_logistic(Xs, y, max_iter=1000)
    ref = LogisticRegression(max_iter=1000).fit(Xs, y)
    assert ours.coef.shape == (1, 10) and ours.intercept.shape == (1,)
    np.testing.assert_allclose(ours.coef, ref.coef_, atol=1e-4)
    np.testing.assert_allclose(ours.intercept, ref.intercept_, atol=1e-4)
    # the control: a 2-class softmax fit, its effective vector w1 - w0
    codes = (y == ours.classes[1]).astype(int)
    res = minimize(
        probes._multinomial_objective,
        np.zeros(2 * 11),
        args=(Xs, np.eye(2)[codes], 1 / 40),
        method="L-BFGS-B",
        jac=True,
        options={"gtol": 1e-8},
    )
    Wb = res.x.reshape((2, -1), order="F")
    softmax_coef = Wb[1, :-1] - Wb[0, :-1]
    assert np.abs(softmax_coef - ours.coef[0]).max() > 0.05


def test_objective_gradients_are_exact():
    from scipy.optimize import check_grad

    def check(objective, theta, *args):
        return check_grad(lambda th: objective(th, *args)[0], lambda th: objective(th, *args)[1], theta)

    rng = np.random.default_rng(12)
    X, codes = rng.standard_normal((30, 5)), rng.integers(0, 4, 30)
    assert check(probes._multinomial_objective, rng.standard_normal(4 * 6), X, np.eye(4)[codes], 0.1) < 1e-5
    assert check(probes._binary_objective, rng.standard_normal(6), X, (codes % 2).astype(float), 0.1) < 1e-5


def test_prediction_ties_go_to_the_first_label():
    X = np.ones((3, 2))
    for labels in (["b", "a"], ["c", "a", "b"]):
        classes = np.array(sorted(labels))
        k = 1 if len(classes) == 2 else len(classes)
        model = probes._LogisticModel(classes, np.zeros((k, 2)), np.zeros(k))
        assert list(model.predict(X)) == ["a"] * 3


def test_standardize_like_standard_scaler():
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(13)
    X = rng.standard_normal((50, 4)) * [1.0, 10.0, 0.1, 1.0] + [0.0, 5.0, -3.0, 0.0]
    X[:, 3] = 0.1  # constant (not exactly representable): centred, scale 1
    X_new = rng.standard_normal((7, 4))
    tr, te = probes._standardize(X, X_new)
    ref = StandardScaler().fit(X)
    np.testing.assert_allclose(tr, ref.transform(X), atol=1e-12)
    np.testing.assert_allclose(te, ref.transform(X_new), atol=1e-12)
    assert np.abs(tr[:, 3]).max() < 1e-12  # not blown up by a rounding-error std


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
