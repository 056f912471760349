"""The cell sanity check: a collection whose cells collapse is named as such in every part of
the report (positive and negative controls on hand-made collections)."""

import math

import pandas as pd
import yaml

import aggregate_helpers as H
from latentstrat.aggregate.collection import aggregate_collection
from latentstrat.cells import expand_cells
from latentstrat.report import build_report


def quality(acc=0.97, match=0.98):
    """An entangle quality.json with every task passing at the given values."""

    def check(v, thr, direction):
        return {"value": v, "threshold": thr, "direction": direction, "passed": True}

    tasks = {
        t: {
            "n": 100,
            "n_matched": 98,
            "passed": True,
            "checks": {
                "answer_accuracy": check(acc, 0.9, "min"),
                "strategy_match_rate": check(match, 0.85, "min"),
                "strategy_tv": check(0.05, 0.15, "max"),
            },
        }
        for t in H.TASKS
    }
    return {"passed": True, "temperature": 1.0, "samples_per_task": 100, "tasks": tasks}


def write_broken(cfg, root, broken: set):
    """The helper collection, with the cells in `broken` collapsed: 5% answer accuracy, no
    generation following a strategy (router probes NA), base-relative 96 at step 0."""
    mp, hp = H.write_collection(cfg, root)
    for c in expand_cells(cfg):
        if c.cell_id not in broken:
            continue
        row = pd.read_parquet(mp[c.cell_id]).iloc[0].to_dict()
        row.update(
            final_answer_accuracy=0.05,
            strategy_match_rate=0.03,
            within_task_router_probe=math.nan,
            within_task_router_probe_tasks=0,
            matched_router_score=math.nan,
            posterior_router_probe_gap=math.nan,
            base_relative_reconstruction=28.0,
            token_base_relative_reconstruction=28.0,
        )
        pd.DataFrame([row]).to_parquet(mp[c.cell_id])
        h = pd.read_parquet(hp[c.cell_id])
        h.loc[(h.metric == "base_relative_reconstruction") & (h.step == 0), "value"] = 96.4
        h.to_parquet(hp[c.cell_id])
    return mp, hp


def report(tmp_path, monkeypatch, broken_ids, q, figures=False):
    cfg = H.make_cfg(monkeypatch)
    cells = [c.cell_id for c in expand_cells(cfg)]
    broken = {cells[i] for i in broken_ids}
    mp, hp = write_broken(cfg, tmp_path / "cells", broken)
    (tmp_path / "quality.json").write_text(__import__("json").dumps(q))
    aggregate_collection(cfg, mp, hp, tmp_path / "agg", quality_path=tmp_path / "quality.json")
    build_report(tmp_path / "agg", tmp_path / "rep", {"entangle_quality": q}, figures=figures)
    brief = yaml.safe_load((tmp_path / "rep" / "brief.yaml").read_text())
    return (
        cells,
        broken,
        brief,
        (tmp_path / "rep" / "results.md").read_text(),
        (tmp_path / "rep" / "analysis.md").read_text(),
    )


def test_collapsed_cells_fail_and_are_named_everywhere(tmp_path, monkeypatch):
    cells, broken, brief, results, analysis = report(tmp_path, monkeypatch, [0, 1], quality(), figures=True)
    assert brief["cell_checks_passed"] is False
    assert {f["cell_id"] for f in brief["failing_cells"]} == broken
    why = next(f["why"] for f in brief["failing_cells"])
    assert "answer accuracy 0.05 < 0.9 x entangled 0.97" in why
    assert (
        "step-0 base-relative reconstruction 96.4" in why and "final per-token base-relative reconstruction 28" in why
    )
    # results.md opens with the check, naming every failing cell
    sections = [line for line in results.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Cell Sanity Check"
    head = results.split("## Entangled Model Quality Check")[0]
    assert all(f"`{c}`" in head for c in broken) and f"{len(broken)} of {len(cells)} cells fail" in head
    # marked in the tables (the top rows and the common cells carry the cell_check column)
    agg = tmp_path / "agg"
    common = pd.read_parquet(agg / "common_cells.parquet")
    assert set(common.cell_check) == {"FAIL", "ok"}
    assert common.loc[common.primary_cell.isin(broken), "cell_check"].eq("FAIL").all()
    fair = pd.read_parquet(agg / "fairness.parquet").set_index("claim")
    assert fair.loc["cells are working models (cell sanity)", "status"] == "not supported"
    # findings measured on the cells cannot tell; the settings-only one (confounding) still answers
    statuses = brief["findings"]
    assert (
        statuses["Are the comparisons with a mean arm confounded by schedule (or other setting) differences?"]
        != "cannot tell"
    )
    assert sum(s == "cannot tell" for s in statuses.values()) >= 5
    assert "fail the cell sanity check" in analysis
    # no empty number in a sentence
    assert "(mean ," not in analysis and "range  to" not in analysis


def test_healthy_collection_passes(tmp_path, monkeypatch):
    cells, broken, brief, results, analysis = report(tmp_path, monkeypatch, [], quality())
    assert brief["cell_checks_passed"] is True and brief["failing_cells"] == []
    assert f"All {len(cells)} cells pass." in results
    assert "fail the cell sanity check" not in analysis


def test_a_weak_entangled_model_lowers_the_bar_but_a_cell_below_it_still_fails(tmp_path, monkeypatch):
    # the yardstick is the entangled model: 0.999 accuracy passes against 0.5, 0.05 does not
    cells, broken, brief, _, _ = report(tmp_path, monkeypatch, [1], quality(acc=0.5, match=0.5))
    assert [f["cell_id"] for f in brief["failing_cells"]] == [cells[1]]


def test_without_an_entangled_model_its_two_checks_do_not_apply_and_the_rest_decide(tmp_path, monkeypatch):
    """`entangle.mode: skip` has no entangled model: answer accuracy and strategy match have no
    yardstick (named), the other checks still run and decide; a cell missing an input of one of
    them is not checked, so it does not pass (negative control)."""
    cfg = H.make_cfg(monkeypatch)
    mp, hp = H.write_collection(cfg, tmp_path / "cells")
    aggregate_collection(cfg, mp, hp, tmp_path / "agg")
    s = pd.read_parquet(tmp_path / "agg" / "cell_sanity.parquet")
    assert s.passed.eq(True).all() and s.failures.str.contains("no yardstick for answer accuracy").all()
    one = sorted(mp)[0]
    row = pd.read_parquet(mp[one]).drop(columns=["token_base_relative_reconstruction"])
    row.to_parquet(mp[one])
    aggregate_collection(cfg, mp, hp, tmp_path / "agg2")
    s = pd.read_parquet(tmp_path / "agg2" / "cell_sanity.parquet").set_index("cell_id")
    assert pd.isna(s.loc[one, "passed"]) and "not checked: final per-token" in s.loc[one, "failures"]
    assert s.drop(index=one).passed.eq(True).all()


def test_a_collapsed_cell_ranks_below_an_informative_one_and_is_flagged(tmp_path, monkeypatch):
    """Raw probe accuracy would rank the collapsed cell first (0.98 against 0.85); router
    information (0 for a collapsed mix: nothing for z to tell) ranks the informative one first."""
    cfg = H.make_cfg(monkeypatch)
    mp, hp = H.write_collection(cfg, tmp_path / "cells")
    primary = [c.cell_id for c in expand_cells(cfg) if c.role == "primary"]
    collapsed, informative = primary[0], primary[1]
    for cid, acc, chance, tv, info in ((collapsed, 0.98, 0.98, 0.48, 0.0), (informative, 0.85, 0.5, 0.02, 0.6)):
        row = pd.read_parquet(mp[cid]).iloc[0].to_dict()
        row.update(
            within_task_router_probe=acc,
            within_task_router_probe_chance=chance,
            within_task_router_probe_corrected=(acc - chance) / (1 - chance),
            matched_router_score=acc,
            router_information=info,
            followed_strategy_tv_max=tv,
        )
        pd.DataFrame([row]).to_parquet(mp[cid])
    (tmp_path / "q.json").write_text(__import__("json").dumps(quality()))
    t = aggregate_collection(cfg, mp, hp, tmp_path / "agg", quality_path=tmp_path / "q.json")
    top = t["top_rows"]
    assert top.cell_id.iloc[0] == informative and top.cell_id.iloc[-1] != informative
    assert {
        "within_task_router_probe_chance",
        "within_task_router_probe_shuffled",
        "within_task_router_probe_corrected",
    } <= set(top.columns)
    by_raw = t["summary"].sort_values("matched_router_score", ascending=False).cell_id.iloc[0]
    assert by_raw == collapsed  # the control: raw accuracy gets it wrong
    s = t["cell_sanity"].set_index("cell_id")
    assert bool(s.loc[collapsed, "collapsed"]) is True
    assert bool(s.loc[informative, "collapsed"]) is False
    d = t["metric_distributions"].set_index("metric")
    assert {
        "within_task_router_probe_chance",
        "within_task_router_probe_shuffled",
        "within_task_router_probe_corrected",
    } <= set(d.index)


def test_a_collapsed_task_is_a_collapse_not_a_failed_probe():
    """An empty cell whose generations follow one strategy on one of 6 tasks (its within-task
    router probe has one class there) passes, as does one that collapses on every task: a
    collapse is a finding, counted from the probe table's rows (status na, fewer than 2 classes),
    not a check (the probe stage raises on features it cannot fit, so no other na exists)."""
    from latentstrat.aggregate.sanity import cell_sanity
    from latentstrat.cell.tabulate import _probe_summary

    probes = pd.DataFrame(
        {
            "probe": ["within_task_router"] * 6,
            "task": [f"t{i}" for i in range(6)],
            "status": ["ok"] * 4 + ["na", "ok"],
            "n_classes": [2, 2, 3, 2, 1, 2],
            "accuracy": [0.7, 0.8, 0.6, 0.7, math.nan, 0.6],
            "chance": [0.5] * 6,
            "shuffled_accuracy": [0.5] * 6,
            "corrected": [0.4] * 6,
        }
    )
    s = _probe_summary(probes, "within_task_router")
    assert s["within_task_router_probe_tasks"] == 5 and s["within_task_router_probe_collapsed_tasks"] == 1
    thr = {
        "sanity_min_answer_ratio": 0.9,
        "sanity_min_strategy_match_ratio": 0.9,
        "sanity_step0_tolerance": 0.02,
        "sanity_max_base_relative": 1.5,
        "collapse_tv": 0.5,
    }
    entangled = {"answer_accuracy": 0.978, "strategy_match_rate": 0.97, "n_tasks": 6}

    def sanity(probe_tasks, collapsed):
        row = {
            "cell_id": "c",
            "arm": "matched_mean",
            "reconstruction_family": "dist_tokcc_0.05_0.95",
            "beta": 0.1,
            "final_answer_accuracy": 0.985,
            "strategy_match_rate": 0.98,
            "token_base_relative_reconstruction": 0.999,
            "within_task_router_probe_tasks": probe_tasks,
            "within_task_router_probe_collapsed_tasks": collapsed,
            "n_tasks": 6,
            "followed_strategy_tv_max": 0.6,
        }
        hist = pd.DataFrame({"cell_id": ["c"], "step": [0], "metric": ["base_relative_reconstruction"], "value": [1.0]})
        return cell_sanity(pd.DataFrame([row]), hist, entangled, thr).iloc[0]

    ok = sanity(5, 1)
    assert ok.passed == True and ok.router_probe_collapsed_tasks == 1 and ok.collapsed  # noqa: E712
    every = sanity(0, 6)  # every task follows one strategy: nothing to probe, nothing failed
    assert every.passed == True  # noqa: E712
