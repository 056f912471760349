"""The information probe against a known mutual information, its per-example bound, and the parts
of the cell metrics built on it: the interval that carries the probe's own variance
(information_replicates), router_mu_information, token_base_relative_reconstruction and the
decomposition of the endpoint (tabulate.endpoint_decomposition, report/decomposition.py)."""

import math

import numpy as np
import pandas as pd
import pytest

from aggregate_helpers import cell_settings
from latentstrat.cell import probes, tabulate
from latentstrat.cell.tabulate import (
    bootstrap_replicates,
    cell_row,
    endpoint_decomposition,
    information_replicates,
    reference_sums,
)
from latentstrat.io import write_parquet
from latentstrat.metrics import BOOTSTRAP_METRICS, METRICS, interval, resample_counts
from latentstrat.report.decomposition import decomposition, decomposition_md


def true_mi_bits(shift: float) -> float:
    """I(z; s) in bits for two equiprobable classes, z | s ~ N(+-shift/2, 1) along one dimension
    (other dimensions independent noise add nothing): 1 - E_z[h2(p(s | z))], by quadrature."""
    z = np.linspace(-14, 14, 400_001)
    phi = lambda x: np.exp(-(x**2) / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    a, b = 0.5 * phi(z - shift / 2), 0.5 * phi(z + shift / 2)
    pz, pa = a + b, a / (a + b)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.nan_to_num(pa * np.log2(pa)) - np.nan_to_num((1 - pa) * np.log2(1 - pa))
    return float(1 - np.sum(pz * h) * (z[1] - z[0]))


def test_true_mi_by_quadrature():
    """The reference values themselves: 0 without a shift, 1 bit when the classes separate, and
    the textbook value for unit separation in between."""
    assert true_mi_bits(0.0) == pytest.approx(0.0, abs=1e-9)
    assert true_mi_bits(12.0) == pytest.approx(1.0, abs=1e-6)
    assert true_mi_bits(1.0) == pytest.approx(0.1607, abs=1e-4)
    assert true_mi_bits(2.0) == pytest.approx(0.4859, abs=1e-4)


def _shifted(shift, rng, n=300, d=64):
    y = rng.permutation(np.repeat(["a", "b"], n // 2))
    X = rng.standard_normal((n, d))
    X[:, 0] += np.where(y == "a", shift / 2, -shift / 2)
    return X, y


@pytest.mark.parametrize("shift", [0.0, 1.0, 2.0, 3.0])
def test_information_probe_bias_against_known_mutual_information(shift):
    """Two classes, n = 300, 64 dimensions, the class shifting the mean of one dimension by
    `shift`: the true I(z; s) is 0, 0.161, 0.486, 0.760 bits. The cross-validated estimate (mean
    over 3 data sets) is biased down, by what learning a probe from 240 examples in 64 dimensions
    costs: measured -0.01, 0.048, 0.292, 0.540 (bias -0.01, -0.11, -0.19, -0.22 bits; 30-70% of the
    truth). Pinned: about 0 (within 0.015) for no shift, else between 0.08 and 0.25 bits below the
    truth: a probe that lost or gained more than that fails, as does one that reads above the
    truth."""
    truth = true_mi_bits(shift)
    est = []
    for seed in range(3):
        X, y = _shifted(shift, np.random.default_rng(100 + seed))
        est.append(probes.information_probe(X, y, folds=5, seed=0).bits)
    mean = float(np.mean(est))
    if shift == 0:
        assert abs(mean) < 0.015, est
    else:
        assert truth - 0.25 <= mean <= truth - 0.08, (shift, truth, est)
        assert mean > 0.2 * truth


def test_one_confidently_wrong_example_costs_at_most_log2_n_train():
    """One example of class a sits deep among class b (z = +30 where b is at +3 and a at -3): the
    probe gives it p(a | z) ~ 0. Mixed with the training fold's frequency at weight 1/n_train, it
    costs log2(n_train) bits (here 240 training examples: 7.9 bits), where the old 1e-12 clip let it
    cost ~40 bits and pull the task's estimate down by 0.13 bits on its own."""
    rng = np.random.default_rng(7)
    y = np.repeat(["a", "b"], 150)
    X = rng.standard_normal((300, 4))
    X[:, 0] += np.where(y == "a", -3.0, 3.0)
    X[0, 0] = 30.0  # example 0 is class a
    res = probes.information_probe(X, y, folds=5, seed=0)
    n_train = 240
    worst = res.oof_bits[res.kept.index(0)]
    assert -math.log2(n_train) - 1e-9 <= worst <= -math.log2(n_train) + 0.05
    # the rest of the examples: near the 1 bit each that z gives them
    others = np.delete(np.asarray(res.oof_bits), res.kept.index(0))
    assert others.min() > -math.log2(n_train) and np.median(others) > 0.95
    # what the clip would have charged: the probe's own probability of the outlier's class
    fold = probes.stratified_folds(y, 5, 0)
    tr = fold != fold[0]
    model = probes._fit(probes._logistic_cv(5, 0, 1000), X[tr], y[tr])
    p_raw = model.predict_proba(X[:1])[0, list(model.classes_).index("a")]
    assert math.log2(max(p_raw, 1e-12)) - math.log2(0.5) < -30


def test_mixed_probability_bounds():
    """The bound by itself: for every probe probability in [0, 1] and prior, the bits over the
    prior lie in [-log2(n_train), -log2(prior)], the lower end reached at p = 0."""
    p = np.linspace(0, 1, 101)
    for prior in (0.02, 0.25, 0.5, 0.9):
        for n_train in (8, 64, 240, 5000):
            bits = np.log2(probes.mixed_probability(p, prior, n_train)) - np.log2(prior)
            assert bits.min() == pytest.approx(-math.log2(n_train), abs=1e-12)
            assert bits.max() <= -math.log2(prior) + 1e-12
            assert np.all(np.diff(bits) > 0)  # order kept


def test_repeats_average_per_example_and_repeat_0_is_the_single_cv():
    """R = 3 runs the CV on fold seeds seed, seed+1, seed+2: oof_bits is the mean of the three
    rows of oof_bits_repeats; row 0 equals the R = 1 probe (the split it always used)."""
    X, y = _shifted(1.0, np.random.default_rng(3), n=120, d=8)
    one = probes.information_probe(X, y, folds=5, seed=4, repeats=1)
    three = probes.information_probe(X, y, folds=5, seed=4, repeats=3)
    reps = np.asarray(three.oof_bits_repeats)
    assert reps.shape == (3, 120)
    np.testing.assert_allclose(reps[0], one.oof_bits)
    np.testing.assert_allclose(reps.mean(axis=0), three.oof_bits)
    assert three.bits == pytest.approx(float(reps.mean()))
    assert not np.allclose(reps[1], reps[0])  # another split, other bits
    with pytest.raises(ValueError, match="repeats >= 1"):
        probes.information_probe(X, y, repeats=0)


# ----------------------------------------------------------------------------- cell records

TASKS = {"sorting": ["bubble", "insertion"], "addition": ["left", "right", "column"]}


def _cell_records(rng, n=60, d=8, z_shift=0.0, mu_shift=0.0, z_noise=1.0, none_every=0):
    """Records of one cell: per task n test inputs, true strategies balanced, each generation
    follows its true strategy (every `none_every`-th follows none). The router mean mu carries
    mu_shift in dimension j of strategy j (what x decides); z = mu + noise + z_shift in dimension
    3 + j (what the sampled z adds)."""
    rows = []
    for task, strategies in TASKS.items():
        k = len(strategies)
        for i in range(n):
            s = strategies[i % k]
            j = strategies.index(s)
            mu = np.zeros(d)
            mu[j] = mu_shift
            z = mu + z_noise * rng.standard_normal(d)
            z[3 + j] += z_shift
            rows.append(
                {
                    "cell_id": "c",
                    "task": task,
                    "example_id": f"{task}-{i}",
                    "strategy": s,
                    "followed_strategy": None if none_every and i % none_every == 0 else s,
                    "ambiguous": False,
                    "router_z": list(z),
                    "router_mu": list(mu),
                    "posterior_mu": list(rng.standard_normal(d)),
                    "correct": True,
                    "matched_strategies": [s],
                    "n_supervised": 10,
                    **{m: 1.0 for m in ("reconstruction_loss", "base_relative_reconstruction")},
                    **{m: 1.0 for m in ("tokcc_reconstruction_loss", "active_reconstruction_objective")},
                    "kl_prior_loss": 0.5,
                }
            )
    return pd.DataFrame(rows)


def _information_tables(rec, repeats):
    """The router_information rows alone (the other probes are not needed and cost time)."""
    settings = {"folds": 5, "seed": 0, "max_iter": 1000, "information_repeats": repeats}
    rows = []
    for t in TASKS:
        g = rec[rec["task"] == t]
        X = np.stack([np.asarray(v) for v in g["router_z"]])
        y, ids = g["followed_strategy"].to_numpy(), g["example_id"].to_numpy()
        rows.append(probes._information_row(settings, "c", t, X, y, ids, g, "router_information"))
    return pd.DataFrame(rows, columns=probes.PROBE_COLUMNS)


def _probe_tables(rec, repeats):
    settings = {"folds": 5, "seed": 0, "max_iter": 1000, "information_repeats": repeats}
    frames = [probes.task_table(settings, rec, t, "records") for t in TASKS]
    frames.append(probes.global_table(settings, rec, "records"))
    return pd.concat(frames, ignore_index=True)


def _width(reps):
    lo, hi = interval(reps)
    return hi - lo


def _replicates(rec, pr, frozen, name="router_information"):
    by_task = {t: rec[rec["task"] == t] for t in sorted(rec["task"].unique())}
    C = resample_counts({t: len(g) for t, g in by_task.items()}, 1000)
    return information_replicates(pr, by_task, C, 1000, name, frozen=frozen)


def test_the_interval_carries_the_probes_variance_where_fold_splits_matter():
    """A weak signal on few examples (60 per task, 8 dimensions): the task's estimate moves with
    the fold split (the inner CV's L2 strength and the refit change). Replicates drawn from one
    repeat each give an interval at least 10% wider than the frozen mean bits; with R = 1 the two
    are the same replicates exactly. Negative control: a z that fixes the strategy gives nearly the
    same bits in every split, and the interval does not widen (by under 0.001, where the weak
    signal's widens by more than 0.01)."""
    rec = _cell_records(np.random.default_rng(11), z_shift=0.9)
    pr = _information_tables(rec, repeats=3)
    spread = [np.std([np.sum(r) for r in row]) for row in pr["oof_bits_repeats"]]
    assert min(spread) > 0.3, spread  # a task's summed bits differ between splits
    wide, frozen = _replicates(rec, pr, False), _replicates(rec, pr, True)
    assert _width(wide) > 1.10 * _width(frozen), (_width(wide), _width(frozen))
    assert _width(wide) - _width(frozen) > 0.01
    value = float(pr["information"].mean())  # centred on the cell's value either way
    assert np.mean(wide) == pytest.approx(value, abs=0.01) and np.mean(frozen) == pytest.approx(value, abs=0.01)
    pr1 = _information_tables(rec, repeats=1)
    np.testing.assert_array_equal(_replicates(rec, pr1, False), _replicates(rec, pr1, True))
    rec_fixed = _cell_records(np.random.default_rng(12), z_shift=12.0, z_noise=0.3)
    pr_fixed = _information_tables(rec_fixed, repeats=3)
    w, f = _width(_replicates(rec_fixed, pr_fixed, False)), _width(_replicates(rec_fixed, pr_fixed, True))
    assert abs(w - f) < 0.001


def test_router_mu_information_separates_x_from_z():
    """Positive control: the router mean carries the strategy (x decides it), so the sampled z
    does too, and router_mu_information is as high as router_information. Negative control: the
    router mean is 0 and only the sampled z carries it: router_mu_information about 0, its 95%
    interval below router_information's."""
    from_x = _cell_records(np.random.default_rng(21), n=40, mu_shift=8.0, z_noise=0.3)
    from_z = _cell_records(np.random.default_rng(22), n=40, z_shift=8.0, z_noise=0.3)
    out = {}
    for name, rec in (("x", from_x), ("z", from_z)):
        pr = _probe_tables(rec, repeats=1)
        row = cell_row(_cell(), rec, pr)
        reps = bootstrap_replicates(rec, pr)
        out[name] = (row, {m: interval(reps[m]) for m in ("router_information", "router_mu_information")})
    row, ci = out["x"]
    assert row["router_mu_information"] > 0.9 and row["router_information"] > 0.9
    assert row["router_mu_information_tasks"] == 2
    row, ci = out["z"]
    assert abs(row["router_mu_information"]) < 0.03 and row["router_information"] > 0.9
    assert ci["router_mu_information"][1] < ci["router_information"][0]
    assert ci["router_mu_information"][0] <= row["router_mu_information"] <= ci["router_mu_information"][1]


def _cell(aggregation="sum"):
    return cell_settings(aggregation=aggregation)


# ----------------------------------------------------------------------------- token-weighted base-relative


def _loss_records(aggregation, l_tokens, b_tokens, n_bar):
    """Records whose per-example losses are A_i(l) and A_i(l) / S_ref under `aggregation`, from
    per-token l; S_ref = mean_i A_i(b) (here over the same examples, as a stand-in for validation)."""

    def agg(v):
        s = float(np.sum(v))
        return {"mean": s / len(v), "sum": s, "sum_scaled": s / n_bar}[aggregation]

    s_ref = float(np.mean([agg(b) for b in b_tokens]))
    rows = []
    for i, (l, b) in enumerate(zip(l_tokens, b_tokens)):
        rows.append(
            {
                "task": "t1" if i < 2 else "t2",
                "example_id": f"e{i}",
                "n_supervised": len(l),
                "reconstruction_loss": agg(l),
                "base_relative_reconstruction": agg(l) / s_ref,
            }
        )
    return pd.DataFrame(rows)


def _tokens_table(b_tokens, train_n=(4, 8)):
    rows = [
        {"task": "t1" if i < 2 else "t2", "example_id": f"e{i}", "split": "test", "n_supervised": len(b), "b": b}
        for i, b in enumerate(b_tokens)
    ]
    rows += [
        {"task": "t1", "example_id": f"tr{i}", "split": "train", "n_supervised": n, "b": [1.0] * n}
        for i, n in enumerate(train_n)
    ]
    return pd.DataFrame(rows)


def test_token_base_relative_reconstruction_is_one_weighting_in_every_aggregation():
    """Hand-computed: four test examples of 2, 6, 3 and 9 tokens, b per token 1, 1, 0.5, 0.5 (sum
    of b: 2 + 6 + 1.5 + 4.5 = 14); the cell's l is b times 0.5 on the short examples and 1.5 on the
    long ones (sum of l: 1 + 9 + 0.75 + 6.75 = 17.5): 17.5 / 14 = 1.25 under mean, sum and
    sum_scaled (n_bar = 6, the train mean). base_relative_reconstruction reads 1.0 under mean
    (example-weighted: the mean of per-example ratios 0.67, 2, 0.33, 1) and 1.25 under sum: the
    control that the metric the cell-state rule used is not one weighting."""
    b = [[1.0, 1.0], [1.0] * 6, [0.5] * 3, [0.5] * 9]
    scale = [0.5, 1.5, 0.5, 1.5]
    l_tok = [[s * x for x in bb] for s, bb in zip(scale, b)]
    expected = sum(map(sum, l_tok)) / sum(map(sum, b))
    assert expected == pytest.approx((1.0 + 9.0 + 0.75 + 6.75) / 14.0)
    ref = reference_sums(_tokens_table(b))
    assert ref["n_bar"] == 6.0
    got, brr = {}, {}
    for agg in ("mean", "sum", "sum_scaled"):
        rec = _loss_records(agg, l_tok, b, ref["n_bar"])
        got[agg] = tabulate.token_base_relative(rec, agg, ref)
        brr[agg] = rec["base_relative_reconstruction"].mean()
        assert got[agg] == pytest.approx(expected, rel=1e-12), agg
    assert brr["mean"] == pytest.approx(1.0) and brr["sum"] == pytest.approx(expected)
    assert abs(brr["mean"] - brr["sum"]) > 0.2
    assert math.isnan(tabulate.token_base_relative(rec, "sum", None))
    bad = _tokens_table(b)
    bad.loc[0, "n_supervised"] = 3
    with pytest.raises(ValueError, match="n_supervised=3"):
        tabulate.token_base_relative(rec, "sum", reference_sums(bad))
    with pytest.raises(ValueError, match="no test row"):
        tabulate.token_base_relative(rec, "sum", reference_sums(_tokens_table(b).iloc[1:]))


def test_write_cell_metrics_reads_the_reference_tokens(tmp_path):
    """End to end: the metrics row and its bootstrap interval from the reference stage's
    tokens.parquet (the interval holds the value and has width); without the file the metric is NaN."""
    rng = np.random.default_rng(5)
    rec = _cell_records(rng, n=40)
    n_tok = rng.integers(3, 12, len(rec))
    rec["n_supervised"] = n_tok
    b = [list(rng.uniform(0.2, 2.0, k)) for k in n_tok]
    l_sum = np.array([sum(x) for x in b]) * rng.uniform(0.5, 0.9, len(rec))
    rec["reconstruction_loss"] = l_sum / n_tok  # a `mean` cell
    tokens = pd.DataFrame(
        {"task": rec["task"], "example_id": rec["example_id"], "split": "test", "n_supervised": n_tok, "b": b}
    )
    write_parquet(tokens, tmp_path / "tokens.parquet")
    write_parquet(rec, tmp_path / "records.parquet")
    settings = {"folds": 5, "seed": 0, "max_iter": 1000, "information_repeats": 1}
    outs = [tmp_path / f"{t}.parquet" for t in (*TASKS, "global")]
    probes.probe_cell(settings, tmp_path / "records.parquet", list(TASKS), outs)
    cell = _cell("mean")
    row = tabulate.write_cell_row(
        cell,
        tmp_path / "records.parquet",
        outs,
        tmp_path / "m.parquet",
        reference_tokens_path=tmp_path / "tokens.parquet",
    ).iloc[0]
    expected = l_sum.sum() / sum(map(sum, b))
    assert row.token_base_relative_reconstruction == pytest.approx(expected)
    assert row.token_base_relative_reconstruction_ci_low < expected < row.token_base_relative_reconstruction_ci_high
    row = tabulate.write_cell_row(cell, tmp_path / "records.parquet", outs, tmp_path / "m2.parquet").iloc[0]
    assert math.isnan(row.token_base_relative_reconstruction)
    assert (
        {"token_base_relative_reconstruction", "router_mu_information"}
        <= set(BOOTSTRAP_METRICS)
        <= set(METRICS)
        | {
            "within_task_router_probe_corrected",
            "posterior_probe_corrected",
        }
    )


# ----------------------------------------------------------------------------- decomposition


def _info_row(task, ids, bits, entropy, n_task):
    return {
        "cell_id": "c",
        "task": task,
        "probe": "router_information",
        "information": sum(bits) / n_task / entropy,
        "strategy_entropy": entropy,
        "n_task": n_task,
        "status": "ok",
        "reason": "",
        "example_ids": ids,
        "oof_bits": bits,
    }


def test_decomposition_multiplies_back_per_task():
    """Hand-computed. t1: 4 test examples, data mix a a b b (H = 1); 3 follow one strategy (a, a,
    b: share 3/4, entropy H(2/3, 1/3) = 0.918 bits) with bits 0.5, 0.5, 0.2 (1.2 bits, 0.4 per
    followed generation: 0.4 / 0.918 = 0.436 of the followed mix). t2: 2 examples, both follow a
    (share 1, entropy 0: information of the followed mix undefined, the task reads 0). The cell:
    share 7/8, entropy 0.459, information of the followed mix 0.436 (t1 only). Per task the parts
    multiply back to router_information: t1 0.75 x 0.436 x 0.918 / 1 = 0.3 = 1.2 / 4."""
    rec = pd.DataFrame(
        {
            "task": ["t1"] * 4 + ["t2"] * 2,
            "example_id": ["a", "b", "c", "d", "e", "f"],
            "strategy": ["a", "a", "b", "b", "a", "b"],
            "followed_strategy": ["a", "a", "b", None, "a", "a"],
        }
    )
    pr = pd.DataFrame(
        [
            _info_row("t1", ["a", "b", "c"], [0.5, 0.5, 0.2], 1.0, 4),
            _info_row("t2", ["e", "f"], [0.0, 0.0], 1.0, 2),
        ]
    )
    d = endpoint_decomposition(rec, pr)
    h1 = -(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3))
    assert d["single_strategy_share"] == pytest.approx(7 / 8)
    assert d["followed_strategy_entropy"] == pytest.approx(h1 / 2)
    assert d["router_information_of_followed"] == pytest.approx(0.4 / h1)
    assert 0.75 * (0.4 / h1) * h1 / 1.0 == pytest.approx(pr.loc[0, "information"])
    # no task with a followed mix of more than one strategy: NaN, not a division by 0
    flat = rec.assign(followed_strategy=["a"] * 6)
    assert math.isnan(endpoint_decomposition(flat, pr)["router_information_of_followed"])
    # nothing followed: share 0, entropy 0
    none = endpoint_decomposition(rec.assign(followed_strategy=None), pr)
    assert none["single_strategy_share"] == 0 and none["followed_strategy_entropy"] == 0


def test_decomposition_on_probed_cells_matches_router_information():
    """On probed records (one task with 2 strategies, so the cell is one task's product): a
    quarter of the generations follow none, z fixes the rest. share 0.75 x information of the
    followed mix x followed entropy / data entropy = router_information, to rounding."""
    rec = _cell_records(np.random.default_rng(31), z_shift=10.0, z_noise=0.3, none_every=4)
    rec = rec[rec["task"] == "sorting"]
    pr = _probe_tables_one(rec)
    row = cell_row(_cell(), rec, pr)
    assert row["single_strategy_share"] == pytest.approx(0.75)
    product = (
        row["single_strategy_share"]
        * row["router_information_of_followed"]
        * row["followed_strategy_entropy"]
        / float(pr.loc[pr.probe == "router_information", "strategy_entropy"].iloc[0])
    )
    assert product == pytest.approx(row["router_information"], rel=1e-9)
    assert row["router_information_of_followed"] > 0.9


def _probe_tables_one(rec):
    settings = {"folds": 5, "seed": 0, "max_iter": 1000, "information_repeats": 1}
    return pd.concat(
        [probes.task_table(settings, rec, "sorting", "records"), probes.global_table(settings, rec, "records")],
        ignore_index=True,
    )


def test_decomposition_table_per_arm_shows_which_part_moved():
    """Two arms over two settings each: the comparison arm follows a narrower mix (entropy 0.5
    against 1.0) with the same share and information of the followed mix; its router information
    is half. The table's difference row puts the move in the entropy column only."""
    s = pd.DataFrame(
        {
            "arm": ["sum", "sum", "mean", "mean"],
            "single_strategy_share": [0.9, 0.9, 0.9, 0.9],
            "followed_strategy_entropy": [1.0, 1.0, 0.5, 0.5],
            "router_information_of_followed": [0.8, 0.6, 0.8, 0.6],
            "router_information": [0.63, 0.45, 0.315, 0.225],
        }
    )
    t = {
        "summary_by_setting": s,
        "collection_state": pd.DataFrame({"arm": ["sum", "mean"], "role": ["primary", "comparison"]}),
    }
    d = decomposition(t)
    assert d["sum"] == {
        "single_strategy_share": pytest.approx(0.9),
        "followed_strategy_entropy": pytest.approx(1.0),
        "router_information_of_followed": pytest.approx(0.7),
        "router_information": pytest.approx(0.54),
        "settings": 2,
    }
    assert d["mean"]["followed_strategy_entropy"] == pytest.approx(0.5)
    md = "\n".join(decomposition_md(t))
    assert "## Router Information Decomposed" in md
    diff = next(line for line in md.splitlines() if line.startswith("| sum - mean"))
    cells = [c.strip() for c in diff.strip("|").split("|")]
    assert [float(c) for c in cells[2:]] == [0, 0.5, 0, 0.27]
    # an arm without the parts (an external table, an older aggregate): NA, not a crash
    t2 = {"summary_by_setting": s[["arm", "router_information"]], "collection_state": t["collection_state"]}
    assert decomposition(t2)["mean"]["single_strategy_share"] is None
    assert "NA" in "\n".join(decomposition_md(t2))
    assert decomposition({"summary_by_setting": pd.DataFrame()}) == {} and decomposition_md({}) == []
