"""results.md (observational) and analysis.md (interpretive) from the aggregate tables."""

from __future__ import annotations

import pandas as pd

from latentstrat.aggregate.columns import CELL_CHECK_COL, FAMILY_COL
from latentstrat.metrics import ENDPOINT, M, label
from latentstrat.report.decomposition import decomposition_md
from latentstrat.report.headline import empty_groups_md, headline_md, randomization_md, states_md
from latentstrat.report.html import figure_caption
from latentstrat.report.multiplicity import EXPLORATORY, multiplicity_md
from latentstrat.report.split import split_md
from latentstrat.report.tables import fmt, md_table, primary_arms

ID = [FAMILY_COL, "beta_label"]


def _primary_arm(t) -> str:
    return ", ".join(primary_arms(t)) or "primary"


def entangle_quality_md(quality: dict | None) -> list[str]:
    """The entangled model's temperature-1 checks (entangle/quality.json): is p(y|x) a real
    multi-strategy model? Every cell starts from it, so a failed check qualifies every row."""
    out = ["## Entangled Model Quality Check\n"]
    if not quality:
        return out + ["Not recorded for this report (the entangle stage's quality.json was not read).\n"]
    if quality.get("mode") == "skip":
        return out + [
            "The entangle stage was skipped (`entangle.mode: skip`): no entangled model was trained or checked.\n"
        ]
    op = {"min": ">=", "max": "<="}

    def shown(v: dict) -> str:
        return f"{fmt(v['value'])} ({'ok' if v['passed'] else 'FAIL'}, {op[v['direction']]} {fmt(v['threshold'])})"

    by_task = {t: quality["tasks"][t]["checks"] for t in sorted(quality["tasks"])}
    checks = sorted({c for v in by_task.values() for c in v})
    wide = pd.DataFrame(
        [{"task": t, **{c: shown(v) for c, v in cs.items()}} for t, cs in by_task.items()], columns=["task", *checks]
    )
    failed = [f"{t}.{c}" for t, cs in by_task.items() for c, v in sorted(cs.items()) if not v["passed"]]
    verdict = (
        "Every check passed."
        if quality.get("passed")
        else f"**Failed: {', '.join(failed)}.** Every cell starts from this model; read its rows with that in mind."
    )
    n = quality.get("samples_per_task")
    return out + [
        f"Samples at temperature {quality.get('temperature', 1.0)}, up to {n} validation inputs per task. {verdict}\n",
        md_table(wide),
    ]


def cell_sanity_md(t: dict, thr: dict) -> list[str]:
    """Is every cell a working model of the tasks? Failing cells are named with the reason, and
    marked `FAIL` in the `cell_check` column of every table below."""
    s = t.get("cell_sanity", pd.DataFrame())
    out = ["## Cell Sanity Check\n"]
    if s.empty:
        return out + ["NA: no complete cell to check.\n"]
    rule = (
        f"A cell passes when its final answer accuracy and strategy-match rate are at least "
        f"{thr['sanity_min_answer_ratio']} and {thr['sanity_min_strategy_match_ratio']} x the entangled model's "
        f"(its quality check, mean over tasks), its step-0 base-relative reconstruction is 1 +- "
        f"{thr['sanity_step0_tolerance']} (it starts as the entangled model), its final per-token base-relative "
        f"reconstruction (the same weighting in both arms) is at most {thr['sanity_max_base_relative']} (config "
        "`report.sanity_*`). A cell passes only when every check ran: a verdict that rests on a cell that fails "
        "or could not be checked reads `cannot tell`."
    )
    bad = s[s.passed.eq(False)]
    unchecked = s[s.passed.isna()]
    if len(bad):
        verdict = (
            f"**{len(bad)} of {len(s)} cells fail.** They are marked `FAIL` in the `{CELL_CHECK_COL}` column of "
            "every table, and findings that rest on them say so."
        )
    elif len(unchecked):
        verdict = f"No cell fails, but {len(unchecked)} of {len(s)} could not be fully checked (see `failures`)."
    else:
        verdict = f"All {len(s)} cells pass."
    collapsed = s[s.collapsed.eq(True)] if "collapsed" in s.columns else s.iloc[:0]
    if len(collapsed):
        verdict += (
            f" {len(collapsed)} cell(s) collapsed onto fewer strategies than the data has (followed-strategy "
            f"total variation >= {thr['collapse_tv']} on some task): "
            + ", ".join(f"`{c}`" for c in collapsed.cell_id)
            + "; their probe accuracies sit near their (high) chance level by construction; router information, "
            "0 for a collapsed mix, is the number to read."
        )
    out += [rule + " " + verdict + "\n"]
    if len(bad):
        out += ["Failing cells:\n"] + [f"- `{r.cell_id}`: {r.failures}" for r in bad.itertuples()] + [""]
    cols = [c for c in s.columns if c not in ("cell_id", "failures")]
    shown = s.assign(
        passed=s.passed.map({True: "ok", False: "FAIL"}).fillna("NA"),
        collapsed=s.collapsed.map({True: "yes", False: "no"}).fillna("NA"),
    )
    return out + [md_table(shown, cols)]


def results_md(t: dict, meta: dict, made, skipped, thr: dict) -> str:
    title = meta.get("title") or meta.get("collection", "collection")
    metric = meta.get("primary_metric") or ENDPOINT
    out = [f"# {title}: Results\n", "> This file is observational. Interpretive claims belong in analysis.md.\n"]
    if meta.get("description"):
        out.append(meta["description"].strip() + "\n")
    out += cell_sanity_md(t, thr)
    out += states_md(t, thr)
    out += entangle_quality_md(meta.get("entangle_quality"))
    out += _state_md(t)
    out += _aggregate_metrics_md(t, meta, metric)
    out += _common_cells_md(t)
    out += _dynamics_md(t)
    out += _dominance_md(t)
    out += [
        "## Top And Bottom Rows\n",
        f"### Top Rows By {label(metric).title()}\n",
        md_table(t["top_rows"], [c for c in t["top_rows"].columns if c != "cell_id"]),
        f"### Bottom Rows By {label(metric).title()}\n",
        md_table(t["bottom_rows"], [c for c in t["bottom_rows"].columns if c != "cell_id"]),
    ]
    out.append("## Figures\n")
    for name, title in made:
        out.append(f"### {title}\n\n![{title}](figures/{name}.png)\n\n*{figure_caption(t, name)}*\n")
    if skipped:
        out += (
            ["Figures skipped because their data is absent:\n"]
            + [f"- {title} (`{name}.png`)" for name, title in skipped]
            + [""]
        )
    out += [
        "## Artifacts\n",
        "- Aggregate tables: `" + str(meta.get("aggregate_dir", "aggregate")) + "/*.parquet` and `*.csv`",
        "- Interpretation: `analysis.md`; brief: `brief.yaml`; findings: `findings.json`; figures: `figures/`\n",
    ]
    return "\n".join(out)


def _state_md(t: dict) -> list[str]:
    """Collection metadata, what a cell cost, and which cells are complete."""
    out = []
    st, counts = t["collection_state"], t["collection_state_counts"]
    n_ok = int((st.status == "complete").sum()) if not st.empty else 0
    meta_t = t.get("collection_metadata", pd.DataFrame())
    if not meta_t.empty:
        out += ["## Collection Metadata\n", md_table(meta_t)]
    costs = t.get("cell_costs", pd.DataFrame())
    if not costs.empty:
        parts = ", ".join(
            f"{c[:-2]} {fmt(round(costs[c].mean(), 1))} s" for c in costs.columns if c.endswith("_s") and c != "total_s"
        )
        out.append(
            f"What a cell cost ({len(costs)} cells run by this collection, Snakemake benchmarks, seconds of one "
            f"job slot, mean): {parts}; {fmt(round(costs.total_s.mean(), 1))} s per cell in all.\n"
        )
    out += [
        "## Collection State\n",
        f"The collection has {len(st)} expected cells: {n_ok} have final metrics and {len(st) - n_ok} remain without "
        "final metrics.\n",
        md_table(counts),
    ]
    inc = st[st.status != "complete"] if not st.empty else st
    if len(inc):
        out += [
            "Incomplete cells (excluded from every quantitative summary below):\n",
            md_table(inc, ["cell_id", "arm", "reason"]),
        ]
    return out


def _aggregate_metrics_md(t: dict, meta: dict, metric: str) -> list[str]:
    """The best primary row, seed means and the metric distributions."""
    out = ["## Aggregate Metrics\n"]
    p = t["top_rows"]
    if meta.get("ranking_note"):
        out.append(f"Note: {meta['ranking_note']}.\n")
    if not p.empty:
        b = p.iloc[0]
        extra = ", ".join(
            f"{label(m)} {fmt(b[m])}"
            for m in (M.matched_router_score, M.final_answer_accuracy)
            if m != metric and m in b.index and pd.notna(b[m])
        )
        probe = ""
        if M.within_task_router_probe in b.index and pd.notna(b[M.within_task_router_probe]):
            probe = (
                f", within-task router probe {fmt(b[M.within_task_router_probe])} (chance "
                f"{fmt(b.get('within_task_router_probe_chance'))}, shuffled labels "
                f"{fmt(b.get('within_task_router_probe_shuffled'))}, chance-corrected "
                f"{fmt(b.get('within_task_router_probe_corrected'))})"
            )
        out.append(
            f"Primary arm: {_primary_arm(t)}. The best row by {label(metric)} is {b[FAMILY_COL]} at {b.beta_label} "
            "with "
            f"{label(metric)} {fmt(b[metric])}" + (f", {extra}" if extra else "") + probe + ".\n"
        )
    else:
        out.append(
            f"Primary arm: {_primary_arm(t)}. No complete primary row has a {label(metric)} (NA: its probes had too "
            "few eligible examples, see the per-cell `*_tasks` counts), so there is no best row.\n"
        )
    by = t["summary_by_setting"]
    if not by.empty and by.get("n_seeds", pd.Series([1])).max() > 1:
        cols = ["arm", "family_label", "beta_label", "n_seeds"] + [
            c
            for m in (M.matched_router_score, M.final_answer_accuracy, M.active_reconstruction_objective)
            for c in (m, f"{m}_std")
        ]
        out += ["Mean and std (sample) across seeds:\n", md_table(by, cols)]
    out += [
        "## Metric Distributions\n",
        "Over the complete primary-arm settings (population std).\n",
        md_table(t["metric_distributions"], ["label", "n", "min", "mean", "median", "max", "std"]),
    ]
    return out


def _common_cells_md(t: dict) -> list[str]:
    """The common cells per comparison arm, the unmatched rows, the scale and diagnostic tables."""
    c = t["common_cells"]
    out = ["## Common Cells\n"]
    if c.empty:
        out.append("No common cells with a comparison arm.\n")
    for arm, g in c.groupby("comparison_arm", sort=False) if not c.empty else []:
        g = g.dropna(axis=1, how="all")
        out += [
            f"### Comparison arm `{arm}`\n",
            f"{len(g)} common cells; deltas are primary minus comparison arm.\n",
            md_table(g, [col for col in g.columns if col not in ("comparison_arm", "primary_cell", "comparison_cell")]),
        ]
    u = t["unmatched_rows"]
    if not u.empty:
        out += [
            "Primary rows without a matching comparison row (left out of the contrast):\n",
            md_table(u, ["comparison_arm", *ID, "reason"]),
        ]
    out += [
        "## Inferred Z-Free Reference Scale\n",
        f"Inferred as {M.reconstruction_loss} / {M.base_relative_reconstruction}.\n",
        md_table(t["reference_scale"]),
    ]
    out += [
        "## Derived Local Diagnostic Table\n",
        md_table(t["derived_diagnostics"], [c for c in t["derived_diagnostics"].columns if c != "cell_id"]),
    ]
    return out


def _dynamics_md(t: dict) -> list[str]:
    """The validation dynamics and the best per-task validation checkpoints."""
    out = ["## Validation Dynamics\n"]
    d = t["dynamics_summary"]
    if d.empty:
        out.append("No training histories are available.\n")
    else:
        first = ", ".join(sorted(d.first_checkpoint.unique()))
        out.append(f"Validation metrics, not final test metrics. First checkpoint: {first}.\n")
        cols = [*ID, "first_checkpoint", "first_global_step", "final_global_step"] + [
            c
            for c in d.columns
            if c.startswith(("first_", "min_", "final_", "max_"))
            and c not in ("first_checkpoint", "first_global_step", "final_global_step")
            and ("base_relative" in c or "kl_prior" in c or "matched_router" in c)
        ]
        out += ["### Dynamics Summary Table\n", md_table(d, cols + [CELL_CHECK_COL])]
    pt = t["per_task_checkpoints"]
    if not pt.empty:
        out += [
            "### Top Per-Task Validation Router Checkpoints\n",
            md_table(
                pt,
                [
                    "task_name",
                    *ID,
                    "final_val_scored_matched_router_score",
                    "max_val_scored_matched_router_score",
                    "step_of_max",
                    "final_val_decoded_answer_accuracy",
                    CELL_CHECK_COL,
                ],
            ),
        ]
    return out


def _dominance_md(t: dict) -> list[str]:
    """Token-count dominance and gradient clipping per aggregation."""
    dom = t["token_dominance"]
    out = ["## Token-Count Dominance\n"]
    if dom.empty:
        out.append("No per-task share metrics in the histories.\n")
    else:
        out += [
            "Per task and aggregation (mean over cells), shares of examples, supervised tokens, summed loss and "
            "gradient "
            "norm (on equal-size validation batches per task), and `batch_task_share`: the share of the task's rows "
            "in the "
            "training batches (task-mixed batches follow the training mixture).\n",
            md_table(dom),
            "Share sums per aggregation and checkpoint:\n",
            md_table(t["token_dominance_sums"]),
        ]
    clip = t.get("gradient_clipping", pd.DataFrame())
    if not clip.empty:
        out += [
            "Gradient clipping per aggregation (`train.grad_clip`): the threshold, the mean pre-clip gradient norm "
            "and the "
            "fraction of steps it clipped. A threshold that clips most steps of one aggregation and none of the other "
            "changes that aggregation's effective step size.\n",
            md_table(clip),
        ]
    return out


def sign_sentences(t: dict, meta: dict) -> list[str]:
    """Per comparison arm and compared metric: the mean common-cell delta, its 95% interval (with
    training noise when the collection measured it), the verdict and the per-cell verdicts."""
    c, a = t["common_cells"], t.get("arm_contrasts", pd.DataFrame())
    out = []
    for arm, g in c.groupby("comparison_arm", sort=False) if not c.empty else []:
        rows = a[a.comparison_arm == arm] if not a.empty else a
        for r in rows.itertuples():
            m = r.metric
            if r.n_cells == 0:
                out.append(
                    f"Against `{arm}`, the {len(g)} common-cell {label(m)} deltas are NA: no common cell has a value "
                    "on both sides (see the Cell Sanity Check in results.md).\n"
                )
                continue
            na = f"; {len(g) - r.n_cells} more are NA" if r.n_cells < len(g) else ""
            why = f" ({r.why})" if r.why else ""
            noise = (
                f"test inputs and training noise (the paired delta's SD per replicate seed "
                f"{fmt(r.training_noise_sd)}, from {r.training_noise_settings} replicated settings; "
                f"{fmt(r.training_noise_df)} df; strata: {r.training_noise_strata or 'none'})"
                if r.training_noise_in_interval
                else "test inputs only"
            )
            flip = getattr(r, "sign_flip_p", None)
            flip_text = (
                f" Sign-flip test over the settings' deltas (a diagnostic): p = {fmt(flip)}." if pd.notna(flip) else ""
            )
            out.append(
                f"Against `{arm}`, the mean common-cell {label(m)} delta (primary - {arm}) over {r.n_cells} cells is "
                f"{fmt(r.mean_delta)} (95% interval {fmt(r.ci_low)} to {fmt(r.ci_high)}, {noise}): "
                f"**{r.verdict}**{why}. Detectable (80% power, 5% two-sided): {fmt(r.detectable_delta)}. Per cell: "
                f"{r.cells_negative} negative, {r.cells_positive} positive, {r.cells_cannot_tell} cannot tell{na}."
                f"{flip_text}{clip_sentence(t) if m == meta.get('primary_metric') else ''}\n"
            )
    return out


def followup_sentences(plan: dict) -> list[str]:
    """What more seeds would settle (the aggregate's follow-up plan, written as followup.yaml)."""
    from latentstrat.aggregate.power import cost_text, need_text

    if not plan.get("needed"):
        return []
    out = ["## Follow-Up\n"]
    out += [f"- {need_text(n)}." for n in plan["needs"]]
    out.append(
        f"\n`followup.yaml` (beside this file) runs {len(plan['seeds'])} seeds per setting and adds "
        f"{plan['cells_added']} cells: {cost_text(plan)}.\n"
    )
    return out


def clip_sentence(t: dict) -> str:
    """How often gradient clipping bound in each aggregation compared (the report's
    gradient_clipping table): a threshold that binds for one arm only changes its step size."""
    clip = t.get("gradient_clipping", pd.DataFrame())
    if clip.empty:
        return ""
    parts = [f"{r.token_aggregation} {100 * r.clipped_fraction:.0f}%" for r in clip.itertuples()]
    return " Training steps whose gradient was clipped: " + ", ".join(parts) + " (results.md, Token-Count Dominance)."


def analysis_md(t: dict, meta: dict, findings: list[dict], thresholds: dict, head: dict) -> str:
    title = meta.get("title") or meta.get("collection", "collection")
    out = [f"# {title}: Analysis\n"]
    out += headline_md(t, meta, head)
    out += split_md(t, meta.get("primary_metric") or ENDPOINT)  # the declared scale / weighting split
    out += multiplicity_md(head["multiplicity"]) if head.get("multiplicity") else []
    out += randomization_md(head)  # a diagnostic beside the verdict, outside it
    out += decomposition_md(t)  # which part of router_information moved, per arm
    out += empty_groups_md(t, thresholds)
    out += [
        f"## Every Contrast ({EXPLORATORY})\n",
        "Every statement below is computed from the aggregate tables; thresholds: near_zero_delta = "
        f"{thresholds['near_zero_delta']}, "
        f"base_relative_near_one = {thresholds['base_relative_near_one']} (config `report`).\n",
    ]
    out += sign_sentences(t, meta)
    st = t["collection_state"]
    if not st.empty and "token_aggregation" in st.columns and (st.token_aggregation == "sum_scaled").any():
        out.append(
            "`sum_scaled` (sum / n_bar) differs from `sum` only for the `raw` family: the normalized families "
            "divide by a reference scale computed under the same aggregation, which carries the same n_bar, so "
            "their `sum_scaled` cells would repeat the `sum` cells exactly. What `sum_scaled` isolates is the "
            "per-example weighting n_i / n_bar at the scale of `mean`; the scale-versus-weighting question is "
            "answered on `raw` cells only.\n"
        )
    s = t["reference_scale"]
    for _, r in s[s.aggregation_mode.str.contains("_ratio")].iterrows() if not s.empty else []:
        out.append(f"Inferred z-free reference scale ratio {r.aggregation_mode}: {fmt(r['mean'])}x ({r.source}).\n")
    out += followup_sentences(meta.get("followup") or {})
    out += ["## What The Local Data Can Answer\n", md_table(t["data_availability"])]
    out += ["## Fairness Assessment\n", md_table(t["fairness"])]
    out.append("## Diagnostic Questions\n")
    for f in findings:
        out += [
            f"### {f['question']}\n",
            f"**{f['status']}** — {f['evidence']}"
            + (f" (threshold: {f['threshold']})" if f["threshold"] else "")
            + "\n",
        ]
    return "\n".join(out)
