"""Cell states, decided before any contrast by rules declared in docs/design.md ("Cell states").

z is *used* when the posterior departs from the router (test KL at least `report.empty_kl`) AND
the generator gains from it: the per-token base-relative reconstruction (the test split's summed
NLL over the entangled model's, `token_base_relative_reconstruction`: one weighting in both
token aggregations; the aggregation's own `base_relative_reconstruction` where a table lacks it)
below 1 - `report.base_relative_near_one`. Then:
- `empty`: z is not used: the generator is the entangled model whatever z is, or z carries
  nothing the router does not (a cell a few steps in has a large KL between two random heads and
  a generator that still ignores z: empty);
- `strategy`: z is used and the router's z carries strategy information beyond what x alone
  tells: the primary endpoint's (router_information) 95% interval lies above the same probe on the
  router's mean (`router_mu_information`, the part of z that x decides) and above the declared
  floor `report.strategy_information_floor`;
- `other`: z is used but its router information does not clear that bar: the original study's
  "wrong latent factor" (z carries something, not the strategy, or only what x tells);
- `unknown`: a measurement the rules need is missing (an external summary table without it).

An empty cell whose router information reads above 0 stays empty (its `why` says so): a probe can
read a little from an unused z (the router's mean depends on x, and greedy decoding from an
unused z follows each input's most likely strategy), which is x speaking, not a latent strategy.
States describe cells; no cell is left out of a contrast because of its state.
"""

from __future__ import annotations

import math

import pandas as pd

from latentstrat.aggregate.columns import FAMILY_COL
from latentstrat.metrics import M

STATES = ("empty", "strategy", "other", "unknown")
STATE_COLUMNS = [
    "cell_id",
    "arm",
    FAMILY_COL,
    "beta_label",
    "seed",
    M.kl_prior_loss,
    M.base_relative_reconstruction,
    M.token_base_relative_reconstruction,
    M.active_units,
    M.router_mu_information,
    M.router_information,
    "router_information_ci_low",
    "router_information_ci_high",
    "state",
    "why",
]


def _num(row, key) -> float:
    try:
        v = float(row.get(key, math.nan))
    except (TypeError, ValueError):
        return math.nan
    return v


def cell_state(row, empty_kl: float, near_one: float, floor: float = 0.0) -> tuple[str, str]:
    """(state, the numbers and rule that decided it) of one cell's metrics row."""
    kl = _num(row, M.kl_prior_loss)
    br, weighting = _num(row, M.token_base_relative_reconstruction), "per-token"
    if math.isnan(br):
        br, weighting = _num(row, M.base_relative_reconstruction), "the aggregation's"
    info, lo, hi = (_num(row, f"{M.router_information}{s}") for s in ("", "_ci_low", "_ci_high"))
    x_alone = _num(row, M.router_mu_information)
    if math.isnan(kl) or math.isnan(br):
        return "unknown", "no KL or base-relative reconstruction recorded"
    measured = f"KL {kl:.3g}, base-relative reconstruction ({weighting}) {br:.3g}"
    interval = f"router information {info:.3g} (95% interval {lo:.3g} to {hi:.3g})"
    if kl < empty_kl or br >= 1 - near_one:
        rule = f"KL < {empty_kl:g}" if kl < empty_kl else f"base-relative reconstruction >= {1 - near_one:g}"
        note = f"; {interval} above 0 is x speaking through the router, not a used z" if lo > 0 else ""
        return "empty", f"z unused ({rule}): {measured}{note}"
    if math.isnan(lo):
        return "unknown", f"z is used ({measured}), but no router information interval is recorded"
    bar, bar_text = floor, f"the floor {floor:g}"
    if not math.isnan(x_alone) and x_alone > floor:
        bar, bar_text = x_alone, f"what x alone tells (router-mean information {x_alone:.3g})"
    if lo > bar:
        return "strategy", f"{interval} above {bar_text}; z is used ({measured})"
    return "other", f"z is used ({measured}) but {interval} does not clear {bar_text}"


def cell_states(summary: pd.DataFrame, thr: dict) -> pd.DataFrame:
    """One row per complete cell: its state and why (STATE_COLUMNS)."""
    rows = []
    for _, r in summary.iterrows():
        state, why = cell_state(
            r, thr["empty_kl"], thr["base_relative_near_one"], float(thr.get("strategy_information_floor") or 0.0)
        )
        rows.append(
            {**{c: r.get(c) for c in STATE_COLUMNS[:-2]}, FAMILY_COL: r.get("family_label"), "state": state, "why": why}
        )
    return pd.DataFrame(rows, columns=STATE_COLUMNS)


def state_counts(states: pd.DataFrame) -> pd.DataFrame:
    """Cells per arm, beta and state (one column per state, and the total)."""
    cols = ["arm", "beta_label", *STATES, "cells"]
    if states.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for (arm, beta), g in states.groupby(["arm", "beta_label"], sort=False):
        counts = g.state.value_counts()
        out.append({"arm": arm, "beta_label": beta, **{s: int(counts.get(s, 0)) for s in STATES}, "cells": len(g)})
    return pd.DataFrame(out, columns=cols)


def states_by_arm(states: pd.DataFrame) -> dict:
    """arm -> state -> count (brief.yaml's `cell_states`; states with no cell left out)."""
    if states.empty:
        return {}
    return {
        str(arm): {s: int(n) for s, n in g.state.value_counts().reindex(STATES).dropna().items() if n}
        for arm, g in states.groupby("arm", sort=False)
    }
