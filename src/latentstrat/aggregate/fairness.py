"""What the collection holds and whether its comparisons are fair: cell counts per arm,
collection metadata (when, with which code, where), the fairness claims (design section 7,
docs/design.md) with the attribution of each comparison arm, and which diagnostics the local
data can answer."""

from __future__ import annotations

import pandas as pd

from latentstrat.aggregate.columns import FAMILY_COL, SHARE_METRICS
from latentstrat.aggregate.contrasts import arm_prefix, differing_keys, pair_key, pair_keys
from latentstrat.cells import CELL_KEYS, format_value
from latentstrat.metrics import M


def collection_state_counts(state: pd.DataFrame) -> pd.DataFrame:
    """Per arm: expected / complete / incomplete counts and the incomplete ids."""
    out = []
    for arm, g in state.groupby("arm", sort=False):
        inc = g[g.status != "complete"]
        out.append(
            {
                "arm": arm,
                "role": g.role.iloc[0],
                "expected": len(g),
                "complete": int((g.status == "complete").sum()),
                "incomplete": len(inc),
                "incomplete_cells": ", ".join(inc.cell_id),
            }
        )
    return pd.DataFrame(out)


def collection_metadata(summary: pd.DataFrame, state: pd.DataFrame, code_now: str | None = None) -> pd.DataFrame:
    """field | value: when the collection's cells were trained (first start, last finish), the
    code versions they record (with counts), hosts and devices, planned vs observed cells, and
    how many cells ran with code other than `code_now` (the working tree's version)."""
    rows = [
        ("planned cells", str(len(state))),
        ("observed cells (with final metrics)", str(int((state.status == "complete").sum())) if len(state) else "0"),
    ]

    def counts(col):
        if col not in summary.columns or summary[col].isna().all():
            return "NA (not recorded)"
        return ", ".join(f"{v} ({n} cells)" for v, n in summary[col].fillna("NA").astype(str).value_counts().items())

    if "train_started_at" in summary.columns and summary.train_started_at.notna().any():
        rows += [
            ("first cell started", str(summary.train_started_at.dropna().min())),
            ("last cell finished", str(summary.train_finished_at.dropna().max())),
        ]
    else:
        rows += [("first cell started", "NA (not recorded)"), ("last cell finished", "NA (not recorded)")]
    rows += [
        ("code versions", counts("train_code_version")),
        ("hosts", counts("train_host")),
        ("CPUs (capability)", cpu_counts(summary)),
        ("machines (pairs)", machine_counts(summary)),
        ("devices", counts("train_device")),
    ]
    if code_now and "train_code_version" in summary.columns:
        other = summary[summary.train_code_version.notna() & (summary.train_code_version != code_now)]
        rows.append(("cells trained with other code than now", f"{len(other)} (now: {code_now})"))
    return pd.DataFrame(rows, columns=["field", "value"])


# what names a machine in the cells' records: its host name, CPU model and capability, the code it
# ran, and the day its stint started (lent machines may share a host name)
MACHINE_KEYS = ("train_host", "train_cpu", "train_cpu_capability", "train_code_hash")
PAIR_KEYS = ("reconstruction_family", "beta", "seed")


def machine_counts(summary: pd.DataFrame) -> str:
    """Each machine the cells trained on, with the pairs (one setting and seed, every arm) and
    cells it ran, e.g. `vm, AMD EPYC (AVX-512 + native bf16), code a3bb973b9b7b, from 2026-12-07:
    11 pairs (25 cells)`; a pair split over machines is counted apart."""
    if any(k not in summary.columns for k in MACHINE_KEYS) or summary.train_cpu.isna().all():
        return "NA (not recorded)"
    s = summary.copy()
    s["_day"] = s.get("train_started_at", pd.Series("", index=s.index)).fillna("").astype(str).str[:10]
    keys = [*MACHINE_KEYS, "_day"]
    s[list(MACHINE_KEYS)] = s[list(MACHINE_KEYS)].fillna("not recorded").astype(str)
    pair_cols = [k for k in PAIR_KEYS if k in s.columns]
    machine_of_pair = s.groupby(pair_cols, dropna=False)[keys].nunique().max(axis=1) if pair_cols else None
    parts, split = [], 0
    for (host, cpu, cap, code, day), g in s.groupby(keys, sort=True):
        pairs = g.groupby(pair_cols, dropna=False).ngroups if pair_cols else 0
        parts.append(
            f"{host}, {cpu} ({cap}), code {code[:12]}, from {day or 'NA'}: {pairs} pair{'s' * (pairs != 1)} "
            f"({len(g)} cell{'s' * (len(g) != 1)})"
        )
    if machine_of_pair is not None:
        split = int((machine_of_pair > 1).sum())
    return "; ".join(parts) + (f"; {split} pair{'s' * (split != 1)} split over machines" if split else "")


def cpu_counts(summary: pd.DataFrame) -> str:
    """The CPUs the cells trained on, each with its capability and the mean training speed there
    (machines of one model name differ by 2.4x on the same cell)."""
    if "train_cpu" not in summary.columns or summary.train_cpu.isna().all():
        return "NA (not recorded)"
    cap = summary.get("train_cpu_capability", pd.Series("capability not recorded", index=summary.index))
    label = summary.train_cpu.fillna("NA").astype(str) + " (" + cap.fillna("capability not recorded").astype(str) + ")"
    speed = summary.get("train_tokens_per_s", pd.Series(float("nan"), index=summary.index)).astype(float)
    parts = []
    for name, g in speed.groupby(label, sort=False):
        rate = f", {g.mean():,.0f} training tokens/s per job" if g.notna().any() else ""
        parts.append(f"{name}: {len(g)} cells{rate}")
    return "; ".join(parts)


def sanity_claim(sanity: pd.DataFrame | None) -> list[dict]:
    """The cell sanity claim (none without a sanity table)."""
    if sanity is None or not len(sanity):
        return []
    bad = sanity[sanity.passed.eq(False)]
    unchecked = sanity[sanity.passed.isna()]
    status = "not supported" if len(bad) else ("partial" if len(unchecked) else "supported")
    ev = f"{len(sanity) - len(bad) - len(unchecked)}/{len(sanity)} complete cells pass the cell sanity check"
    if len(bad):
        ev += "; failing: " + ", ".join(bad.cell_id)
    if len(unchecked):
        ev += f"; {len(unchecked)} not fully checked (no entangled quality check or history)"
    return [{"claim": "cells are working models (cell sanity)", "status": status, "evidence": ev}]


def completeness_claim(state: pd.DataFrame) -> dict:
    pst = state[state.role == "primary"] if "role" in state.columns else state
    n_exp, n_ok = len(pst), int((pst.status == "complete").sum())
    missing = list(pst[pst.status != "complete"].cell_id)
    status = "supported" if n_ok == n_exp and n_exp else ("partial" if n_ok else "not supported")
    ev = f"{n_ok}/{n_exp} primary cells have final metrics" + (f"; missing: {', '.join(missing)}" if missing else "")
    return {"claim": "planned grid completeness", "status": status, "evidence": ev}


def fixed_setting_claim(primary_cells: pd.DataFrame, grid_axes) -> dict:
    """Every cell key outside the grid axes (seed aside) takes one value in the primary arm."""
    fixed, varying = [], []
    for k in CELL_KEYS:
        if k not in primary_cells.columns or k in grid_axes:
            continue
        vals = sorted({format_value(v) for v in primary_cells[k].dropna()})
        (fixed if len(vals) == 1 else varying).append(f"{k}={'/'.join(vals)}")
    status = "supported" if not [v for v in varying if not v.startswith("seed=")] else "not supported"
    return {
        "claim": "fixed-setting coverage",
        "status": status,
        "evidence": "fixed "
        + ", ".join(fixed)
        + (f"; also varying outside the grid: {', '.join(varying)}" if varying else "")
        + f"; grid axes: {', '.join(grid_axes)}",
    }


def comparison_claims(
    primary_rows: pd.DataFrame, comparisons: dict, commons: dict, unmatched: dict, grid_axes
) -> list[dict]:
    """Per comparison arm: common-cell coverage and aggregation-only causal attribution."""
    rows = []
    for arm, comparison in comparisons.items():
        common, un = commons.get(arm), unmatched.get(arm)
        n_c = 0 if common is None else len(common)
        n_p = len(primary_rows)
        status = "supported" if n_c == n_p and n_p else ("partial" if n_c else "not supported")
        ev = f"{n_c} common cells of {n_p} primary rows with {arm}"
        if un is not None and len(un):
            ev += "; no matching row for " + ", ".join(f"{r[FAMILY_COL]} {r['beta_label']}" for _, r in un.iterrows())
        rows.append({"claim": f"common-cell comparison ({arm})", "status": status, "evidence": ev})
        rows.append(
            {
                "claim": f"aggregation-only causal attribution ({arm})",
                **attribution(primary_rows, comparison, common, grid_axes, arm),
            }
        )
    return rows


def seed_claim(primary_cells: pd.DataFrame, primary_rows: pd.DataFrame) -> dict:
    """Seeds per setting: supported with 3 or more everywhere; partial when some settings have two
    or more (replicates: the training noise is measured, every verdict carries it); else not."""
    n_seeds = primary_rows["n_seeds"] if "n_seeds" in primary_rows.columns else pd.Series([1] * len(primary_rows))
    seeds = sorted({format_value(s) for s in primary_cells.get("seed", pd.Series(dtype=float)).dropna()})
    lo = int(n_seeds.min()) if len(n_seeds) else 0
    replicated = int((n_seeds >= 2).sum())
    status = "supported" if lo >= 3 else ("partial" if replicated else "not supported")
    ev = f"{lo} seed(s) per setting at least (seeds: {', '.join(seeds) or 'none'}); 3 or more everywhere needed"
    if replicated and lo < 2:
        ev += f"; {replicated} of {len(n_seeds)} settings replicated (training noise measured from them)"
    return {"claim": "seed replication", "status": status, "evidence": ev}


def fairness_table(
    tables: dict,
    primary_cells: pd.DataFrame,
    primary_rows: pd.DataFrame,
    grid_axes,
    comparisons: dict,
    commons: dict,
    unmatched: dict,
) -> pd.DataFrame:
    """claim | status | evidence, each computed from configs and outputs (design section 7,
    docs/design.md). `tables`: the aggregate tables built so far (the collection state, the
    histories and the cell sanity check are read from it)."""
    history_all, history_task = tables["history_long"], tables["history_per_task_long"]
    rows = [
        *sanity_claim(tables.get("cell_sanity")),
        completeness_claim(tables["collection_state"]),
        fixed_setting_claim(primary_cells, grid_axes),
        *comparison_claims(primary_rows, comparisons, commons, unmatched, grid_axes),
        {"claim": "training-dynamics diagnosis", **dynamics_status(history_all, primary_cells)},
        {"claim": "token-count dominance", **dominance_status(history_task)},
        seed_claim(primary_cells, primary_rows),
    ]
    return pd.DataFrame(rows, columns=["claim", "status", "evidence"])


def attribution(
    primary_rows: pd.DataFrame, comparison: pd.DataFrame, common: pd.DataFrame | None, grid_axes, arm: str
) -> dict:
    """supported when paired cells differ only in token_aggregation; not supported naming the key otherwise."""
    if common is None or common.empty:
        return {"status": "not supported", "evidence": f"no common cells with {arm}"}
    keys = pair_keys(primary_rows, comparison, grid_axes)
    comparison_index = {pair_key(c, keys): c for _, c in comparison.iterrows()}
    diffs, unknown = {}, set()
    for _, p in primary_rows.iterrows():
        c = comparison_index.get(pair_key(p, keys))
        if c is None:
            continue
        d, u = differing_keys(p, c)
        unknown.update(u)
        for k in d:
            diffs.setdefault(k, (set(), set()))
            diffs[k][0].add(format_value(p[k]))
            diffs[k][1].add(format_value(c[k]))
    p_agg, c_agg = arm_prefix(primary_rows, comparison)
    if diffs:
        parts = [
            f"{k}: {p_agg} rows use {'/'.join(sorted(a))}, {arm} rows use {'/'.join(sorted(b))}"
            for k, (a, b) in diffs.items()
        ]
        return {
            "status": "not supported",
            "evidence": "paired cells differ besides token_aggregation in " + "; ".join(parts),
        }
    if unknown:
        return {
            "status": "partial",
            "evidence": f"recorded settings match, but {arm} does not record {', '.join(sorted(unknown))}",
        }
    return {
        "status": "supported",
        "evidence": f"{len(common)} paired cells differ only in token_aggregation ({p_agg} vs {c_agg})",
    }


def dynamics_status(history_all: pd.DataFrame, primary_cells: pd.DataFrame) -> dict:
    ids = set(primary_cells.cell_id)
    h = history_all[history_all.cell_id.isin(ids)] if len(history_all) else history_all
    if h.empty:
        return {"status": "not supported", "evidence": "no training history for primary cells"}
    n_cells = h.cell_id.nunique()
    n_ck = h.groupby("cell_id").step.nunique()
    first = int(h.step.min())
    ev = f"{n_cells}/{len(ids)} primary cells with history, {int(n_ck.min())}-{int(n_ck.max())} validation checkpoints"
    if first != 0:
        return {
            "status": "partial",
            "evidence": ev + f"; earliest checkpoint is step {first}: exact initialization metrics are absent",
        }
    with_init = h[h.step == 0].cell_id.nunique()
    status = "supported" if n_cells == len(ids) and with_init == n_cells else "partial"
    return {"status": status, "evidence": ev + f"; {with_init} with step-0 (initialization) metrics"}


def dominance_status(history_task: pd.DataFrame) -> dict:
    have = sorted(set(history_task.metric) & set(SHARE_METRICS)) if len(history_task) else []
    if not have:
        return {"status": "not supported", "evidence": "no per-task share metrics in the histories"}
    lack = [m for m in SHARE_METRICS if m not in have]
    return {
        "status": "partial" if lack else "supported",
        "evidence": f"per-task {', '.join(have)} for {history_task.cell_id.nunique()} cells"
        + (f"; missing {', '.join(lack)}" if lack else ""),
    }


def _has(df, *cols) -> bool:
    return len(df) > 0 and all(c in df.columns and df[c].notna().any() for c in cols)


def _hist_has(h, metric) -> bool:
    return len(h) > 0 and (h.metric == metric).any()


def _availability_row(diag, ok, source, note_if_missing, partial=False, note="") -> dict:
    return {
        "diagnostic": diag,
        "local_data": "partial" if (ok and partial) else ("yes" if ok else "no"),
        "local_source": source if ok else "",
        "missing_data_note": note if ok else note_if_missing,
    }


def availability_table(
    primary_rows: pd.DataFrame, comparisons: dict, commons: dict, history_all: pd.DataFrame, history_task: pd.DataFrame
) -> pd.DataFrame:
    """diagnostic | local_data (yes/partial/no) | local_source | missing_data_note, from what exists."""
    rows = [
        *_summary_diagnostics(primary_rows, comparisons, commons),
        *_history_diagnostics(history_all, history_task),
        *_seed_diagnostics(primary_rows),
        ("Fairness of the collection", True, "collection config + collection_state", ""),
    ]
    return pd.DataFrame(
        [_availability_row(*r) for r in rows], columns=["diagnostic", "local_data", "local_source", "missing_data_note"]
    )


def _summary_diagnostics(primary_rows: pd.DataFrame, comparisons: dict, commons: dict) -> list[tuple]:
    """The diagnostics read from the cells' summary rows and the comparison arms."""
    comparison_scale = any(_has(c, M.inferred_zfree_reference_scale) for c in comparisons.values())
    n_common = sum(len(c) for c in commons.values() if c is not None)
    return [
        (
            "KL-to-reconstruction trade-off",
            _has(primary_rows, M.kl_prior_loss, M.active_reconstruction_objective),
            "summary",
            f"summary lacks {M.kl_prior_loss} or {M.active_reconstruction_objective}",
        ),
        (
            "KL/reconstruction ratio",
            _has(primary_rows, M.kl_over_active_reconstruction),
            "summary",
            "no KL / active ratio",
        ),
        (
            "Sum scale vs mean scale",
            _has(primary_rows, M.inferred_zfree_reference_scale) and comparison_scale,
            "summary + comparison arm",
            f"no comparison arm with {M.reconstruction_loss} and {M.base_relative_reconstruction}",
        ),
        ("Mean-vs-sum objective scale", n_common > 0, "common_cells", "no common cells with a comparison arm"),
        (
            "Posterior-router gap",
            _has(primary_rows, M.posterior_router_probe_gap),
            "summary",
            "no posterior / router probes",
        ),
    ]


def _history_diagnostics(history_all: pd.DataFrame, history_task: pd.DataFrame) -> list[tuple]:
    """The diagnostics read from the training histories (all tasks, and per task)."""
    first = int(history_all.step.min()) if len(history_all) else None
    dom = dominance_status(history_task)
    first_note = (
        "" if first == 0 else f"earliest validation checkpoint is step {first}; exact initialization metrics are absent"
    )
    return [
        (
            "KL dynamics over training",
            _hist_has(history_all, M.kl_prior_loss),
            "history_long",
            f"no history with {M.kl_prior_loss}",
        ),
        (
            "Reconstruction dynamics",
            _hist_has(history_all, M.base_relative_reconstruction),
            "history_long",
            "no history with base-relative reconstruction",
        ),
        (
            "Initialization / first-eval scale",
            first is not None,
            "history_long",
            "no history",
            first not in (None, 0),
            first_note,
        ),
        (
            "Token-count dominance",
            dom["status"] != "not supported",
            "history_per_task_long",
            "requires per-task example/token/loss/gradient shares in the histories",
            dom["status"] == "partial",
            dom["evidence"] if dom["status"] == "partial" else "",
        ),
    ]


def _seed_diagnostics(primary_rows: pd.DataFrame) -> list[tuple]:
    """Whether the verdicts carry training noise: seeds per setting."""
    seeds_lo = int(primary_rows["n_seeds"].min()) if _has(primary_rows, "n_seeds") else 1
    seeds_hi = int(primary_rows["n_seeds"].max()) if _has(primary_rows, "n_seeds") else 1
    return [
        (
            "Training noise in the verdicts",
            seeds_hi >= 2,
            "summary_by_setting (replicated settings)",
            "no setting with two seeds: every verdict reads cannot tell (add `replicates:` or seeds)",
        ),
        (
            "Seed replication",
            seeds_lo >= 2,
            "summary_by_setting",
            "one seed per setting",
            seeds_lo == 2,
            "2 seeds only" if seeds_lo == 2 else "",
        ),
    ]


def collection_setup(b: dict, lora_cfg: dict, train: dict, data: dict) -> dict:
    """What every cell of the collection ran on, from its config's backbone, lora, train and data
    sections (the report's setup table): the model, the training budget, the tasks and the data
    sizes per task."""
    e, lora = b["embedded"], f"LoRA r {lora_cfg['r']}"
    if b["source"] == "embedded":
        model = f"embedded Qwen2 ({e['num_hidden_layers']} layers, hidden {e['hidden_size']}), {lora}"
    else:
        model = f"{b['name_or_path']} ({b['source']}), {lora}"
    return {
        "model": model,
        "training": f"{train['steps']} steps of {train['batch_size']} examples, lr {train['lr']:g}",
        "tasks": ", ".join(data["tasks"]),
        "data per task": (
            f"{data['train_per_task']:,} train, {data['validation_per_task']:,} validation, "
            f"{data['test_per_task']:,} test"
        ),
    }
