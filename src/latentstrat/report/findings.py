"""Interpretive findings: each answers one of the users' diagnostic questions from the aggregate tables.

Every finding states its status (supported / not supported / cannot tell), the numbers and the
threshold it used (cfg["report"]: near_zero_delta, base_relative_near_one). Nothing here is a
hard-coded conclusion.
"""

from __future__ import annotations

import functools

import pandas as pd

from latentstrat.aggregate.columns import FAMILY_COL
from latentstrat.families import parse_family
from latentstrat.metrics import SCORED_NAMES, M, label
from latentstrat.report.tables import fmt, normalized_labels

SUPPORTED, NOT_SUPPORTED, CANNOT_TELL = "supported", "not supported", "cannot tell"


def _f(question, status, evidence, threshold="", numbers=None):
    return {
        "question": question,
        "status": status,
        "evidence": evidence,
        "threshold": threshold,
        "numbers": numbers or {},
    }


def _arm_aggs(t) -> dict:
    """comparison arm -> its token aggregation, from the run-here summary or the common-cell column names."""
    s = t["summary_by_setting"]
    out = {}
    if not s.empty and "arm" in s.columns:
        out.update({a: g.token_aggregation.iloc[0] for a, g in s.groupby("arm")})
    c = t["common_cells"]
    for arm in c.comparison_arm.unique() if not c.empty else []:
        if arm not in out:
            pre = [
                col[: -len("_matched_router_score")]
                for col in c.columns
                if col.endswith("_matched_router_score") and not col.startswith("delta")
            ]
            out[arm] = next((p for p in pre if p not in ("sum",)), "mean")
    return out


def q_scale_vs_weighting(t, thr):
    q = (
        "Is sum failing because raw per-example reconstruction scale changes, or because token-sum changes "
        "which examples dominate gradients?"
    )
    aggs = _arm_aggs(t)
    scaled = [a for a, g in aggs.items() if g == "sum_scaled"]
    means = [a for a, g in aggs.items() if g == "mean" and _attribution_ok(t, a)]
    if not scaled or not means:
        return _f(
            q,
            CANNOT_TELL,
            "needs common cells with a `sum_scaled` arm and a matched `mean` arm (only token_aggregation differing); "
            f"have arms: {', '.join(f'{a} ({g})' for a, g in aggs.items()) or 'none'}",
            f"near_zero_delta={thr}",
        )
    metric = _ranking_metric(t)
    ds, d_scale, se_s = _raw_delta(t, scaled[0], metric)  # sum - sum_scaled: scale only
    dm, d_mean, se_m = _raw_delta(t, means[0], metric)  # sum - mean: scale + weighting
    if ds.empty or dm.empty:
        return _f(
            q,
            CANNOT_TELL,
            f"no `raw`-family common cells with {label(metric)} on both sides (sum_scaled differs "
            "from sum only for raw: the normalized families' reference scale cancels n_bar)",
            "",
        )
    d_weight = d_mean - d_scale  # sum_scaled - mean: weighting only
    # conservative: the two deltas share the sum cell (positively correlated), so this SE is too wide, never too narrow
    se_w = (se_m**2 + se_s**2) ** 0.5
    v_scale, v_weight = _verdict_se(d_scale, se_s), _verdict_se(d_weight, se_w)
    nums = {
        "sum_minus_sum_scaled": d_scale,
        "sum_scaled_minus_mean": d_weight,
        "sum_minus_mean": d_mean,
        "scale_verdict": v_scale,
        "weighting_verdict": v_weight,
        "metric": metric,
        "cells": int(len(ds)),
    }
    ev = (
        f"{label(metric)}, mean over {len(ds)} raw-family settings: sum - sum_scaled (scale only) = {fmt(d_scale)} "
        f"(95% interval {fmt(d_scale - Z * se_s)} to {fmt(d_scale + Z * se_s)}: {v_scale}); sum_scaled - mean "
        f"(example weighting only) = {fmt(d_weight)} ({fmt(d_weight - Z * se_w)} to {fmt(d_weight + Z * se_w)}: "
        f"{v_weight}); sum - mean = {fmt(d_mean)}"
    )
    th = "an effect is a 95% interval that excludes 0"
    if v_scale != CANNOT_TELL and v_weight == CANNOT_TELL:
        return _f(q, SUPPORTED, "scale: " + ev, th, nums)
    if v_weight != CANNOT_TELL and v_scale == CANNOT_TELL:
        return _f(q, SUPPORTED, "example weighting: " + ev, th, nums)
    if v_weight != CANNOT_TELL and v_scale != CANNOT_TELL:
        return _f(q, CANNOT_TELL, "both scale and weighting move the score: " + ev, th, nums)
    return _f(q, CANNOT_TELL, "neither effect is distinguishable from noise: " + ev, th, nums)


Z = 1.959963984540054


def _ranking_metric(t) -> str:
    c = t["common_cells"]
    for m in (M.router_information, M.matched_router_score):
        if f"delta_{m}" in c.columns and c[f"delta_{m}"].notna().any():
            return m
    return M.matched_router_score


def _raw_delta(t, arm, metric):
    """(the common cells of `arm` whose family is not normalized (`raw`: its scale is the
    aggregation's), their mean delta, its SE from the cells' intervals)."""
    c = t["common_cells"]
    col = f"delta_{metric}"
    if c.empty or col not in c.columns:
        return c, float("nan"), float("nan")
    in_nats = [f for f, normalized in normalized_labels(t).items() if not normalized]
    g = c[(c.comparison_arm == arm) & c[FAMILY_COL].isin(in_nats)].dropna(subset=[col])
    if g.empty:
        return g, float("nan"), float("nan")
    se = (
        (g[f"{col}_ci_high"] - g[f"{col}_ci_low"]) / (2 * Z)
        if f"{col}_ci_high" in g.columns
        else pd.Series(float("nan"))
    )
    return g, float(g[col].mean()), float((se**2).sum() ** 0.5 / len(g)) if se.notna().all() else float("nan")


def _verdict_se(d: float, se: float) -> str:
    if pd.isna(d) or pd.isna(se):
        return CANNOT_TELL
    return "negative" if d + Z * se < 0 else ("positive" if d - Z * se > 0 else CANNOT_TELL)


def _attribution_ok(t, arm) -> bool:
    f = t["fairness"]
    row = f[f.claim == f"aggregation-only causal attribution ({arm})"] if not f.empty else f
    return not row.empty and row.status.iloc[0] == "supported"


def q_scale_cancels(t, thr_near_zero, thr_one):
    q = (
        "Does the z-free reference scale fully cancel the aggregation-scale change for normalized "
        "objectives, or only make final scalar magnitudes comparable?"
    )
    c = t["common_cells"]
    s = t["reference_scale"]
    ratio = s.loc[s.aggregation_mode.str.contains("_ratio"), "mean"] if not s.empty else pd.Series(dtype=float)
    if c.empty or "delta_active_reconstruction_objective" not in c.columns:
        return _f(q, CANNOT_TELL, "no common cells with active reconstruction objectives", "")
    arm = c.comparison_arm.iloc[0]
    c = c[c.comparison_arm == arm]  # one comparison arm: columns [comparison_, primary_]
    # the two aggregations' columns that hold values for this arm (other arms' prefixes are all-NaN)
    pre = [
        col[: -len("_active_reconstruction_objective")]
        for col in c.columns
        if col.endswith("_active_reconstruction_objective") and not col.startswith("delta") and c[col].notna().any()
    ]
    norm = c[c[FAMILY_COL].map(normalized_labels(t)).fillna(False).astype(bool)]
    if norm.empty or len(pre) < 2:
        return _f(q, CANNOT_TELL, "no normalized-family common cells", "")
    p_col, c_col = f"{pre[1]}_active_reconstruction_objective", f"{pre[0]}_active_reconstruction_objective"
    rel = (norm[p_col] / norm[c_col]).median()
    d_router = norm["delta_matched_router_score"].mean()
    nums = {
        "scale_ratio": float(ratio.iloc[0]) if len(ratio) else None,
        "median_active_ratio_normalized": rel,
        "mean_router_delta_normalized": d_router,
    }
    ev = (
        f"raw scale ratio {fmt(nums['scale_ratio'])}; over {len(norm)} normalized-family common cells the median "
        f"{pre[1]}/{pre[0]} active objective ratio is {fmt(rel)} and the mean matched-router delta is {fmt(d_router)}"
    )
    thr = (
        f"|ratio - 1| < {thr_one} reads as comparable magnitude; |delta| < {thr_near_zero} as no behavioural difference"
    )
    if pd.isna(d_router) or pd.isna(rel):
        return _f(q, CANNOT_TELL, "matched router score or active objective missing (probes NA): " + ev, thr, nums)
    a = t.get("arm_contrasts", pd.DataFrame())
    noise = (
        a[(a.comparison_arm == arm) & (a.metric == M.matched_router_score)] if not a.empty and "why" in a.columns else a
    )
    if not noise.empty and noise.why.iloc[0]:
        return _f(q, CANNOT_TELL, f"{noise.why.iloc[0]}, so the behavioural half cannot be compared: " + ev, thr, nums)
    if abs(rel - 1) < thr_one and abs(d_router) < thr_near_zero:
        return _f(q, SUPPORTED, "cancels: " + ev, thr, nums)
    if abs(rel - 1) < thr_one:
        return _f(q, NOT_SUPPORTED, "magnitudes comparable, behaviour not: " + ev, thr, nums)
    return _f(q, NOT_SUPPORTED, "not even the magnitudes match: " + ev, thr, nums)


def q_accuracy_hides_gap(t, thr):
    """Per primary cell, from its 95% intervals: is its answer accuracy near the entangled
    model's (the interval reaches within near_zero_delta of it), and does its posterior-router
    probe gap's interval lie above 0? Supported when most near-accuracy cells have such a gap."""
    q = (
        "Does high final answer accuracy hide a posterior-router mismatch (generator solves tasks while "
        "router samples carry weak strategy information)?"
    )
    s, sanity = t["summary"], t.get("cell_sanity", pd.DataFrame())
    need = ["final_answer_accuracy_ci_high", "posterior_router_probe_gap_ci_low", "posterior_router_probe_gap_ci_high"]
    if s.empty or sanity.empty or not set(need) <= set(s.columns):
        return _f(
            q,
            CANNOT_TELL,
            "needs per-cell intervals of final answer accuracy and the posterior-router probe gap, "
            "and the entangled model's accuracy",
            "",
        )
    primary = s[s["role"] == "primary"] if "role" in s.columns else s
    ent = dict(zip(sanity.cell_id, sanity.entangled_answer_accuracy))
    rows = primary.assign(entangled=primary.cell_id.map(ent)).dropna(subset=["entangled", *need])
    if rows.empty:
        return _f(q, CANNOT_TELL, "no cell has both intervals and an entangled-model accuracy to compare with", "")
    near = rows[rows.final_answer_accuracy_ci_high >= rows.entangled - thr]
    gap = near[near.posterior_router_probe_gap_ci_low > 0]
    th = (
        f"accuracy near the entangled model's: its 95% interval reaches within {fmt(thr)} of it; "
        "a mismatch: the gap's 95% interval above 0"
    )
    nums = {
        "cells": int(len(rows)),
        "near_entangled_accuracy": int(len(near)),
        "with_gap_above_0": int(len(gap)),
        "entangled_answer_accuracy": float(rows.entangled.iloc[0]),
        "median_final_answer_accuracy": float(rows[M.final_answer_accuracy].median()),
        "median_posterior_router_gap": float(rows[M.posterior_router_probe_gap].median()),
    }
    ev = (
        f"{len(near)} of {len(rows)} cells answer near the entangled model's accuracy "
        f"{fmt(nums['entangled_answer_accuracy'])} "
        f"(median {fmt(nums['median_final_answer_accuracy'])}); {len(gap)} of those {len(near)} have a "
        "posterior-router "
        f"probe gap whose interval lies above 0 (median gap {fmt(nums['median_posterior_router_gap'])})"
    )
    if near.empty:
        return _f(q, NOT_SUPPORTED, "accuracy is not near the entangled model's: " + ev, th, nums)
    if 2 * len(gap) > len(near):
        return _f(q, SUPPORTED, ev, th, nums)
    if gap.empty:
        return _f(q, NOT_SUPPORTED, "accuracy is high but no cell has a gap above 0: " + ev, th, nums)
    return _f(q, CANNOT_TELL, "only some near-accuracy cells have a gap: " + ev, th, nums)


ALPHA = 0.05  # false-positive rate of a per-cell "rise then fall" call under no change


@functools.cache
def _permutations(k: int, seed: int = 0):
    """Every ordering of k checkpoints (k <= 8), else 5000 random ones (seeded); built once per
    k, since every cell of a collection has the same number of checkpoints."""
    import itertools

    import numpy as np

    if k <= 8:
        return np.array(list(itertools.permutations(range(k))))
    rng = np.random.default_rng(seed)
    return np.array([rng.permutation(k) for _ in range(5000)])


def rise_fall_pvalues(values, seed: int = 0) -> tuple[float, float]:
    """(p of a rising trend, p of a rise-then-fall) of one cell's validation trajectory, by
    permutation: under no change the checkpoints' values are exchangeable, so the rank of the
    observed statistic among all orderings is its p-value. Rising trend = Kendall's S (sum over
    pairs i < j of sign(v_j - v_i)); rise-then-fall = min(max - first, max - final), large only
    when the peak is interior and both ends are low. A call at p <= ALPHA has a false-positive
    rate <= ALPHA whatever the noise level."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 3:
        return float("nan"), float("nan")
    perms = v[_permutations(len(v), seed)]
    peak = perms.max(1)
    i, j = np.triu_indices(len(v), 1)
    rise = np.sign(perms[:, j] - perms[:, i]).sum(1)
    both = np.minimum(peak - perms[:, 0], peak - perms[:, -1])
    r_obs, b_obs = np.sign(v[j] - v[i]).sum(), min(v.max() - v[0], v.max() - v[-1])
    eps = 1e-12
    return float(np.mean(rise >= r_obs - eps)), float(np.mean(both >= b_obs - eps))


def q_early_or_late(t, thr):
    q = "Do sum runs lose router structure early, or do they initially learn structure and collapse later?"
    h = t.get("history_long", pd.DataFrame())
    st = t["collection_state"]
    metric = SCORED_NAMES[M.matched_router_score]
    if h.empty or metric not in set(h.metric):
        return _f(q, CANNOT_TELL, "no validation history with matched router score", "")
    h = h[h.metric == metric]
    if not st.empty:
        h = h[h.cell_id.isin(st.loc[st.role == "primary", "cell_id"])]
    calls = {}
    for cid, g in h.groupby("cell_id", sort=True):
        calls[cid] = rise_fall_pvalues(g.sort_values("step").value.to_numpy())
    calls = {c: p for c, p in calls.items() if p[0] == p[0]}  # cells with >= 3 checkpoints
    n = len(calls)
    if not n:
        return _f(q, CANNOT_TELL, "fewer than 3 validation checkpoints per cell", "")
    late = sum(p[1] <= ALPHA for p in calls.values())
    rose = sum(p[0] <= ALPHA for p in calls.values())
    d = t["dynamics_summary"]
    d = d[d.cell_id.isin(calls)] if not d.empty else d
    nums = {"cells": n, "rise_then_fall": late, "rose": rose, "alpha": ALPHA}
    if not d.empty and "max_val_scored_matched_router_score" in d.columns:
        nums.update(
            median_first=d.first_val_scored_matched_router_score.median(),
            median_max=d.max_val_scored_matched_router_score.median(),
            median_final=d.final_val_scored_matched_router_score.median(),
        )
    ev = (
        f"of {n} primary cells, {late} show a rise then a fall of the validation matched router score (scored "
        f"proxy) beyond what reordering their own checkpoints produces (permutation p <= {ALPHA}), {rose} a rising "
        f"trend; "
        f"median first {fmt(nums.get('median_first'))}, max {fmt(nums.get('median_max'))}, "
        f"final {fmt(nums.get('median_final'))}"
    )
    k = int(h.groupby("cell_id").step.nunique().min())
    best_p = 2 / (k * (k - 1))  # the smallest rise-then-fall p-value k checkpoints allow
    ev += f"; with {k} checkpoints the smallest possible rise-then-fall p-value is {fmt(best_p)}"
    th = f"per-cell permutation test over checkpoint orderings, p <= {ALPHA}; a majority of cells decides"
    if late > n / 2:
        return _f(q, SUPPORTED, "learn then collapse: " + ev, th, nums)
    if rose > n / 2:
        return _f(q, NOT_SUPPORTED, "most cells learn structure and do not lose it: " + ev, th, nums)
    why = "too few checkpoints to call either pattern" if best_p > ALPHA else "neither pattern in a majority of cells"
    return _f(q, CANNOT_TELL, f"{why}: " + ev, th, nums)


def q_tokcc_narrow(t, thr_one, thr):
    q = (
        "Does tokcc under sum focus on a narrow token subset, leaving raw sequence reconstruction poor but "
        "final answers intact?"
    )
    s = t["summary_by_setting"]
    st = t["collection_state"]
    if s.empty or M.base_relative_reconstruction not in s.columns:
        return _f(q, CANNOT_TELL, "summary lacks base-relative reconstruction", "")
    if not st.empty and "arm" in s.columns:
        s = s[s.arm.isin(st.loc[st.role == "primary", "arm"])]
    tok = s[[parse_family(f).kind == "tokcc" for f in s.reconstruction_family]]
    if tok.empty or tok[M.base_relative_reconstruction].isna().all():
        return _f(q, CANNOT_TELL, "no tokcc rows with base-relative reconstruction", "")
    br = tok[M.base_relative_reconstruction].median()
    acc = tok[M.final_answer_accuracy].median() if M.final_answer_accuracy in tok.columns else float("nan")
    act = (
        tok[M.active_reconstruction_objective].median()
        if M.active_reconstruction_objective in tok.columns
        else float("nan")
    )
    nums = {"median_base_relative": br, "median_final_answer_accuracy": acc, "median_active_tokcc": act}
    ev = (
        f"{len(tok)} tokcc rows: median base-relative reconstruction {fmt(br)}, median active tokcc objective "
        f"{fmt(act)}, "
        f"median final answer accuracy {fmt(acc)}"
    )
    th = f"base-relative > 1 + {thr_one} reads as poor raw reconstruction; accuracy >= {fmt(1 - thr)} as intact"
    if br > 1 + thr_one and acc >= 1 - thr:
        return _f(q, SUPPORTED, ev, th, nums)
    return _f(q, NOT_SUPPORTED, ev, th, nums)


def q_confounded(t):
    q = "Are the comparisons with a mean arm confounded by schedule (or other setting) differences?"
    f = t["fairness"]
    rows = f[f.claim.str.startswith("aggregation-only causal attribution")] if not f.empty else f
    if rows.empty:
        return _f(q, CANNOT_TELL, "no comparison arm to compare", "")
    conf = rows[rows.status != "supported"]
    ev = "; ".join(f"{r.claim}: {r.status} ({r.evidence})" for _, r in rows.iterrows())
    if len(conf) == len(rows):
        return _f(
            q,
            SUPPORTED,
            "every comparison arm is confounded or incompletely recorded: " + ev,
            "attribution status from the fairness table",
        )
    if len(conf):
        return _f(
            q,
            SUPPORTED,
            "some comparison arms are confounded, at least one is matched: " + ev,
            "attribution status from the fairness table",
        )
    return _f(q, NOT_SUPPORTED, ev, "attribution status from the fairness table")


def q_token_dominance(t, thr):
    q = "Under token-sum, do tasks with more supervised tokens dominate the summed loss and the gradient?"
    d = t["token_dominance"]
    if d.empty:
        return _f(q, CANNOT_TELL, "no per-task share metrics in the histories", "")
    parts, nums = [], {}
    verdicts = []
    for (agg, ck), g in d.groupby(["token_aggregation", "checkpoint"], sort=False):
        top = g.sort_values("loss_share", ascending=False).iloc[0]
        gap_tok = (g.loss_share - g.token_share).abs().max()
        gap_ex = (g.loss_share - g.example_share).abs().max()
        nums[f"{agg}|{ck}"] = {
            "top_task": top.task,
            "top_loss_share": top.loss_share,
            "max_abs_loss_minus_token_share": gap_tok,
            "max_abs_loss_minus_example_share": gap_ex,
        }
        parts.append(
            f"{agg} at {ck}: top loss share {top.task} {fmt(top.loss_share)} (example share {fmt(top.example_share)}, "
            f"token share {fmt(top.token_share)}); max |loss - token share| {fmt(gap_tok)}, max |loss - example "
            f"share| {fmt(gap_ex)}"
        )
        if agg == "sum":
            verdicts.append(gap_tok < gap_ex and (g.loss_share - g.example_share).abs().max() > thr)
    if not verdicts:
        return _f(q, CANNOT_TELL, "no sum cells: " + "; ".join(parts), "")
    status = SUPPORTED if all(verdicts) else NOT_SUPPORTED
    return _f(
        q,
        status,
        "; ".join(parts),
        f"loss shares closer to token shares than to example shares, by more than {thr}",
        nums,
    )


# findings that read the cells' measurements (q_confounded reads only the settings)
RESTS_ON_CELLS = {
    q_scale_vs_weighting,
    q_scale_cancels,
    q_accuracy_hides_gap,
    q_early_or_late,
    q_tokcc_narrow,
    q_token_dominance,
}


def qualify_by_cell_sanity(finding: dict, sanity: pd.DataFrame) -> dict:
    """A finding measured on cells that fail the cell sanity check is about broken models: it
    becomes `cannot tell`, keeping what it would have said and naming the failing cells."""
    bad = sanity[sanity.passed.eq(False)] if not sanity.empty else sanity
    if bad.empty or finding["status"] == CANNOT_TELL:
        return finding
    names = ", ".join(bad.cell_id)
    return {
        **finding,
        "status": CANNOT_TELL,
        "computed_status": finding["status"],
        "evidence": (
            f"rests on {len(bad)} of {len(sanity)} cells that fail the cell sanity check ({names}); "
            f"on those cells it would read '{finding['status']}': "
        )
        + finding["evidence"],
    }


def compute_findings(t: dict, thresholds: dict) -> list[dict]:
    nz, one = thresholds["near_zero_delta"], thresholds["base_relative_near_one"]
    sanity = t.get("cell_sanity", pd.DataFrame())
    out = []
    for q, args in (
        (q_scale_vs_weighting, (nz,)),
        (q_scale_cancels, (nz, one)),
        (q_accuracy_hides_gap, (nz,)),
        (q_early_or_late, (nz,)),
        (q_tokcc_narrow, (one, nz)),
        (q_confounded, ()),
        (q_token_dominance, (nz,)),
    ):
        f = q(t, *args)
        out.append(qualify_by_cell_sanity(f, sanity) if q in RESTS_ON_CELLS else f)
    return out
