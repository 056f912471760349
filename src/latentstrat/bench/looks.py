"""The whole two-look procedure through the calibration harness: the first look of a simulated
collection; where it reads `cannot tell` and its report plans a follow-up with fresh seeds, the
follow-up's fresh cells drawn afresh (other training seeds, new test-input draws) and its second
look at the second level of `report.alpha_by_look`; the procedure reads a sign when either look
does (`python -m latentstrat.bench calibrate --procedure-draws N`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from latentstrat.bench.calibrate import Scenario, _pm, analyse, design, draw, rate
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


# ----------------------------------------------------------------------------- a scenario


def run_procedure(d, sc: Scenario, arm: str, thr: dict, collection: Collection, draws: int, seed: int) -> dict:
    """Null draws of the whole two-look procedure (`procedure`): false signs over both looks, how
    often a follow-up ran and how often each look read a sign."""
    rng = np.random.default_rng(seed)
    runs = pd.DataFrame([procedure(d, sc, rng, arm, thr, collection) for _ in range(draws)])
    followed = runs.second.notna()
    return {
        "procedure_draws": draws,
        "procedure_false_sign": rate(runs.verdict != "cannot tell"),
        "followup_rate": float(followed.mean()),
        "second_look_false_sign": rate(runs.loc[followed, "second"] != "cannot tell") if followed.any() else None,
    }


def procedure_table(rows: list[dict]) -> str:
    """The two-look procedure's Markdown table (± one Monte Carlo SE): a procedure passes when its
    false-sign rate over both looks is at most 5%."""
    lines = [
        "| scenario | draws | follow-up planned and run | second look's false-sign rate | false-sign rate over both "
        "looks | meets target |\n|---|---|---|---|---|---|"
    ]
    for r in rows:
        fs = r["procedure_false_sign"]
        second = _pm(r["second_look_false_sign"]) if r["second_look_false_sign"] else "NA"
        lines.append(
            f"| {r['scenario']} | {r['procedure_draws']} | {r['followup_rate']:.2f} | {second} | {_pm(fs)} | "
            f"{'yes' if fs[0] <= 0.05 else 'no'} |"
        )
    return "\n".join(lines)
