"""Power: the smallest difference a collection could detect, and the follow-up that would settle
a `cannot tell` (design section 6, docs/design.md).

A verdict comes from a 95% interval of a delta (`aggregate.contrasts.arm_contrasts`) whose
variance has two parts: the test inputs' (the paired bootstrap, SE_test) and training noise (the
spread of each setting's paired delta across its replicate seeds, sigma_d^2 per replicate,
divided by its seeds: SE_training). A true difference d is found (the interval excludes 0) with
80% power when |d| >= k(df) * SE: k = 2.80 with a known variance, more with few degrees of freedom
(the noncentral t: `detect_factor`), the *detectable difference* printed next to every verdict,
from the same variance as the interval (its agreement with the power measured by simulation:
`python -m latentstrat.bench calibrate`).

A `cannot tell` whose arms do carry strategy information is a matter of power. More seeds shrink
the training part only: with n fresh seeds per setting, SE(n)^2 = SE_test^2 + sum_i sigma_i^2 /
n / cells^2 over the settings' per-replicate spreads sigma_i^2 (the test split is already used as
configured), on the Welch-Satterthwaite df the follow-up's own interval will have (few when a few
settings carry the spread). The follow-up adds seeds until the detectable difference reaches the
effect to settle: the observed mean delta, or `report.near_zero_delta`
when the observed delta is smaller than that (then the follow-up tells "no difference larger than
near_zero_delta" from "a small one"). When SE_test alone keeps the detectable difference above
the effect, no number of seeds settles it (more test inputs would): no follow-up is written.
Without any estimate of training noise, the follow-up asks for two seeds per setting: the fewest
that measure it.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # two-sided 95%
Z80 = 0.8416212335729143  # one-sided 80% power
DETECT = Z95 + Z80


def z_two_sided(alpha: float) -> float:
    """The normal quantile of a two-sided test at level alpha (1.96 at 5%)."""
    from scipy import stats

    return Z95 if alpha == 0.05 else float(stats.norm.ppf(1 - alpha / 2))


def t_power(ncp: float, df: float, alpha: float = 0.05) -> float:
    """Power of the two-sided t test at level alpha on df degrees of freedom when the true
    difference is ncp standard errors (the noncentral t; the normal one for infinite df)."""
    from scipy import stats

    if not math.isfinite(df):
        z = z_two_sided(alpha)
        return float(stats.norm.sf(z - ncp) + stats.norm.cdf(-z - ncp))
    tc = float(stats.t.ppf(1 - alpha / 2, df))
    lower = float(stats.nct.cdf(-tc, df, ncp))
    return float(stats.nct.sf(tc, df, ncp)) + (lower if math.isfinite(lower) else 0.0)


def detect_factor(df: float, target: float = 0.8, alpha: float = 0.05) -> float:
    """The true difference, in standard errors, that the two-sided t test at level alpha on df
    degrees of freedom finds with 80% power: (z_0.975 + z_0.8) = 2.80 at 5% for infinite df, more
    for few df, where the estimated SE itself varies (5.7 at 2 df, 3.8 at 4, 3.2 at 8), and more
    at a smaller alpha (3.09 at 4%). The detectable difference printed next to a verdict is this
    times its SE (bisection on t_power)."""
    if not math.isfinite(df) or df > 1e4:
        return z_two_sided(alpha) + Z80
    lo, hi = 0.0, 200.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_power(mid, df, alpha) < target else (lo, mid)
    return (lo + hi) / 2


def look_alpha(report: dict, followup: bool) -> float:
    """The level of a look: `report.alpha_by_look` spends one error budget over at most two looks,
    the collection's own (first) and its follow-up's fresh-seed headline (second)."""
    levels = list(report.get("alpha_by_look") or [0.05])
    return float(levels[min(int(followup), len(levels) - 1)])


def standard_error(ci_low: float, ci_high: float) -> float:
    """SE of an estimate from its 95% interval (normal approximation); NaN without one."""
    if ci_low is None or ci_high is None or not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return math.nan
    return (ci_high - ci_low) / (2 * Z95)


def detectable_difference(ci_low: float, ci_high: float) -> float:
    """The smallest true difference a normal 95% interval's precision finds with 80% power at 5% (two-sided)."""
    return DETECT * standard_error(ci_low, ci_high)


def combine_terms(se_test: float, terms: list[tuple[float, float]]) -> tuple[float, float]:
    """(SE, df) of an estimate whose variance is se_test^2 (the test inputs', from the paired
    bootstrap) plus independent training terms (variance, df). The degrees of freedom are the
    training terms' own (Welch-Satterthwaite over them alone): the replicates' spread already
    carries part of the test-input noise, so letting the bootstrap's term add degrees of freedom
    as a known variance would narrow the t quantile where few seeds measure the spread (measured:
    a one-setting, two-seed A/A design read 12% false signs that way; bench calibrate)."""
    train = sum(t for t, _ in terms)
    den = sum(t**2 / d for t, d in terms if t > 0)
    return math.sqrt(se_test**2 + train), (train**2 / den if den > 0 else math.inf)


def look_with_seeds(se_test: float, seed_vars: list[float], seeds: int) -> tuple[float, float]:
    """(SE, Welch-Satterthwaite df) of the mean delta over len(seed_vars) settings, each measured
    on `seeds` fresh seeds in both arms (one replicate's paired delta varying by seed_vars[i]):
    the interval a follow-up's fresh-seed headline computes (contrasts.contrast_row). A setting
    whose delta hardly varies (empty in both arms) adds little variance and few effective df."""
    k = len(seed_vars)
    return combine_terms(se_test, [(v / seeds / k**2, seeds - 1) for v in seed_vars])


def seeds_to_detect(
    se_test: float, seed_vars: list[float], effect: float, max_n: int = 10_000, alpha: float = 0.05
) -> int | None:
    """The fewest seeds per setting (2 or more: a fresh look measures its own training noise) at
    which the detectable difference of that look at level alpha (detect_factor on its
    Welch-Satterthwaite df, times its SE: look_with_seeds) reaches `effect`; None when the test
    inputs' SE alone keeps it above (no number of seeds settles it)."""
    if not (effect > 0) or (z_two_sided(alpha) + Z80) * se_test >= effect:
        return None
    for n in range(2, max_n + 1):
        se, df = look_with_seeds(se_test, seed_vars, n)
        if detect_factor(df, alpha=alpha) * se <= effect:
            return n
    return None


def followup_need(
    contrast: dict,
    n_seeds: int,
    near_zero: float,
    max_seeds: int,
    seed_vars: list[float] | None = None,
    alpha: float = 0.05,
) -> dict | None:
    """For one arm contrast (an `arm_contrasts` row): None when its verdict decides, when it has
    no interval, or when its `cannot tell` is not about power (no cell of either arm carries
    strategy information: more replicates of noise settle nothing). Else the seeds per setting
    that would settle it (capped at `max_seeds`) and what they would reach. `seed_vars`: each
    common setting's per-replicate delta variance (default: the contrast's mean spread for all)."""
    if contrast["verdict"] != "cannot tell":
        return None
    why = str(contrast.get("why") or "")
    known = bool(contrast.get("training_noise_in_interval"))
    if why and not why.startswith("training noise unknown"):
        return None
    se_test = float(contrast.get("se_test", math.nan))
    if not math.isfinite(se_test):
        return None
    effect = max(abs(float(contrast["mean_delta"])), float(near_zero))
    base = {
        "comparison_arm": contrast["comparison_arm"],
        "metric": contrast["metric"],
        "mean_delta": float(contrast["mean_delta"]),
        "ci_low": float(contrast["ci_low"]),
        "ci_high": float(contrast["ci_high"]),
        "detectable_now": float(contrast["detectable_delta"]),
        "first_alpha": float(contrast.get("alpha", 0.05)),
        "effect": effect,
        "training_noise_known": known,
    }
    if not known:  # measure the training noise first: two seeds per setting
        if n_seeds >= 2:
            return None
        return {**base, "seeds_needed": 2, "seeds": 2, "capped": False, "detectable_then": math.nan}
    if not seed_vars:
        seed_vars = [float(contrast["training_noise_sd"]) ** 2] * int(contrast["n_cells"])
    need = seeds_to_detect(se_test, seed_vars, effect, alpha=alpha)
    if need is None:  # the test inputs' noise alone: more seeds cannot settle it (analysis.md says so)
        return None
    seeds = min(need, max_seeds)
    if seeds <= n_seeds:
        return None
    then = look_with_seeds(se_test, seed_vars, seeds)
    return {
        **base,
        "seeds_needed": need,
        "seeds": seeds,
        "capped": need > max_seeds,
        "detectable_then": detect_factor(then[1], alpha=alpha) * then[0],
        "alpha": alpha,
    }


def followup_text(plan: dict) -> str:
    """The follow-up config's YAML (with its reasons as comments) from `plan`:
    collection, extends (path relative to where the file is written), seeds, needs (followup_need
    rows), fresh_seeds (the headline's), cells_now, cells_added, seconds_per_cell, parallel_cells."""
    lines = [
        f"# Follow-up of collection {plan['collection']}: more seeds to settle what it could not tell.",
        "# Written by its report from the variance of its verdicts (latentstrat.aggregate.power); run it with",
        f"#   snakemake --configfile {plan['path']} --cores 2",
        "# Cells of the collection are reused (same base and cell work); only the new seeds train.",
    ]
    if plan.get("fresh_seeds"):
        lines += [
            "# Its headline tests the fresh seeds on their own (report.headline_seeds): the second and last",
            "# look, at the second level of report.alpha_by_look, on data the first look never saw (both looks",
            "# together keep to the declared error budget); the contrast over every seed stands beside it.",
        ]
    for n in plan["needs"]:
        lines.append(f"# - {need_text(n)}")
    lines += [
        f"# Adds {plan['cells_added']} cells to the {plan['cells_now']} there are: {cost_text(plan)}.",
        f"extends: {plan['extends']}",
        f"collection: {plan['collection']}-followup",
        "seeds: [" + ", ".join(str(s) for s in plan["seeds"]) + "]",
    ]
    if plan.get("fresh_seeds"):
        lines += ["report:", "  headline_seeds: [" + ", ".join(str(s) for s in plan["fresh_seeds"]) + "]"]
    lines.append("")
    return "\n".join(lines)


def need_text(n: dict) -> str:
    """One follow-up need in words (the follow-up config's comments and analysis.md)."""
    head = (
        f"{n['metric']} against {n['comparison_arm']}: mean delta {n['mean_delta']:+.3f}, "
        f"{100 * (1 - n.get('first_alpha', 0.05)):.4g}% interval "
        f"{n['ci_low']:+.3f} to {n['ci_high']:+.3f}"
    )
    if not n["training_noise_known"]:
        return head + " without training noise (unknown): 2 seeds per setting measure it"
    tail = f"; {n['seeds_needed']} seeds would reach it, capped at report.followup_max_seeds" if n["capped"] else ""
    level = f" at the second look's level {n['alpha']:g}" if "alpha" in n else ""
    return (
        head + f" (detectable now: {n['detectable_now']:.3f}); {n['seeds']} fresh seeds per setting bring the "
        f"detectable difference{level} to {n['detectable_then']:.3f} (target {n['effect']:.3f}{tail})"
    )


def cost_text(plan: dict) -> str:
    """'about M min on a machine like the one that ran them (...)', or why there is no estimate."""
    sec = float(plan.get("seconds_per_cell", math.nan))
    if not math.isfinite(sec):
        return "time unknown (no benchmark files of the collection's cell jobs)"
    mins = plan["cells_added"] * sec / max(1, plan["parallel_cells"]) / 60
    return (
        f"about {mins:.0f} min with `--cores 2` on a machine like the one that ran them ({sec:.0f} s of one job "
        f"slot per cell measured there, {plan['parallel_cells']} cells at a time)"
    )
