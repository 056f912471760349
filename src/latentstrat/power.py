"""Power: the smallest difference a collection could detect, and the follow-up that would settle
a `cannot tell` (design section 6, docs/design.md).

A verdict comes from a 95% interval of a delta (`aggregate.contrasts.arm_contrasts`). Read as a normal
interval, its half-width is 1.96 standard errors. A true difference d is found (the interval
excludes 0) with 80% power when |d| >= (z_0.975 + z_0.8) * SE = 2.80 * SE: that is the
*detectable difference* printed next to every verdict.

A `cannot tell` whose arms do carry router signal is a matter of power: more replicates shrink
SE as 1 / sqrt(n). The follow-up adds seeds (each seed retrains and re-evaluates every cell, so
it averages both the training noise and the test-set noise; the test split is already used as
configured) until the detectable difference reaches the effect to settle: the observed mean
delta, or `report.near_zero_delta` when the observed delta is smaller than that (then the
follow-up tells "no difference larger than near_zero_delta" from "a small one").
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # two-sided 95%
Z80 = 0.8416212335729143  # one-sided 80% power
DETECT = Z95 + Z80


def standard_error(ci_low: float, ci_high: float) -> float:
    """SE of an estimate from its 95% interval (normal approximation); NaN without one."""
    if ci_low is None or ci_high is None or not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return math.nan
    return (ci_high - ci_low) / (2 * Z95)


def detectable_difference(ci_low: float, ci_high: float) -> float:
    """The smallest true difference the interval's precision finds with 80% power at 5% (two-sided)."""
    return DETECT * standard_error(ci_low, ci_high)


def seeds_to_detect(se: float, n_seeds: int, effect: float) -> int:
    """Seeds per setting at which the detectable difference falls to `effect` (SE ~ 1/sqrt(n))."""
    if not (math.isfinite(se) and effect > 0):
        return n_seeds
    return max(n_seeds, math.ceil(n_seeds * (DETECT * se / effect) ** 2))


def followup_need(contrast: dict, n_seeds: int, near_zero: float, max_seeds: int) -> dict | None:
    """For one arm contrast (an `arm_contrasts` row): None when its verdict decides, when it has
    no interval, or when its `cannot tell` is not about power (no router signal in either arm:
    more replicates of noise settle nothing). Else the seeds that would settle it (capped at
    `max_seeds`) and what they would reach."""
    if contrast["verdict"] != "cannot tell" or contrast.get("why"):
        return None
    se = standard_error(contrast["ci_low"], contrast["ci_high"])
    if not math.isfinite(se) or se == 0:
        return None
    effect = max(abs(float(contrast["mean_delta"])), float(near_zero))
    need = seeds_to_detect(se, n_seeds, effect)
    seeds = min(need, max_seeds)
    if seeds <= n_seeds:
        return None
    return {
        "comparison_arm": contrast["comparison_arm"],
        "metric": contrast["metric"],
        "mean_delta": float(contrast["mean_delta"]),
        "ci_low": float(contrast["ci_low"]),
        "ci_high": float(contrast["ci_high"]),
        "detectable_now": DETECT * se,
        "effect": effect,
        "seeds_needed": need,
        "seeds": seeds,
        "capped": need > max_seeds,
        "detectable_then": DETECT * se * math.sqrt(n_seeds / seeds),
    }


def next_seeds(seeds: list[int], n: int) -> list[int]:
    """`seeds` extended to n values with the next unused integers after the last one."""
    out = list(seeds)
    s = max(out) if out else 0
    while len(out) < n:
        s += 1
        if s not in out:
            out.append(s)
    return out


def followup_text(plan: dict) -> str:
    """The follow-up config's YAML (with its reasons as comments) from `plan`:
    collection, extends (path relative to where the file is written), seeds, needs (followup_need
    rows), cells_now, cells_added, seconds_per_cell, parallel_cells."""
    lines = [
        f"# Follow-up of collection {plan['collection']}: more seeds to settle what it could not tell.",
        "# Written by its report from the bootstrap variance (latentstrat.power); run it with",
        f"#   snakemake --configfile {plan['path']} --cores 2",
        "# Cells of the collection are reused (same base and cell work); only the new seeds train.",
    ]
    for n in plan["needs"]:
        lines.append(
            f"# - {n['metric']} against {n['comparison_arm']}: mean delta {n['mean_delta']:+.3f}, 95% interval "
            f"{n['ci_low']:+.3f} to {n['ci_high']:+.3f} (detectable now: {n['detectable_now']:.3f}); "
            f"{n['seeds']} seeds bring the detectable difference to {n['detectable_then']:.3f} "
            f"(target {n['effect']:.3f}"
            + (
                f"; {n['seeds_needed']} seeds would reach it, capped at report.followup_max_seeds"
                if n["capped"]
                else ""
            )
            + ")"
        )
    lines += [
        f"# Adds {plan['cells_added']} cells to the {plan['cells_now']} there are: {cost_text(plan)}.",
        f"extends: {plan['extends']}",
        f"collection: {plan['collection']}-followup",
        "seeds: [" + ", ".join(str(s) for s in plan["seeds"]) + "]",
        "",
    ]
    return "\n".join(lines)


def cost_text(plan: dict) -> str:
    """'about M min on a machine like the one that ran them (...)', or why there is no estimate."""
    sec = float(plan.get("seconds_per_cell", math.nan))
    if not math.isfinite(sec):
        return "time unknown (no benchmark files of the collection's cell jobs)"
    mins = plan["cells_added"] * sec / max(1, plan["parallel_cells"]) / 60
    return (
        f"about {mins:.0f} min on a machine like the one that ran them ({sec:.0f} s of one job slot per cell "
        f"measured there, {plan['parallel_cells']} cells at a time)"
    )
