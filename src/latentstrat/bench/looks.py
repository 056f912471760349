"""The whole two-look procedure through the calibration harness: the first look of a simulated
collection; where it reads `cannot tell` and its report plans a follow-up with fresh seeds, the
follow-up's fresh cells drawn afresh (other training seeds, new test-input draws) and its second
look at the second level of `report.alpha_by_look`; the procedure reads a sign when either look
does (`python -m latentstrat.bench calibrate --procedure-draws N`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from latentstrat.bench.calibrate import Scenario, analyse, design, draw
from latentstrat.bench.targets import _pm, look_checks, rate
from latentstrat.cells import Collection


def followup_design(collection: Collection, plan: dict) -> pd.DataFrame:
    """The design of a planned follow-up's second look: its fresh seeds' cells alone (the cells
    its headline tests: report.headline_seeds)."""
    d = design(collection.followup(plan["seeds"], plan["fresh_seeds"]).cells)
    d = d[d.seed.isin(set(plan["fresh_seeds"]))].copy()
    d["replicate"] = d.groupby(["arm", "setting"])["seed"].rank(method="dense").astype(int) - 1
    d["pair"] = d.groupby(["setting", "seed"], sort=False).ngroup()
    return d.reset_index(drop=True)


def procedure(
    d: pd.DataFrame, sc: Scenario, rng, arm: str, thr: dict, collection: Collection, shift: float = 0.0
) -> dict:
    """The whole procedure on one simulated collection: the first look; when it reads `cannot
    tell` and its report plans a follow-up with fresh seeds, that follow-up's cells drawn afresh
    (other training seeds, new test-input draws) and its second look at the second level. The
    procedure reads a sign when either look does."""
    from latentstrat.aggregate.power import look_alpha

    first = analyse(*draw(d, sc, rng, shift), arm, thr, collection)
    out = {"first": first["verdict"], "second": None, "verdict": first["verdict"]}
    plan = first["plan"]
    if first["verdict"] == "cannot tell" and plan.get("needed") and plan.get("fresh_seeds"):
        second = analyse(
            *draw(followup_design(collection, plan), sc, rng, shift), arm, {**thr, "look_alpha": look_alpha(thr, True)}
        )
        out["second"] = out["verdict"] = second["verdict"]
    return out


def run_second_look(
    collection: Collection, sc: Scenario, arm: str, thr: dict, n_fresh: int, draws: int, seed: int
) -> dict:
    """Null draws of the second look alone with `n_fresh` fresh seeds in every setting (the
    follow-up every first look would plan with that many): its false-sign rate at the second
    level, and the median Welch df of its interval. What `report.followup_min_fresh_seeds` rests on."""
    from latentstrat.aggregate.power import look_alpha
    from latentstrat.cells import next_seeds

    now = collection.cells
    fresh = next_seeds([max(int(c.settings["seed"]) for c in now)], n_fresh + 1)[1:]
    d = followup_design(collection, {"seeds": list(collection.seeds) + fresh, "fresh_seeds": fresh})
    level = look_alpha(thr, True)
    rng = np.random.default_rng(seed)
    runs = pd.DataFrame([analyse(*draw(d, sc, rng), arm, {**thr, "look_alpha": level}) for _ in range(draws)])
    return {
        "fresh_seeds": n_fresh,
        "draws": draws,
        "level": level,
        "false_sign": rate(runs.verdict != "cannot tell"),
        "median_df": float(runs.interval_df.median()),
    }


def second_look_table(collection: Collection, scenarios, arm: str, thr: dict, seeds, draws: int, seed: int) -> str:
    """The second look alone per scenario and number of fresh seeds (run_second_look), as a
    Markdown table (± one Monte Carlo SE)."""
    lines = [
        "| scenario | fresh seeds | draws | level | second look's false-sign rate | median df |",
        "|---|---|---|---|---|---|",
    ]
    for i, sc in enumerate(scenarios):
        for n in seeds:
            r = run_second_look(collection, sc, arm, thr, n, draws, seed + 100 * i + n)
            lines.append(
                f"| {sc.name} | {n} | {r['draws']} | {r['level']:g} | {_pm(r['false_sign'])} | {r['median_df']:.1f} |"
            )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- a scenario


def run_procedure(d, sc: Scenario, arm: str, thr: dict, collection: Collection, draws: int, seed: int) -> dict:
    """Null draws of the whole two-look procedure (`procedure`): false signs over both looks, how
    often a follow-up ran and how often each look read a sign, with each look's level."""
    from latentstrat.aggregate.power import look_alpha

    rng = np.random.default_rng(seed)
    runs = pd.DataFrame([procedure(d, sc, rng, arm, thr, collection) for _ in range(draws)])
    followed = runs.second.notna()
    return {
        "procedure_draws": draws,
        "levels": (look_alpha(thr, False), look_alpha(thr, True)),
        "first_look_false_sign": rate(runs.first != "cannot tell"),
        "procedure_false_sign": rate(runs.verdict != "cannot tell"),
        "followup_rate": float(followed.mean()),
        "followups": int(followed.sum()),
        "second_look_false_sign": rate(runs.loc[followed, "second"] != "cannot tell") if followed.any() else None,
    }


def procedure_checks(r: dict) -> list[str]:
    """What the two-look procedure misses: each look at most its own level (the second counted
    over the runs that followed up), and both together at most the sum of the levels."""
    a1, a2 = r["levels"]
    out = look_checks(r["first_look_false_sign"], r["procedure_draws"], a1, "first look")
    if r["second_look_false_sign"] is not None:
        out += look_checks(r["second_look_false_sign"], r["followups"], a2, "second look")
    if r["procedure_false_sign"][0] > a1 + a2:
        out.append(f"both looks {r['procedure_false_sign'][0]:.3f} > {a1 + a2:g}")
    return out


def procedure_table(rows: list[dict]) -> str:
    """The two-look procedure's Markdown table (± one Monte Carlo SE): false signs are signs of
    either direction where the arms do not differ; a procedure passes procedure_checks."""
    lines = [
        "| scenario | draws | first look's false signs | follow-up planned and run | second look's false signs | "
        "over both looks | meets targets |\n|---|---|---|---|---|---|---|"
    ]
    for r in rows:
        second = _pm(r["second_look_false_sign"]) if r["second_look_false_sign"] else "NA"
        miss = procedure_checks(r)
        lines.append(
            f"| {r['scenario']} | {r['procedure_draws']} | {_pm(r['first_look_false_sign'])} | "
            f"{r['followup_rate']:.2f} ({r['followups']}) | {second} | {_pm(r['procedure_false_sign'])} | "
            f"{'yes' if not miss else 'no: ' + '; '.join(miss)} |"
        )
    return "\n".join(lines)
