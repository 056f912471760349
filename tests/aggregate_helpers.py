"""Hand-made collection for aggregate/report tests: config, per-cell metrics and histories on disk."""

import pandas as pd

import latentstrat.tasks as tasks_mod
from latentstrat.cells import CELL_KEYS, beta_label, expand_cells
from latentstrat.config import check_config
from latentstrat.families import family_label
from latentstrat.metrics import METRICS, derive

TASKS = ["short_task", "long_task"]
# matched router score by aggregation (strategy_match_rate = 1)
ROUTER = {"sum": 0.5, "mean": 0.6, "sum_scaled": 0.55}
# router information (the primary endpoint) by aggregation
INFORMATION = {"sum": 0.3, "mean": 0.4, "sum_scaled": 0.35}
SCALE = {"sum": 40.0, "mean": 1.0, "sum_scaled": 1.0}


def make_cfg(monkeypatch, seeds=None, lin100=True):
    for t in TASKS:
        monkeypatch.setitem(tasks_mod.TASKS, t, object())
    arms = [
        {"name": "mean_matched", "settings": {"token_aggregation": "mean"}},
        {"name": "sum_scaled", "settings": {"token_aggregation": "sum_scaled"}},
    ]
    if lin100:
        arms.append(
            {
                "name": "mean_lin100",
                "settings": {"token_aggregation": "mean", "beta_schedule": "lin100"},
                "grid": {"beta": [0.1]},
            }
        )
    raw = {
        "collection": "toy",
        "base": "toy-base",
        "data": {"tasks": TASKS},
        "cell": {"token_aggregation": "sum"},
        "grid": {"reconstruction_family": ["raw", "dist_norm"], "beta": [0.1, 1]},
        "primary_arm": "sum",
        "comparison_arms": arms,
    }
    if seeds:
        raw["seeds"] = seeds
    return check_config(raw)


def metrics_row(cell, seed_offset=0.0):
    s = cell.settings
    agg = s["token_aggregation"]
    base = {
        "router_information": INFORMATION[agg] + seed_offset,
        "active_units": 3,
        "within_task_router_probe": ROUTER[agg] + seed_offset,
        "strategy_match_rate": 1.0,
        "global_router_probe": 0.2,
        "posterior_probe": 0.8,
        "final_answer_accuracy": 0.999,
        "reconstruction_loss": SCALE[agg] * 1.0,
        "base_relative_reconstruction": 1.0,
        "token_base_relative_reconstruction": 1.0,
        "tokcc_reconstruction_loss": 1.02,
        "kl_prior_loss": 2.0 * s["beta"],
        "active_reconstruction_objective": 1.0,
    }
    row = {
        "cell_id": cell.cell_id,
        "arm": cell.arm,
        "role": cell.role,
        **{k: s[k] for k in CELL_KEYS},
        "family_label": family_label(s["reconstruction_family"]),
        "beta_label": beta_label(s["beta"]),
        **derive(base),
    }
    for p in ("within_task_router_probe", "posterior_probe", "global_router_probe"):
        row[f"{p}_chance"], row[f"{p}_shuffled"] = 0.5, 0.5
        row[f"{p}_tasks"] = 1 if p == "global_router_probe" else len(TASKS)
    row["n_test"], row["n_tasks"] = 100, len(TASKS)
    assert set(METRICS) <= set(row)
    return row


def history(cell, steps=(0, 10, 20)):
    agg = cell.settings["token_aggregation"]
    rows = []
    for st in steps:
        router = 0.3 + (0.4 if st == 10 else 0.2 if st == 20 else 0.0)  # learn then collapse
        for m, v in {
            "scored_matched_router_score": router,
            "scored_router_probe": router,
            "posterior_probe": 0.8,
            "base_relative_reconstruction": 1.0 if st == 0 else 0.98,
            "kl_prior_loss": 100.0 / (1 + st),
            "active_reconstruction_objective": 1.0,
            "kl_over_active_reconstruction": 100.0 / (1 + st),
        }.items():
            rows.append({"cell_id": cell.cell_id, "step": st, "task": "all", "metric": m, "value": v})
        ex = {"short_task": 0.5, "long_task": 0.5}
        tok = {"short_task": 0.25, "long_task": 0.75}
        loss = ex if agg == "mean" else tok
        for t in TASKS:
            for m, v in {
                "example_share": ex[t],
                "token_share": tok[t],
                "loss_share": loss[t],
                "grad_norm_share": loss[t],
                "scored_matched_router_score": router + (0.1 if t == "long_task" else 0.0),
            }.items():
                rows.append({"cell_id": cell.cell_id, "step": st, "task": t, "metric": m, "value": v})
    return pd.DataFrame(rows)


def write_collection(cfg, root, skip=(), with_history=True):
    mp, hp = {}, {}
    for i, c in enumerate(expand_cells(cfg)):
        d = root / c.cell_id
        d.mkdir(parents=True)
        mp[c.cell_id], hp[c.cell_id] = d / "row.parquet", d / "history.parquet"
        if c.cell_id in skip:
            continue
        off = 0.01 * (c.settings["seed"] % 3)
        pd.DataFrame([metrics_row(c, off)]).to_parquet(mp[c.cell_id])
        if with_history:
            history(c).to_parquet(hp[c.cell_id])
    return mp, hp


def cell_settings(cid="c", arm="a", aggregation="sum") -> dict:
    """A cell's json (cells.Cell.to_json) for metrics-row tests: raw at beta 0.1, zdim 16."""
    return {
        "cell_id": cid,
        "arm": arm,
        "role": "primary",
        "token_aggregation": aggregation,
        "reconstruction_family": "raw",
        "beta": 0.1,
        "beta_schedule": "constant",
        "init": "entangled",
        "adaptation": "lora",
        "latent_dim": 16,
        "z_slots": 1,
        "posterior_variance_weight": 0.0,
        "router_marginal_kl_weight": 0.0,
        "seed": 1,
    }
