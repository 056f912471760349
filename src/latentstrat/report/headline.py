"""The headline: the primary endpoint's verdict on the primary contrast, declared before the data
(docs/design.md, "Primary endpoint" and "Verdicts"), with its interval, the detectable
difference, the seeds behind it, whether training noise is in the interval, the sign-flip test
as a diagnostic outside it, the cell states per arm, which families carry the mean, and the cell sanity check it
rests on (a verdict over a failing cell reads `cannot tell`). analysis.md opens with it and
brief.yaml carries it; every number is read off the aggregate tables.
"""

from __future__ import annotations

import math

import pandas as pd

from latentstrat.aggregate.columns import FAMILY_COL
from latentstrat.aggregate.hosts import NOT_RECORDED
from latentstrat.aggregate.states import STATE_COLUMNS, STATES, states_by_arm
from latentstrat.metrics import ENDPOINT, M, label
from latentstrat.report.tables import fmt, md_table, normalized_labels, plural, primary_arms

SECONDARY = M.matched_router_score  # the original study's router score, kept in every table
ALPHA = 0.05  # the sign-flip test's level, the interval's (95%)


def _primary_arm(t: dict) -> str:
    return (primary_arms(t) or ["primary"])[0]


def primary_contrast_arm(t: dict, meta: dict) -> str | None:
    """The comparison arm of the headline: `report.primary_contrast`, else the first comparison arm."""
    declared = (meta.get("report") or {}).get("primary_contrast")
    arms = list(meta.get("comparison_arms") or [])
    a = t.get("arm_contrasts", pd.DataFrame())
    if not arms and not a.empty:
        arms = list(dict.fromkeys(a.comparison_arm))
    return declared or (arms[0] if arms else None)


def _contrast(t: dict, arm: str | None, metric: str, table: str = "arm_contrasts", look: str = "all families"):
    a = t.get(table, pd.DataFrame())
    if arm is None or a.empty:
        return None
    row = a[(a.comparison_arm == arm) & (a.metric == metric)]
    if "look" in row.columns:
        row = row[row.look == look]
    return row.iloc[0] if len(row) else None


def _num(v):
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _attribution(t: dict, arm: str | None) -> tuple[str | None, str]:
    f = t.get("fairness", pd.DataFrame())
    if arm is None or f.empty:
        return None, ""
    row = f[f.claim == f"aggregation-only causal attribution ({arm})"]
    return (row.status.iloc[0], row.evidence.iloc[0]) if len(row) else (None, "")


def headline(t: dict, meta: dict) -> dict:
    """brief.yaml's headline keys (and what analysis.md says about them)."""
    metric = meta.get("primary_metric") or ENDPOINT
    arm = primary_contrast_arm(t, meta)
    r = _contrast(t, arm, metric)
    fresh = _contrast(t, arm, metric, "headline_contrasts")
    pooled = None
    if fresh is not None:  # a follow-up: its fresh seeds on their own decide; every seed's contrast beside it
        pooled, r = r, fresh
    states = t.get("cell_states", pd.DataFrame())
    out = {
        "primary_endpoint": metric,
        "primary_contrast": {"primary_arm": _primary_arm(t), "comparison_arm": arm},
        "verdict": "cannot tell",
        "why": "",
        "delta": None,
        "ci_low": None,
        "ci_high": None,
        "detectable_delta": None,
        "seeds_per_cell": {"min": None, "max": None},
        "training_noise_in_interval": False,
        "common_cells": 0,
        "cell_states": states_by_arm(states),
        "attribution": None,
    }
    if r is None:
        out["why"] = "no common cells with a comparison arm" if arm else "no comparison arm"
        return out
    out.update(
        verdict=str(r.verdict),
        why=str(r.why or ""),
        delta=_num(r.mean_delta),
        ci_low=_num(r.ci_low),
        ci_high=_num(r.ci_high),
        detectable_delta=_num(r.detectable_delta),
        seeds_per_cell={"min": int(r.seeds_min), "max": int(r.seeds_max)},
        training_noise_in_interval=bool(r.training_noise_in_interval),
        common_cells=int(r.n_cells),
        sign_flip_p=_num(r.get("sign_flip_p")),
        sign_flip_joint=bool(r.get("sign_flip_joint", False)),
        interval_df=_num(r.get("interval_df")),
        training_noise_strata=str(r.get("training_noise_strata") or ""),
        alpha=_num(r.get("alpha")) or 0.05,
        alpha_by_look=list((meta.get("report") or {}).get("alpha_by_look") or [0.05]),
    )
    if pooled is not None:
        out["headline_seeds"] = str(fresh.get("seeds", ""))
        out["pooled"] = {
            "delta": _num(pooled.mean_delta),
            "ci_low": _num(pooled.ci_low),
            "ci_high": _num(pooled.ci_high),
            "verdict": str(pooled.verdict),
        }
    out["randomization"] = _randomization(out)
    out["attribution"], out["attribution_evidence"] = _attribution(t, arm)
    out["by_family"], out["carried_by"] = heterogeneity(t, arm, metric, out["verdict"])
    _cells_vouch(out, t, arm, meta)
    out["normalized_families"] = _normalized_secondary(t, arm, metric, fresh is not None, str(r.verdict))
    sec = _contrast(t, arm, SECONDARY) if metric != SECONDARY else None
    if sec is not None and _num(sec.mean_delta) is not None and out["delta"] is not None:
        if sec.mean_delta * out["delta"] < 0:
            out["secondary_disagrees"] = {
                "metric": SECONDARY,
                "delta": _num(sec.mean_delta),
                "verdict": str(sec.verdict),
            }
    return out


def _randomization(h: dict) -> dict | None:
    """The randomization diagnostic beside the verdict (never part of it): the sign-flip test's p,
    the look's level, whether p is below it (None where the settings are too few for p to reach
    it), and whether it is the joint variant (with the bootstrap's shared draw)."""
    p, alpha = h.get("sign_flip_p"), h.get("alpha", ALPHA)
    if p is None:
        return None
    reach = sign_flip_can_reach_alpha(h["common_cells"], alpha)
    return {"p": p, "alpha": alpha, "below": (p < alpha) if reach else None, "joint": h.get("sign_flip_joint", False)}


def randomization_md(h: dict) -> list[str]:
    """analysis.md's Randomization Diagnostic: the sign-flip test of the headline's contrast, at
    the look's level, labelled as a diagnostic outside the verdict."""
    r = h.get("randomization")
    if not r:
        return []
    n = h["common_cells"]
    owner = "the 1 setting's" if n == 1 else f"the {n} settings'"
    how = (
        "studentized sign flips of the settings' deltas about their mean plus the bootstrap's draw of the test "
        "inputs they share"
        if r["joint"]
        else "sign flips of the settings' deltas"
    )
    where = (
        f"with {plural(n, 'setting')} it cannot go below {fmt(2.0 / 2**n)}, so it says nothing at this level"
        if r["below"] is None
        else f"{'' if r['below'] else 'not '}below the look's level {r['alpha']:g}"
    )
    return [
        "## Randomization Diagnostic\n",
        f"A diagnostic, not part of the verdict and not a second test of it: a randomization test over "
        f"{owner} paired deltas ({how}), which needs no variance model for the training noise: "
        f"p = {fmt(r['p'])}, {where}. Where the arms' spreads differ their deltas are not exchangeable in sign, so "
        "the test asks a sharper question than the interval; its rate under no difference, measured through this "
        "project's own code, is in docs/design.md (Randomization diagnostic).\n",
    ]


def sign_flip_can_reach_alpha(n_settings: int, alpha: float = ALPHA) -> bool:
    """Whether the sign-flip test over n settings can go below alpha at all: its smallest two-sided
    p-value is 2 / 2^n (aggregate.contrasts.sign_flip_p), 0.0625 for 5 settings."""
    return n_settings > 0 and 2.0 / 2**n_settings < alpha


def _cells_vouch(out: dict, t: dict, arm: str | None, meta: dict) -> None:
    """A verdict stands only on cells that vouch for it: every cell of its settings passes its
    sanity check (all checks ran), and every pair trained on one kind of machine (unless the
    config accepts mixed pairs). Otherwise it reads `cannot tell`, keeping what it said."""
    failing, unchecked = failing_cells(t, arm)
    out["headline_failing_cells"], out["headline_unchecked_cells"] = failing, unchecked
    if (failing or unchecked) and out["verdict"] != "cannot tell":
        out["verdict_before_sanity"] = out["verdict"]
        out["verdict"] = "cannot tell"
        out["why"] = "it rests on " + " and ".join(
            f"{plural(len(ids), 'cell')} {what} ({', '.join(ids[:3])}" + (", ...)" if len(ids) > 3 else ")")
            for ids, what in (
                (failing, "that fail the cell sanity check"),
                (unchecked, "whose sanity checks did not all run"),
            )
            if ids
        )
    # what could not be checked at all (summary tables from outside the pipeline): the verdict
    # stands, and its line says so
    out["unchecked"] = []
    if not sanity_ran(t):
        out["unchecked"].append("no cell has a step-0 history, so no cell sanity check ran")
    mixed, unknown = host_pairs(t, arm, "pair_host_mix"), host_pairs(t, arm, "pair_host_unknown")
    if unknown and all(u.endswith(f": {NOT_RECORDED}") for u in unknown):
        out["unchecked"].append("no cell records its machine, so the pairs' hosts were not compared")
        unknown = []
    out["pairs_mixing_hosts"], out["pairs_with_unknown_hosts"] = mixed, unknown
    allowed = bool((meta.get("report") or {}).get("allow_mixed_host_pairs"))
    if (mixed or unknown) and not allowed and out["verdict"] != "cannot tell":
        out["verdict_before_host_check"] = out["verdict"]
        out["verdict"] = "cannot tell"
        reasons = [
            f"{label}: {plural(len(rows), 'setting')} {what} ({rows[0]}{', ...' if len(rows) > 1 else ''})"
            for label, rows, what in (
                ("pair mixes hosts", mixed, "pair cells run on different machines or code"),
                ("pair host unknown", unknown, "pair cells whose machine or code is not recorded"),
            )
            if rows
        ]
        out["why"] = "; ".join(
            [w for w in (out["why"],) if w]
            + reasons
            + ["rerun them on one host with this version, or declare `report.allow_mixed_host_pairs: true`"]
        )


def sanity_ran(t: dict) -> bool:
    """Whether the cell sanity check could run on any cell (a step-0 history: the pipeline's
    cells; summary tables from outside it have none)."""
    sanity = t.get("cell_sanity", pd.DataFrame())
    return not (
        sanity.empty or "passed" not in sanity.columns or sanity.step0_base_relative_reconstruction.isna().all()
    )


def failing_cells(t: dict, arm: str | None) -> tuple[list[str], list[str]]:
    """(the cells of the contrast's common settings that fail the cell sanity check, those whose
    checks did not all run): a cell passes only when every check ran and passed. Summary tables
    from outside the pipeline (`report --summary`: no cell has a training history) carry nothing
    to check: their report says so in its sanity section, and no cell is counted here."""
    c, sanity = t.get("common_cells", pd.DataFrame()), t.get("cell_sanity", pd.DataFrame())
    if arm is None or c.empty:
        return [], []
    rows = c[c.comparison_arm == arm]
    ids = {i for col in ("primary_cell", "comparison_cell") for v in rows[col] for i in str(v).split(",") if i}
    if not sanity_ran(t):
        return [], []  # tables from outside the pipeline (no histories): no cell can be checked
    failed = set(sanity.loc[sanity.passed.eq(False), "cell_id"])
    passed = set(sanity.loc[sanity.passed.eq(True), "cell_id"])
    return sorted(ids & failed), sorted(ids - failed - passed)


def _normalized_secondary(t: dict, arm: str | None, metric: str, followup: bool, verdict: str) -> dict | None:
    """The secondary endpoint (report.normalized_secondary): the contrast over the normalized
    families alone (on the follow-up's fresh seeds in a follow-up), and whether `raw` decides the
    headline: the full contrast and the normalized families' read differently."""
    r = (
        _contrast(t, arm, metric, "headline_contrasts", look="normalized families")
        if followup
        else _contrast(t, arm, metric, "normalized_contrasts")
    )
    if r is None or _num(r.mean_delta) is None:
        return None
    return {
        "delta": _num(r.mean_delta),
        "ci_low": _num(r.ci_low),
        "ci_high": _num(r.ci_high),
        "verdict": str(r.verdict),
        "why": str(r.why or ""),
        "settings": int(r.n_cells),
        "raw_decides": str(r.verdict) != verdict,
    }


def host_pairs(t: dict, arm: str | None, column: str) -> list[str]:
    """The contrast's settings whose pairs mix hosts (`pair_host_mix`) or leave them unknown
    (`pair_host_unknown`; aggregate.hosts.pair_host_check), each as `family beta: how`."""
    c = t.get("common_cells", pd.DataFrame())
    if arm is None or c.empty or column not in c.columns:
        return []
    rows = c[(c.comparison_arm == arm) & c[column].fillna("").astype(bool)]
    return [f"{r[FAMILY_COL]} {r['beta_label']}: {r[column]}" for _, r in rows.iterrows()]


def heterogeneity(t: dict, arm: str | None, metric: str, verdict: str) -> tuple[dict, list[str]]:
    """(per family: the contrast over its settings alone and without them; the families that carry
    the verdict: leaving one out turns a sign into `cannot tell` or the other sign, or, for a
    `cannot tell`, leaving it out gives a sign)."""
    f = t.get("contrast_by_family", pd.DataFrame())
    if arm is None or f.empty:
        return {}, []
    f = f[(f.comparison_arm == arm) & (f.metric == metric)]
    by, carried = {}, []
    for fam, g in f.groupby(FAMILY_COL, sort=False):
        parts = {
            r.part: {
                "delta": _num(r.mean_delta),
                "ci_low": _num(r.ci_low),
                "ci_high": _num(r.ci_high),
                "verdict": r.verdict,
                "why": str(getattr(r, "why", "") or ""),
            }
            for r in g.itertuples()
        }
        by[str(fam)] = parts
        # carried: leaving the family out changes the verdict on its own evidence (not because the
        # rest has no measured training noise left)
        without = parts.get("without", {})
        if without.get("verdict") is not None and without["verdict"] != verdict and not without.get("why"):
            carried.append(str(fam))
    return by, carried


def _mix_numbers(t: dict, arms: list[str]) -> str:
    """The arms' followed-strategy mixes: mean total variation to the data's mix and the accuracy
    probe's chance level (the cells' own majority rate), over the common cells."""
    s = t.get("summary_by_setting", pd.DataFrame())
    if s.empty or "arm" not in s.columns:
        return ""
    parts = []
    for a in arms:
        g = s[s.arm == a]
        tv, ch = g.get("followed_strategy_tv"), g.get("within_task_router_probe_chance")
        if tv is None or ch is None or g.empty:
            continue
        parts.append(f"`{a}`: total variation {fmt(tv.mean())}, chance level {fmt(ch.mean())}")
    return "; ".join(parts)


def state_sentence(states: pd.DataFrame) -> str:
    counts = states_by_arm(states)
    if not counts:
        return "No cell states (no complete cell)."
    return (
        "Cell states: "
        + "; ".join(f"`{a}` " + ", ".join(f"{n} {s}" for s, n in c.items()) for a, c in counts.items())
        + "."
    )


def headline_md(t: dict, meta: dict, h: dict) -> list[str]:
    """analysis.md's opening section."""
    metric, arm = h["primary_endpoint"], h["primary_contrast"]["comparison_arm"]
    out = ["## Headline\n"]
    if h["delta"] is None:
        return out + [
            f"Primary endpoint {label(metric)} (declared before the data, docs/design.md): **cannot tell** "
            f"({h['why']}). {state_sentence(t.get('cell_states', pd.DataFrame()))}\n"
        ]
    noise = (
        "test inputs and training noise"
        if h["training_noise_in_interval"]
        else "test inputs only: training noise unknown"
    )
    seeds = h["seeds_per_cell"]
    seeds_txt = f"{seeds['min']}" if seeds["min"] == seeds["max"] else f"{seeds['min']} to {seeds['max']}"
    why = f" ({h['why']})" if h["why"] else ""
    if h.get("unchecked"):
        why += f" (unchecked: {'; '.join(h['unchecked'])})"
    primary = h["primary_contrast"]["primary_arm"]
    out.append(
        f"Primary endpoint {label(metric)} (declared before the data, docs/design.md), `{primary}` "
        f"minus `{arm}` over {plural(h['common_cells'], 'common setting')}: {fmt(h['delta'])} "
        f"({level_text(h['alpha'])} interval {fmt(h['ci_low'])} to {fmt(h['ci_high'])}, {noise}; {seeds_txt} "
        f"{'seed' if seeds_txt == '1' else 'seeds'} per cell): **{h['verdict']}**{why}. "
        f"The smallest difference this collection could detect (80% power, {h['alpha']:g} two-sided, the same "
        f"variance): {fmt(h['detectable_delta'])}. {looks_text(h)} "
        f"{state_sentence(t.get('cell_states', pd.DataFrame()))}\n"
    )
    out += _qualifiers_md(t, h)
    if h.get("attribution") and h["attribution"] != "supported":
        evidence = h.get("attribution_evidence") or "the paired cells differ in more than token aggregation"
        out.append(
            f"**This contrast is confounded**: {evidence}. Its verdict is not about token aggregation alone "
            "(Fairness Assessment below).\n"
        )
    sec = h.get("secondary_disagrees")
    if sec:
        mix = _mix_numbers(t, [h["primary_contrast"]["primary_arm"], arm])
        out.append(
            f"The original study's {label(sec['metric'])} moves the other way ({fmt(sec['delta'])}, "
            f"**{sec['verdict']}**). It is an accuracy (times the strategy-match rate): a cell whose generations "
            "follow fewer strategies is predicted more often by the majority alone, so an arm with a more "
            "collapsed strategy mix gains accuracy without its z telling more; router information measures what "
            "z tells beyond the followed mix itself."
            + (f" The arms' followed-strategy mixes: {mix}." if mix else "")
            + "\n"
        )
    both = _both_empty(t, arm)
    if both:
        out.append(
            f"{plural(both, 'common setting')} {'is' if both == 1 else 'are'} `empty` in both arms (z unused on "
            "either side): a finding in itself; they enter the contrast with their near-zero values.\n"
        )
    return out


def level_text(alpha: float) -> str:
    """`96%` for a look at 0.04."""
    return f"{100 * (1 - alpha):.4g}%"


def looks_text(h: dict) -> str:
    """The look's place in the error budget declared before the first (report.alpha_by_look)."""
    levels = h.get("alpha_by_look") or [0.05]
    if len(levels) < 2:
        return f"One look, at {levels[0]:g}."
    if h.get("pooled"):
        return f"The second and last look (levels {levels[0]:g} then {levels[1]:g}: {sum(levels):g} over both)."
    return (
        f"The first of at most two looks (levels {levels[0]:g} then {levels[1]:g}: {sum(levels):g} over both; a "
        "follow-up's fresh seeds are the second)."
    )


def _aggregation_of(t: dict, arm: str) -> str:
    s = t.get("summary_by_setting", pd.DataFrame())
    if s.empty or "arm" not in s.columns or "token_aggregation" not in s.columns:
        return ""
    aggs = set(s.loc[s.arm == arm, "token_aggregation"])
    return aggs.pop() if len(aggs) == 1 else ""


def _normalized_md(h: dict) -> list[str]:
    """The secondary endpoint's sentence: the normalized families' contrast and whether `raw`
    decides the verdict."""
    out = []
    nf = h.get("normalized_families")
    if nf:
        decides = (
            f"so `raw`, whose scale the aggregation sets, decides the verdict ({h['verdict']} with it, "
            f"{nf['verdict']} without)"
            if nf["raw_decides"]
            else "the same reading: `raw` does not decide the verdict"
        )
        out.append(
            f"Secondary endpoint (declared before the data, `report.normalized_secondary`; exploratory, at its own "
            "level with no adjustment): over the "
            f"{plural(nf['settings'], 'setting')} of the normalized families alone (the aggregation's scale change "
            f"does not reach their objective) the contrast is {fmt(nf['delta'])} ({fmt(nf['ci_low'])} to "
            f"{fmt(nf['ci_high'])}): **{nf['verdict']}**; {decides}.\n"
        )
    return out


def _qualifiers_md(t: dict, h: dict) -> list[str]:
    """What qualifies the verdict: the follow-up's looks, the secondary, cell sanity, the families that carry it."""
    out, arm, primary = [], h["primary_contrast"]["comparison_arm"], h["primary_contrast"]["primary_arm"]
    if h.get("pooled"):
        pl = h["pooled"]
        out.append(
            f"This collection follows up an earlier one: the headline tests its fresh seeds ({h['headline_seeds']}) on "
            f"their own (`report.headline_seeds`), the second and last look, at {h['alpha']:g}, on cells the first "
            "look never saw; with the first look's level the two spend the error budget declared before the first "
            f"(`report.alpha_by_look`). Over every seed, first look's included: {fmt(pl['delta'])} "
            f"({fmt(pl['ci_low'])} to {fmt(pl['ci_high'])}, {pl['verdict']}; for context, not a test).\n"
        )
    out += _normalized_md(h)
    if h.get("verdict_before_sanity"):
        out.append(
            f"**Cell sanity**: the interval alone reads {h['verdict_before_sanity']}, but {h['why']}: the finding "
            "reads `cannot tell` until those cells are fixed or rerun (Cell Sanity Check in results.md).\n"
        )
    by = h.get("by_family") or {}
    if by:
        parts = []
        for fam, d in by.items():
            only = d.get("only") or {}
            if only.get("delta") is not None:
                why = ", training noise unknown" if only.get("why", "").startswith("training noise unknown") else ""
                interval = f"{fmt(only['ci_low'])} to {fmt(only['ci_high'])}"
                parts.append(f"{fam} {fmt(only['delta'])} ({interval}, {only['verdict']}{why})")
        out.append("Per family (its settings alone): " + "; ".join(parts) + ".\n")
    for fam in h.get("carried_by") or []:
        w = by.get(fam, {}).get("without") or {}
        lead = (
            "The verdict is carried by"
            if h.get("verdict_before_sanity", h["verdict"]) != "cannot tell"
            else "Leaving out"
        )
        text = (
            f"{lead} **{fam}**: without its settings the contrast reads {w.get('verdict')} ({fmt(w.get('delta'))}, "
            f"{fmt(w.get('ci_low'))} to {fmt(w.get('ci_high'))})"
        )
        in_nats = normalized_labels(t).get(fam) is False  # `raw`: its scale is the aggregation's
        if in_nats and {_aggregation_of(t, primary), _aggregation_of(t, arm)} == {"sum", "mean"}:
            text += (
                ". Under `mean` the raw reconstruction is a per-token mean while the KL is per example, so at the "
                "same beta the KL weighs about n_bar (the mean number of supervised tokens) times more than under "
                "`sum`: the `mean` raw cells start later or not at all, and the raw pair differs by whether z is used "
                "rather than by how it is used"
            )
        out.append(text + ".\n")
    return out


def _both_empty(t: dict, arm: str) -> int:
    a = t.get("arm_contrasts", pd.DataFrame())
    if a.empty or "both_empty_cells" not in a.columns:
        return 0
    row = a[(a.comparison_arm == arm) & a.both_empty_cells.notna()]
    return int(row.both_empty_cells.iloc[0]) if len(row) else 0


def states_md(t: dict, thr: dict) -> list[str]:
    """results.md's cell-state section: the declared rules and the counts per arm and beta."""
    states, counts = t.get("cell_states", pd.DataFrame()), t.get("cell_state_counts", pd.DataFrame())
    out = ["## Cell States\n"]
    if states.empty:
        return out + ["NA: no complete cell.\n"]
    out.append(
        'Declared before the data (docs/design.md, "Cell states"): z is used when the test KL to the router is at '
        f"least {thr['empty_kl']} and base-relative reconstruction is below {1 - thr['base_relative_near_one']:g}. "
        "`empty`: z not used; `strategy`: z used and the router information's 95% interval lies above 0; "
        '`other`: z used, no strategy information (the original study\'s "wrong latent factor"). Active units '
        "(latent dimensions whose posterior-minus-router mean varies across test inputs) stand next to KL.\n"
    )
    out.append(md_table_counts(counts))
    shown = [
        "cell_id",
        "arm",
        "state",
        *[c for c in STATE_COLUMNS if c.startswith(("kl_", "base_", "active", "router"))],
    ]
    out.append(md_table(states, shown))
    return out


def md_table_counts(counts: pd.DataFrame) -> str:
    cols = ["arm", "beta_label", *[s for s in STATES if s in counts.columns and counts[s].sum() > 0], "cells"]
    return md_table(counts, cols)


def empty_groups_md(t: dict, thr: dict) -> list[str]:
    """Where every cell of an arm at a beta is `empty`: what their validation histories show (KL
    and base-relative reconstruction after step 0), and where the longer learning curves are."""
    states, h = t.get("cell_states", pd.DataFrame()), t.get("history_long", pd.DataFrame())
    if states.empty:
        return []
    groups = [
        (arm, beta, g)
        for (arm, beta), g in states.groupby(["arm", "beta_label"], sort=False)
        if (g.state == "empty").all()
    ]
    if not groups:
        return []
    out = ["### Empty Cells\n"]
    for arm, beta, g in groups:
        hist = h[h.cell_id.isin(g.cell_id) & (h.step > 0)] if not h.empty else h
        kl = hist[hist.metric == M.kl_prior_loss].value if len(hist) else pd.Series(dtype=float)
        br = hist[hist.metric == M.base_relative_reconstruction].value if len(hist) else pd.Series(dtype=float)
        seen = (
            f" Over their validation checkpoints after step 0, KL stays between {fmt(kl.min())} and {fmt(kl.max())} "
            f"({int((kl < thr['empty_kl']).sum())} of {len(kl)} checkpoints below {thr['empty_kl']}) and base-relative "
            f"reconstruction between {fmt(br.min())} and {fmt(br.max())}."
            if len(kl) and len(br)
            else ""
        )
        out.append(f"Every `{arm}` cell at {beta} is `empty` ({len(g)} cells).{seen}")
    out.append(
        "\nWhether a longer budget would change these states is measured by learning curves at 3x the budget "
        '(docs/learning-curves.md, "Empty betas"), not by this collection.\n'
    )
    return out
