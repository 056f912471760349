"""Verdicts from evidence: the report calls a delta negative or positive only when its 95%
interval excludes 0 (a collection whose arms differ by less than their noise gets "cannot
tell"; one where they differ clearly gets the sign), and the learn-then-collapse test keeps
its false-positive rate at or below 5% under no change."""

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from latentstrat.metrics import interval, resample_counts
from latentstrat.report.__main__ import main as report_cli
from latentstrat.report.findings import ALPHA, q_early_or_late, rise_fall_pvalues

FAMILIES = ["raw", "dist_norm", "tokcc_a0.25", "dist_tokcc_0.05_0.95"]
BETAS = [0.01, 0.1, 1.0]


def arm_table(path, aggregation, scores, half_width, seeds=(1,)):
    """One row per cell (setting x seed): matched router score with its 95% interval over test
    inputs (half_width either side); `scores` [12, n_seeds]."""
    rows = []
    scores = np.asarray(scores).reshape(12, -1)
    for (fam, beta), per_seed in zip(itertools.product(FAMILIES, BETAS), scores):
        for seed, s in zip(seeds, per_seed):
            rows.append(
                {
                    "cell_id": f"{aggregation}-{fam}-{beta}-{seed}",
                    "reconstruction_family": fam,
                    "beta": beta,
                    "seed": seed,
                    "token_aggregation": aggregation,
                    "beta_schedule": "constant",
                    "matched_router_score": s,
                    "matched_router_score_ci_low": s - half_width,
                    "matched_router_score_ci_high": s + half_width,
                    "final_answer_accuracy": 0.95,
                }
            )
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def seed_noise(rng, noise, k):
    """[12, k] training noise of sd `noise` whose mean over the k seeds is exactly 0 (so the
    observed delta is the true one and only the interval's width is tested)."""
    e = rng.normal(0, 1, (12, k))
    e = e - e.mean(1, keepdims=True)
    return noise * e / (e.std(1, ddof=1, keepdims=True) if k > 1 else 1.0)


def run(tmp_path, delta, noise, half_width, seed=0, seeds=(1, 2)):
    """Two arms of 12 settings x `seeds`, the same setting means, `delta` apart; each cell varies
    around its setting by training `noise` (sd)."""
    rng = np.random.default_rng(seed)
    mean = 0.5 + rng.normal(0, 0.05, (12, 1))
    k = len(seeds)
    summary = arm_table(tmp_path / "sum.csv", "sum", mean + delta + seed_noise(rng, noise, k), half_width, seeds)
    comparison = arm_table(tmp_path / "mean.csv", "mean", mean + seed_noise(rng, noise, k), half_width, seeds)
    assert report_cli(["--summary", str(summary), "--comparison", str(comparison), "--out", str(tmp_path / "out")]) == 0
    contrasts = pd.read_parquet(tmp_path / "out" / "aggregate" / "arm_contrasts.parquet")
    analysis = (tmp_path / "out" / "analysis.md").read_text()
    return contrasts.set_index("metric").loc["matched_router_score"], analysis


def test_arms_within_their_noise_are_cannot_tell(tmp_path):
    # true delta 0; cells vary by training noise 0.02 while each cell's own interval is +-0.06
    row, analysis = run(tmp_path, delta=0.0, noise=0.02, half_width=0.06)
    # 12 replicated settings, each its own paired spread on 1 df: Welch-Satterthwaite df between 1 and 12
    assert row.training_noise_in_interval and row.training_noise_settings == 12 and 1 <= row.training_noise_df <= 12
    assert row.verdict == "cannot tell" and row.ci_low < 0 < row.ci_high and row.sign_flip_p > 0.05
    assert row.cells_negative == 0 and row.cells_positive == 0
    assert "**cannot tell**" in analysis and "**negative**" not in analysis and "**positive**" not in analysis


def test_clearly_different_arms_get_their_sign(tmp_path):
    row, analysis = run(tmp_path, delta=-0.2, noise=0.02, half_width=0.06)
    assert row.verdict == "negative" and row.ci_high < 0 and row.training_noise_in_interval
    assert row.sign_flip_p == pytest.approx(
        2 / 2**12
    )  # every setting's delta negative: only the all-minus flip reaches it
    assert "**negative**" in analysis and "training noise" in analysis
    (tmp_path / "up").mkdir()
    row, _ = run(tmp_path / "up", delta=0.2, noise=0.02, half_width=0.06)
    assert row.verdict == "positive"


def test_training_noise_widens_the_interval_past_a_test_only_sign(tmp_path):
    """Narrow test intervals (+-0.01) and a delta of -0.05, but seeds that vary by 0.2: the
    test-only interval would exclude 0; with training noise it does not."""
    row, _ = run(tmp_path, delta=-0.05, noise=0.2, half_width=0.01)
    assert row.test_ci_high < 0  # what the test inputs alone would say
    assert row.verdict == "cannot tell" and row.ci_low < 0 < row.ci_high
    # the paired delta of two cells that each vary by 0.2: about 0.2 * sqrt(2) per replicate
    assert 0.15 < row.training_noise_sd < 0.45 and row.mean_delta == pytest.approx(-0.05)
    assert row.detectable_delta > abs(row.mean_delta)


def test_one_seed_reads_cannot_tell_training_noise_unknown(tmp_path):
    """One seed per cell: however far apart the arms, the verdict is cannot tell, with the reason."""
    row, analysis = run(tmp_path, delta=-0.2, noise=0.0, half_width=0.01, seeds=(1,))
    assert row.test_ci_high < 0 and not row.training_noise_in_interval
    assert row.verdict == "cannot tell" and row.why.startswith("training noise unknown")
    assert row.cells_negative == 0 and row.cells_cannot_tell == 12
    assert "training noise unknown" in analysis and "test inputs only" in analysis


def _contrast_frame(**cols):
    from latentstrat.aggregate.columns import FAMILY_COL

    n = len(cols["delta_m"])
    base = {
        "primary_cell": [f"p{i}" for i in range(n)],
        "comparison_cell": [f"c{i}" for i in range(n)],
        FAMILY_COL: [f"fam{i}" for i in range(n)],
        "beta_label": ["beta=.01"] * n,
        "delta_m_ci_low": [np.nan] * n,
        "delta_m_ci_high": [np.nan] * n,
        "delta_m_noise_known": [True] * n,
    }
    return pd.DataFrame({**base, **cols})


def test_contrast_interval_by_hand():
    """Two settings: the first has two replicates per arm whose paired deltas are -0.05 and -0.15
    (seed variance 0.005, the mean delta's 0.0025 on 1 df); the second one replicate, delta -0.2, in
    the same stratum: it borrows the stratum's pooled seed variance 0.005 on 1 df. SE_test =
    sqrt(0.02^2 + 0.03^2) / 2; training terms 0.0025 / 4 and 0.005 / 4; a t interval with
    Welch-Satterthwaite df over the training terms, (sum term)^2 / sum(term^2 / df)."""
    from scipy import stats

    from latentstrat.aggregate.contrasts import contrast_row
    from latentstrat.aggregate.power import detect_factor

    c = _contrast_frame(
        delta_m=[-0.1, -0.2],
        delta_m_se_test=[0.02, 0.03],
        delta_m_train_var=[0.0025, np.nan],
        delta_m_train_df=[1.0, np.nan],
        delta_m_seed_var=[0.005, np.nan],
        stratum=["used", "used"],
        primary_n_seeds=[2, 1],
        comparison_n_seeds=[2, 1],
    )
    row = contrast_row("arm", c, "m", None)
    se_test = np.sqrt(0.02**2 + 0.03**2) / 2
    terms = [0.0025 / 4, 0.005 / 4]
    se = np.sqrt(se_test**2 + sum(terms))
    df = sum(terms) ** 2 / sum(t**2 / 1 for t in terms)  # the training terms' df: 1.8
    half = stats.t.ppf(0.975, df) * se
    assert row["mean_delta"] == pytest.approx(-0.15) and row["interval_df"] == pytest.approx(df)
    assert row["se_test"] == pytest.approx(se_test) and row["se_training"] == pytest.approx(np.sqrt(sum(terms)))
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(-0.15 - half), pytest.approx(-0.15 + half))
    # the true difference found with 80% power by the t test on those df (noncentral t), in SEs
    factor = detect_factor(df)
    assert stats.nct.sf(stats.t.ppf(0.975, df), df, factor) == pytest.approx(0.8, abs=1e-3)
    assert row["detectable_delta"] == pytest.approx(factor * se)
    assert row["verdict"] == ("negative" if -0.15 + half < 0 else "cannot tell")
    assert row["training_noise_settings"] == 1 and row["training_noise_sd"] == pytest.approx(np.sqrt(0.005))
    # the unreplicated setting in a stratum with no replicated setting: training noise unknown there
    unknown = contrast_row("arm", c.assign(stratum=["used", "empty"]), "m", None)
    assert unknown["verdict"] == "cannot tell" and not unknown["training_noise_in_interval"]
    assert "fam1 beta=.01" in unknown["why"] and unknown["why"].startswith("training noise unknown for 1 of 2")
    assert unknown["ci_high"] == pytest.approx(-0.15 + 1.959963984540054 * se_test)


def test_paired_training_noise_pools_and_sign_flip_by_hand():
    """A setting's paired deltas per replicate seed (the same seed pairs up; an arm with seeds of its
    own pairs by replicate order), their spread on k - 1 df, the stratum's pool weighted by df, and
    the sign-flip test's exact p-value."""
    from latentstrat.aggregate.contrasts import setting_training, sign_flip_p, stratum_pools

    cells = {
        "p1": {"seed": 1, "m": 0.5},
        "p2": {"seed": 2, "m": 0.7},
        "c1": {"seed": 1, "m": 0.4},
        "c2": {"seed": 2, "m": 0.4},
        "a7": {"seed": 7, "m": 0.1},
        "a8": {"seed": 8, "m": 0.6},
    }
    p, c = pd.Series({"cell_ids": "p1,p2", "n_seeds": 2}), pd.Series({"cell_ids": "c1,c2", "n_seeds": 2})
    tr = setting_training(p, c, "m", cells)  # deltas 0.1, 0.3: variance 0.02, the mean's 0.01, 1 df
    assert (tr["seed_var"], tr["var"], tr["df"]) == (pytest.approx(0.02), pytest.approx(0.01), 1.0)
    aa = setting_training(p, pd.Series({"cell_ids": "a8,a7", "n_seeds": 2}), "m", cells)  # 0.5-0.1, 0.7-0.6
    assert aa["seed_var"] == pytest.approx(np.var([0.4, 0.1], ddof=1))
    one = setting_training(p, pd.Series({"cell_ids": "c1", "n_seeds": 1}), "m", cells)
    assert np.isnan(one["var"])
    rows = pd.DataFrame(
        {
            "delta_m": [0.1, 0.2, 0.3, 0.0],
            "delta_m_seed_var": [0.02, 0.05, np.nan, 1e-6],
            "delta_m_train_df": [1.0, 2.0, np.nan, 1.0],
            "stratum": ["used", "used", "used", "empty"],
        }
    )
    pools = stratum_pools(rows, "m")
    assert pools["used"] == {"seed_var": pytest.approx((0.02 + 2 * 0.05) / 3), "df": 3.0, "settings": 2}
    assert pools["empty"]["seed_var"] == pytest.approx(1e-6)
    # deltas 1, 2, 3: of the 8 sign assignments only +++ and --- reach |mean| 2
    assert sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
    assert sign_flip_p([1.0, -1.0]) == 1.0 and np.isnan(sign_flip_p([]))
    # with the bootstrap's replicates of the mean delta: 12 settings all +0.1 (a shift every
    # setting shares, as a draw of test inputs that suits one arm gives), no spread about it. A
    # bootstrap whose replicates spread 0.1 (that shift is within the test inputs' noise) leaves
    # it unremarkable; one that spreads 0.01 makes it significant. The plain test cannot tell them
    # apart (2 / 4096 for both).
    same = [0.1] * 12
    wide = np.random.default_rng(1).normal(0.1, 0.1, 1000)
    tight = np.random.default_rng(1).normal(0.1, 0.01, 1000)
    assert sign_flip_p(same, wide) > 0.2 and sign_flip_p(same, tight) < 0.001
    assert sign_flip_p(same) == pytest.approx(2 / 4096)


def test_an_unreplicated_setting_borrows_only_at_its_own_kl_weight():
    """A setting with one seed borrows the pooled spread of replicated settings of its stratum:
    the same state at the same KL weight. Replicated settings at beta 0.01 say nothing about a
    beta 1 setting's training noise (unknown: cannot tell, the setting named); a replicated beta 1
    setting in the same state lends it."""
    from latentstrat.aggregate.columns import FAMILY_COL
    from latentstrat.aggregate.contrasts import arm_contrasts, stratum_pools

    m = "delta_router_information"
    c = pd.DataFrame(
        {
            "primary_cell": ["p1", "p2", "p3"],
            "comparison_cell": ["r1", "r2", "r3"],
            FAMILY_COL: ["a", "b", "c"],
            "beta_label": ["beta=.01", "beta=.01", "beta=1"],
            "primary_state": ["strategy"] * 3,
            "comparison_state": ["strategy"] * 3,
            "stratum": ["used"] * 3,
            "primary_n_seeds": [2, 2, 1],
            "comparison_n_seeds": [2, 2, 1],
            m: [0.10, 0.12, 0.11],
            f"{m}_se_test": [0.005] * 3,
            f"{m}_ci_low": [0.09, 0.11, 0.10],
            f"{m}_ci_high": [0.11, 0.13, 0.12],
            f"{m}_noise_known": [True, True, False],
            f"{m}_train_var": [1e-4, 1e-4, np.nan],
            f"{m}_train_df": [1.0, 1.0, np.nan],
            f"{m}_seed_var": [2e-4, 2e-4, np.nan],
        }
    )
    assert set(stratum_pools(c, "router_information")) == {"used at beta=.01"}
    alone = arm_contrasts({"mean": c}, None, metrics=["router_information"]).iloc[0]
    assert alone.verdict == "cannot tell" and not alone.training_noise_in_interval
    assert "c beta=1" in alone.why and "same KL weight" in alone.why
    lent = c.assign(beta_label=["beta=.01", "beta=1", "beta=1"])
    row = arm_contrasts({"mean": lent}, None, metrics=["router_information"]).iloc[0]
    assert row.training_noise_in_interval and "used at beta=1: 1 settings" in row.training_noise_strata


def test_no_interval_means_cannot_tell(tmp_path):
    """A table without intervals or seeds carries no evidence of its noise: never a sign."""
    rows = []
    for agg, s in (("sum", 0.3), ("mean", 0.6)):
        for fam, beta in itertools.product(FAMILIES, BETAS):
            rows.append(
                {
                    "reconstruction_family": fam,
                    "beta": beta,
                    "token_aggregation": agg,
                    "beta_schedule": "constant",
                    "matched_router_score": s,
                }
            )
    df = pd.DataFrame(rows)
    df[df.token_aggregation == "sum"].to_csv(tmp_path / "sum.csv", index=False)
    df[df.token_aggregation == "mean"].to_csv(tmp_path / "mean.csv", index=False)
    assert (
        report_cli(
            [
                "--summary",
                str(tmp_path / "sum.csv"),
                "--comparison",
                str(tmp_path / "mean.csv"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    c = pd.read_parquet(tmp_path / "out" / "aggregate" / "arm_contrasts.parquet").set_index("metric")
    assert c.loc["matched_router_score", "verdict"] == "cannot tell"


def test_paired_bootstrap_of_identical_cells_is_exactly_zero_and_has_binomial_width():
    C = resample_counts({"a": 200, "b": 100})
    C2 = resample_counts({"a": 200, "b": 100})
    assert all(np.array_equal(C[t], C2[t]) for t in C)  # the same draws for every cell
    assert C["a"].sum(1).tolist() == [200] * C["a"].shape[0]  # within-task: n_t draws per task
    correct = np.r_[np.ones(100), np.zeros(100)]
    reps = C["a"] @ correct / 200
    lo, hi = interval(reps)
    half = 1.96 * np.sqrt(0.25 / 200)  # binomial 95% half-width at p = 0.5, n = 200
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.15)
    assert interval(reps - reps) == (0.0, 0.0)


def _history(values_by_cell):
    rows = [
        {"cell_id": c, "step": 25 * k, "task": "all", "metric": "scored_matched_router_score", "value": v}
        for c, vals in values_by_cell.items()
        for k, v in enumerate(vals)
    ]
    return pd.DataFrame(rows)


def test_learn_then_collapse_false_positive_rate_under_no_change():
    """200 simulated cells whose 7 validation checkpoints are pure noise around one value: the
    per-cell rise-then-fall call fires at most 5% of the time (the permutation test's
    guarantee), and 100 simulated 12-cell collections never read "learn then collapse"."""
    rng = np.random.default_rng(0)
    calls = [rise_fall_pvalues(0.5 + rng.normal(0, 0.03, 7))[1] <= ALPHA for _ in range(200)]
    assert np.mean(calls) <= 0.05 + 0.03  # 5% plus binomial slack for 200 draws
    empty = pd.DataFrame(columns=["cell_id", "role"])
    fired = 0
    for _ in range(100):
        h = _history({f"c{i}": 0.5 + rng.normal(0, 0.03, 7) for i in range(12)})
        t = {"history_long": h, "collection_state": empty, "dynamics_summary": pd.DataFrame()}
        fired += q_early_or_late(t, 0.01)["evidence"].startswith("learn then collapse")
    assert fired == 0


def test_learn_then_collapse_is_found_when_it_happens():
    rng = np.random.default_rng(1)
    shape = np.array([0.3, 0.5, 0.7, 0.8, 0.6, 0.4, 0.3])
    h = _history({f"c{i}": shape + rng.normal(0, 0.01, 7) for i in range(12)})
    t = {
        "history_long": h,
        "collection_state": pd.DataFrame(columns=["cell_id", "role"]),
        "dynamics_summary": pd.DataFrame(),
    }
    f = q_early_or_late(t, 0.01)
    assert f["status"] == "supported" and f["evidence"].startswith("learn then collapse")
    # learning that is kept is not a collapse
    h = _history({f"c{i}": np.linspace(0.3, 0.8, 7) + rng.normal(0, 0.01, 7) for i in range(12)})
    t["history_long"] = h
    assert q_early_or_late(t, 0.01)["status"] == "not supported"


def test_router_scores_without_a_strategy_cell_are_cannot_tell():
    """Two arms none of whose cells is in state `strategy` (z carries no strategy information in
    either) differ by noise, whatever their interval says: never a sign."""
    from latentstrat.aggregate.columns import FAMILY_COL
    from latentstrat.aggregate.contrasts import arm_contrasts

    m = "delta_matched_router_score"
    c = pd.DataFrame(
        {
            "primary_cell": ["p1", "p2"],
            "comparison_cell": ["r1", "r2"],
            FAMILY_COL: ["a", "b"],
            "beta_label": ["beta=.01", "beta=.01"],
            "primary_state": ["empty", "other"],
            "comparison_state": ["empty", "empty"],
            "stratum": ["empty", "used"],
            "primary_n_seeds": [2, 2],
            "comparison_n_seeds": [2, 2],
            m: [-0.08, -0.09],
            f"{m}_se_test": [0.005, 0.005],
            f"{m}_ci_low": [-0.10, -0.11],
            f"{m}_ci_high": [-0.05, -0.06],
            f"{m}_noise_known": [True, True],
            f"{m}_train_var": [1e-5, 1e-5],
            f"{m}_train_df": [1.0, 1.0],
            f"{m}_seed_var": [2e-5, 2e-5],
        }
    )
    noise = arm_contrasts({"mean": c}, None, metrics=["matched_router_score"]).iloc[0]
    assert noise.verdict == "cannot tell" and "strategy" in noise.why and noise.strategy_cells == 0
    assert noise.both_empty_cells == 1
    signal = arm_contrasts(
        {"mean": c.assign(primary_state=["strategy", "other"])}, None, metrics=["matched_router_score"]
    ).iloc[0]
    assert signal.verdict == "negative" and signal.cells_negative == 2 and signal.why == ""


def write_config(path, seeds=None):
    """A collection config whose grid is the tables' (4 families x 3 betas, sum vs matched mean)."""
    import yaml

    cfg = {
        "collection": "toy-power",
        "base": "toy-base",
        "data": {"tasks": ["sorting_algorithms"]},
        "cell": {"token_aggregation": "sum"},
        "grid": {"reconstruction_family": FAMILIES, "beta": BETAS},
        "primary_arm": "sum",
        "comparison_arms": [{"name": "mean", "settings": {"token_aggregation": "mean"}}],
    }
    if seeds:
        cfg["seeds"] = seeds
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_with_config(tmp_path, delta, noise, half_width, seeds=(314159, 314160)):
    rng = np.random.default_rng(0)
    mean = 0.5 + rng.normal(0, 0.05, (12, 1))
    k = len(seeds)
    summary = arm_table(tmp_path / "sum.csv", "sum", mean + delta + seed_noise(rng, noise, k), half_width, seeds)
    comparison = arm_table(tmp_path / "mean.csv", "mean", mean + seed_noise(rng, noise, k), half_width, seeds)
    cfg = write_config(tmp_path / "collection.yaml", list(seeds))
    out = tmp_path / "out"
    assert (
        report_cli(
            ["--summary", str(summary), "--comparison", str(comparison), "--configfile", str(cfg), "--out", str(out)]
        )
        == 0
    )
    row = pd.read_parquet(out / "aggregate" / "arm_contrasts.parquet").set_index("metric").loc["matched_router_score"]
    return row, out


def test_noisy_arms_get_a_followup_with_more_seeds_sized_from_their_variance(tmp_path):
    from latentstrat.aggregate.power import detect_factor, look_with_seeds
    from latentstrat.cells import expand_cells
    from latentstrat.config import load_config

    row, out = run_with_config(tmp_path, delta=-0.03, noise=0.1, half_width=0.02)
    assert row.verdict == "cannot tell" and row.training_noise_in_interval
    analysis = (out / "analysis.md").read_text()
    assert f"Detectable (80% power, 5% two-sided): {round(row.detectable_delta, 4):g}" in analysis
    followup = out / "followup.yaml"
    assert followup.exists() and "followup.yaml" in analysis
    cfg = load_config(followup)  # runnable: extends the collection's config by a relative path
    # seeds sized so that the detectable difference reaches the observed |delta|: only the
    # training part shrinks with seeds
    common = pd.read_parquet(out / "aggregate" / "common_cells.parquet")
    seed_vars = list(common.loc[common.comparison_arm == row.comparison_arm, "delta_matched_router_score_seed_var"])
    # at the second look's level (report.alpha_by_look: 0.04 then 0.01)
    assert row.alpha == 0.04
    n = next(
        n
        for n in range(2, 1000)
        if detect_factor(look_with_seeds(row.se_test, seed_vars, n)[1], alpha=0.01)
        * look_with_seeds(row.se_test, seed_vars, n)[0]
        <= 0.03
    )
    n = min(max(n, 3), 10)
    # n fresh seeds after every seed in use, tested on their own by the follow-up's headline
    fresh = [314161 + k for k in range(n)]
    assert cfg["seeds"] == [314159, 314160, *fresh] and cfg["report"]["headline_seeds"] == fresh
    assert cfg["collection"] == "toy-power-followup"
    assert len(expand_cells(cfg)) == 24 * (n + 2)
    assert f"Adds {24 * n} cells" in followup.read_text() and "--cores 2" in followup.read_text()


def test_one_seed_gets_a_followup_that_measures_the_training_noise(tmp_path):
    from latentstrat.config import load_config

    row, out = run_with_config(tmp_path, delta=-0.2, noise=0.0, half_width=0.01, seeds=(314159,))
    assert row.verdict == "cannot tell" and row.why.startswith("training noise unknown")
    cfg = load_config(out / "followup.yaml")
    assert cfg["seeds"] == [314159, 314160] and cfg["report"].get("headline_seeds") is None
    assert "2 seeds per setting measure it" in (out / "followup.yaml").read_text()


def test_clearly_separated_arms_get_no_followup(tmp_path):
    row, out = run_with_config(tmp_path, delta=-0.2, noise=0.02, half_width=0.06)
    assert row.verdict == "negative"
    assert not (out / "followup.yaml").exists()
    assert "Follow-Up" not in (out / "analysis.md").read_text()


def test_no_followup_when_the_test_inputs_alone_cannot_settle_it(tmp_path):
    """Seeds shrink the training part only: a delta below what the test inputs allow gets none."""
    row, out = run_with_config(tmp_path, delta=-0.01, noise=0.001, half_width=0.3)
    assert row.verdict == "cannot tell" and 2.8 * row.se_test > 0.01
    assert not (out / "followup.yaml").exists()


def test_a_noisy_collection_already_at_its_seed_cap_gets_no_followup(tmp_path):
    # 10 seeds is the default cap (report.followup_max_seeds): nothing more to ask for
    row, out = run_with_config(tmp_path, delta=-0.01, noise=0.05, half_width=0.02, seeds=list(range(1, 11)))
    assert row.verdict == "cannot tell"
    assert not (out / "followup.yaml").exists()


def test_power_arithmetic_by_hand():
    from latentstrat.aggregate.power import detectable_difference, look_with_seeds, seeds_to_detect
    from latentstrat.cells import next_seeds

    # interval +-0.1 -> SE 0.1 / 1.96; 80% power at 5% two-sided: (1.96 + 0.8416) SE
    assert detectable_difference(-0.1, 0.1) == pytest.approx(0.142941, abs=1e-6)
    assert np.isnan(detectable_difference(float("nan"), 0.1))
    # 12 settings, SE_test 0.01, a replicate's paired delta variance 0.04 each: with n fresh seeds
    # a term t = 0.04 / n / 144 per setting, SE(n)^2 = 1e-4 + 12 t, Welch-Satterthwaite df over
    # the training terms (12 t)^2 / (12 t^2 / (n - 1)) = 12 (n - 1): 72 at n = 7
    se, df = look_with_seeds(0.01, [0.04] * 12, 7)
    assert se == pytest.approx(np.sqrt(1e-4 + 0.04 / 84)) and df == pytest.approx(72.0)
    # to detect 0.07: k(df) x SE(n) <= 0.07 first at n = 7
    assert seeds_to_detect(0.01, [0.04] * 12, 0.07) == 7
    # the same mean spread carried by 2 of the 12 settings: (2 t)^2 / (2 t^2 / 6) = 12 df at n = 7
    # instead of 72, so one more seed; sizing on cells x (n - 1) df would have said 7 (undersized)
    assert look_with_seeds(0.01, [0.24] * 2 + [1e-6] * 10, 7)[1] == pytest.approx(12.0, abs=0.01)
    assert seeds_to_detect(0.01, [0.24] * 2 + [1e-6] * 10, 0.07) == 8
    assert seeds_to_detect(0.03, [0.01] * 12, 0.07) is None  # 2.8 x 0.03 > 0.07: no number of seeds
    assert next_seeds([314159], 3) == [314159, 314160, 314161]
    # the detectable difference in SEs: 2.80 with a known variance; the noncentral t's with few df
    from latentstrat.aggregate.power import DETECT, detect_factor, t_power

    assert detect_factor(float("inf")) == DETECT and t_power(DETECT, float("inf")) == pytest.approx(0.8, abs=1e-6)
    assert detect_factor(2) == pytest.approx(5.65, abs=0.01) and detect_factor(8) == pytest.approx(3.20, abs=0.01)
    assert t_power(detect_factor(4), 4) == pytest.approx(0.8, abs=1e-6)


def test_a_followup_headline_tests_its_fresh_seeds_on_their_own(tmp_path):
    """report.headline_seeds: the headline's contrast is over the cells of those seeds alone (here
    seeds 3 and 4, whose arms differ clearly) while the contrast over every seed (seeds 1 and 2 too,
    whose arms do not differ) stands beside it."""
    import yaml

    rng = np.random.default_rng(3)
    mean = 0.5 + rng.normal(0, 0.05, (12, 1))
    seeds = (1, 2, 3, 4)
    shift = np.array([0.0, 0.0, -0.2, -0.2])
    summary = arm_table(tmp_path / "sum.csv", "sum", mean + shift + seed_noise(rng, 0.02, 4), 0.02, seeds)
    comparison = arm_table(tmp_path / "mean.csv", "mean", mean + seed_noise(rng, 0.02, 4), 0.02, seeds)
    cfg = write_config(tmp_path / "collection.yaml", list(seeds))
    raw = yaml.safe_load(cfg.read_text())
    cfg.write_text(yaml.safe_dump({**raw, "report": {"headline_seeds": [3, 4]}}))
    out = tmp_path / "out"
    args = ["--summary", str(summary), "--comparison", str(comparison), "--configfile", str(cfg), "--out", str(out)]
    assert report_cli(args) == 0
    brief = yaml.safe_load((out / "brief.yaml").read_text())
    assert brief["verdict"] == "negative" and brief["delta"] == pytest.approx(-0.2, abs=0.03)
    # tables from outside the pipeline carry no step-0 history and no machine: the verdict stands
    # and its line says what it did not check
    assert brief["unchecked"] == [
        "no cell has a step-0 history, so no cell sanity check ran",
        "no cell records its machine, so the pairs' hosts were not compared",
    ]
    assert "(unchecked: no cell has a step-0 history" in (out / "analysis.md").read_text()
    assert brief["pooled"]["delta"] == pytest.approx(-0.1, abs=0.03) and brief["headline_seeds"] == "3,4"
    assert "fresh seeds (3,4) on their own" in (out / "analysis.md").read_text()


def test_a_followup_trains_exactly_the_cells_it_plans_and_its_headline_reads_all_fresh_ones(tmp_path):
    """The default collection's follow-up (replicate groups, 58 cells): its config trains the 58
    cells again (reused) and the fresh seeds in every setting of both arms, no more (its replicate
    seeds stay the first look's, not the next integers after the fresh ones); the plan counts
    exactly those, and the fresh-seed headline's cells are all of them."""
    import os

    from latentstrat.aggregate.followup import followup_plan
    from latentstrat.aggregate.power import followup_text
    from latentstrat.cells import Collection, expand_cells
    from latentstrat.config import config_for_command, load_config

    root = Path(__file__).resolve().parents[1]
    cfg = config_for_command(root / "config" / "config.yaml")
    contrast = {
        "comparison_arm": "matched_mean",
        "metric": "router_information",
        "verdict": "cannot tell",
        "why": "",
        "training_noise_in_interval": True,
        "se_test": 0.01,
        "mean_delta": 0.05,
        "ci_low": -0.01,
        "ci_high": 0.11,
        "detectable_delta": 0.09,
        "training_noise_sd": 0.1,
        "n_cells": 12,
    }
    plan = followup_plan(
        Collection.of(cfg), pd.DataFrame([contrast]), pd.DataFrame(columns=["total_s"]), cfg["resources"]["threads"]
    )
    assert plan["needed"] and len(plan["fresh_seeds"]) >= 4  # report.followup_min_fresh_seeds
    # the floor holds where power alone would ask for fewer (a large effect to detect)
    big = followup_plan(
        Collection.of(cfg),
        pd.DataFrame([{**contrast, "mean_delta": 0.4, "ci_low": -0.05, "ci_high": 0.85, "detectable_delta": 0.5}]),
        pd.DataFrame(columns=["total_s"]),
    )
    floor = followup_plan(
        Collection.of({**cfg, "report": {**cfg["report"], "followup_min_fresh_seeds": 2}}),
        pd.DataFrame([{**contrast, "mean_delta": 0.4, "ci_low": -0.05, "ci_high": 0.85, "detectable_delta": 0.5}]),
        pd.DataFrame(columns=["total_s"]),
    )
    assert len(floor["fresh_seeds"]) < 4 == len(big["fresh_seeds"])
    path = tmp_path / "followup.yaml"
    path.write_text(
        followup_text(
            {**plan, "path": str(path), "extends": os.path.relpath(root / "config" / "config.yaml", tmp_path)}
        )
    )
    first = {c.cell_id for c in expand_cells(cfg)}
    follow = load_config(path)
    cells = expand_cells(follow)
    added = {c.cell_id for c in cells} - first
    assert first <= {c.cell_id for c in cells} and len(added) == plan["cells_added"]
    fresh = set(plan["fresh_seeds"])
    assert len(added) == len(fresh) * (12 * 2 + 3)  # every setting, both arms, raw's sum_scaled, each fresh seed
    assert added == {c.cell_id for c in cells if c.settings["seed"] in fresh}  # the headline's cells
    assert set(follow["report"]["headline_seeds"]) == fresh
