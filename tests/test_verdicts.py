"""Verdicts from evidence: the report calls a delta negative or positive only when its 95%
interval excludes 0 (a collection whose arms differ by less than their noise gets "cannot
tell"; one where they differ clearly gets the sign), and the learn-then-collapse test keeps
its false-positive rate at or below 5% under no change."""

import itertools

import numpy as np
import pandas as pd
import pytest

from latentstrat.metrics import interval, resample_counts
from latentstrat.report.__main__ import main as report_cli
from latentstrat.report.findings import ALPHA, q_early_or_late, rise_fall_pvalues

FAMILIES = ["raw", "dist_norm", "tokcc_a0.25", "dist_tokcc_0.05_0.95"]
BETAS = [0.01, 0.1, 1.0]


def arm_table(path, aggregation, scores, half_width):
    """One row per cell: matched router score with its 95% interval (half_width either side)."""
    rows = []
    for (fam, beta), s in zip(itertools.product(FAMILIES, BETAS), scores):
        rows.append(
            {
                "cell_id": f"{aggregation}-{fam}-{beta}",
                "reconstruction_family": fam,
                "beta": beta,
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


def run(tmp_path, delta, noise, half_width, seed=0):
    rng = np.random.default_rng(seed)
    mean = 0.5 + rng.normal(0, 0.05, 12)
    summary = arm_table(tmp_path / "sum.csv", "sum", mean + delta + rng.normal(0, noise, 12), half_width)
    comparison = arm_table(tmp_path / "mean.csv", "mean", mean + rng.normal(0, noise, 12), half_width)
    assert report_cli(["--summary", str(summary), "--comparison", str(comparison), "--out", str(tmp_path / "out")]) == 0
    contrasts = pd.read_parquet(tmp_path / "out" / "aggregate" / "arm_contrasts.parquet")
    analysis = (tmp_path / "out" / "analysis.md").read_text()
    return contrasts.set_index("metric").loc["matched_router_score"], analysis


def test_arms_within_their_noise_are_cannot_tell(tmp_path):
    # true delta 0; the cells differ by noise 0.02 while each cell's own interval is +-0.06
    row, analysis = run(tmp_path, delta=0.0, noise=0.02, half_width=0.06)
    assert row.verdict == "cannot tell" and row.ci_low < 0 < row.ci_high
    assert row.cells_negative == 0 and row.cells_positive == 0
    assert "**cannot tell**" in analysis and "**negative**" not in analysis and "**positive**" not in analysis


def test_clearly_different_arms_get_their_sign(tmp_path):
    row, analysis = run(tmp_path, delta=-0.2, noise=0.02, half_width=0.06)
    assert row.verdict == "negative" and row.ci_high < 0
    assert row.cells_negative == 12
    assert "**negative**" in analysis
    (tmp_path / "up").mkdir()
    row, _ = run(tmp_path / "up", delta=0.2, noise=0.02, half_width=0.06)
    assert row.verdict == "positive"


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
        {"cell_id": c, "step": 25 * k, "task": "all", "metric": "matched_router_score", "value": v}
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


def test_router_scores_without_signal_above_chance_are_cannot_tell():
    """Two arms whose router probes are both at or below chance differ in raw accuracy because
    their class balance differs, not because z carries strategy: never a sign."""
    from latentstrat.aggregate.contrasts import arm_contrasts

    c = pd.DataFrame(
        {
            "primary_cell": ["p1", "p2"],
            "comparison_cell": ["r1", "r2"],
            "delta_matched_router_score": [-0.08, -0.09],
            "delta_matched_router_score_ci_low": [-0.10, -0.11],
            "delta_matched_router_score_ci_high": [-0.05, -0.06],
        }
    )
    noise = arm_contrasts(
        {"mean": c}, None, metrics=["matched_router_score"], above={"p1": False, "p2": False, "r1": False, "r2": False}
    ).iloc[0]
    assert noise.verdict == "cannot tell" and "above chance" in noise.why and noise.cells_cannot_tell == 2
    signal = arm_contrasts(
        {"mean": c}, None, metrics=["matched_router_score"], above={"p1": True, "p2": False, "r1": True, "r2": True}
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


def run_with_config(tmp_path, delta, noise, half_width, seeds=None):
    rng = np.random.default_rng(0)
    mean = 0.5 + rng.normal(0, 0.05, 12)
    summary = arm_table(tmp_path / "sum.csv", "sum", mean + delta + rng.normal(0, noise, 12), half_width)
    comparison = arm_table(tmp_path / "mean.csv", "mean", mean + rng.normal(0, noise, 12), half_width)
    cfg = write_config(tmp_path / "collection.yaml", seeds)
    out = tmp_path / "out"
    assert (
        report_cli(
            ["--summary", str(summary), "--comparison", str(comparison), "--config", str(cfg), "--out", str(out)]
        )
        == 0
    )
    row = pd.read_parquet(out / "aggregate" / "arm_contrasts.parquet").set_index("metric").loc["matched_router_score"]
    return row, out


def test_noisy_arms_get_a_followup_with_more_seeds_sized_from_their_variance(tmp_path):
    from latentstrat.cells import expand_cells
    from latentstrat.config import load_config
    from latentstrat.power import DETECT

    row, out = run_with_config(tmp_path, delta=-0.03, noise=0.02, half_width=0.12)
    assert row.verdict == "cannot tell"
    se = (row.ci_high - row.ci_low) / (2 * 1.959963984540054)
    assert row.detectable_delta == pytest.approx(DETECT * se)
    analysis = (out / "analysis.md").read_text()
    assert f"could detect (80% power, 5% two-sided): {round(row.detectable_delta, 4):g}" in analysis
    followup = out / "followup.yaml"
    assert followup.exists() and "followup.yaml" in analysis
    cfg = load_config(followup)  # runnable: extends the collection's config by a relative path
    # seeds sized so that the detectable difference reaches the observed |delta|: SE ~ 1/sqrt(n)
    n = int(np.ceil((DETECT * se / abs(row.mean_delta)) ** 2))
    assert cfg["seeds"] == [314159 + k for k in range(min(n, 10))]
    assert cfg["collection"] == "toy-power-followup"
    assert len(expand_cells(cfg)) == 24 * min(n, 10)
    assert f"Adds {24 * (min(n, 10) - 1)} cells" in followup.read_text()


def test_clearly_separated_arms_get_no_followup(tmp_path):
    row, out = run_with_config(tmp_path, delta=-0.2, noise=0.02, half_width=0.06)
    assert row.verdict == "negative"
    assert not (out / "followup.yaml").exists()
    assert "Follow-Up" not in (out / "analysis.md").read_text()


def test_a_noisy_collection_already_at_its_seed_cap_gets_no_followup(tmp_path):
    # 10 seeds is the default cap (report.followup_max_seeds): nothing more to ask for
    row, out = run_with_config(tmp_path, delta=-0.01, noise=0.02, half_width=0.12, seeds=list(range(1, 11)))
    assert row.verdict == "cannot tell"
    assert not (out / "followup.yaml").exists()


def test_power_arithmetic_by_hand():
    from latentstrat.power import detectable_difference, next_seeds, seeds_to_detect

    # interval +-0.1 -> SE 0.1 / 1.96; 80% power at 5% two-sided: (1.96 + 0.8416) SE
    assert detectable_difference(-0.1, 0.1) == pytest.approx(0.142941, abs=1e-6)
    assert np.isnan(detectable_difference(float("nan"), 0.1))
    # SE 0.05 with one seed; to detect 0.07: n = (2.8016 * 0.05 / 0.07)^2 = 4.0046 -> 5 seeds
    assert seeds_to_detect(0.05, 1, 0.07) == 5
    assert seeds_to_detect(0.01, 3, 0.07) == 3  # already precise enough: no fewer than now
    assert next_seeds([314159], 3) == [314159, 314160, 314161]
