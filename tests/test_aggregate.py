import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from aggregate_helpers import TASKS, make_cfg, write_collection
from latentstrat.aggregate.collection import aggregate_collection
from latentstrat.aggregate.columns import FAMILY_COL, SHARE_METRICS
from latentstrat.aggregate.contrasts import common_cells
from latentstrat.aggregate.dynamics import task_shares
from latentstrat.aggregate.fairness import attribution, collection_metadata
from latentstrat.aggregate.inputs import load_cell_rows, read_summary_table, validate_summary_table
from latentstrat.aggregate.scale import scale_table
from latentstrat.aggregate.settings import metric_distributions, seed_means
from latentstrat.cells import expand_cells, schema_cell_defaults


def test_metric_distributions_hand_computed():
    rows = pd.DataFrame({"matched_router_score": [0.1, 0.2, 0.6], "kl_prior_loss": [1.0, 3.0, math.nan]})
    d = metric_distributions(rows).set_index("metric")
    assert d.loc["matched_router_score", "mean"] == pytest.approx(0.3)
    assert d.loc["matched_router_score", "median"] == pytest.approx(0.2)
    assert d.loc["matched_router_score", "std"] == pytest.approx(math.sqrt(((0.2) ** 2 + 0.1**2 + 0.3**2) / 3))
    assert d.loc["kl_prior_loss", "n"] == 2 and d.loc["kl_prior_loss", "std"] == pytest.approx(1.0)
    assert "posterior_probe" not in d.index  # absent metrics are left out, not zero


def _rows(agg, sched="constant", fams=("raw", "dist_norm"), betas=(0.1, 1.0), router=0.5, record_all=True):
    other = schema_cell_defaults() if record_all else {}
    df = pd.DataFrame(
        [
            {
                **other,
                "reconstruction_family": f,
                "beta": b,
                "token_aggregation": agg,
                "beta_schedule": sched,
                "matched_router_score": router,
                "final_answer_accuracy": 0.99,
                "active_reconstruction_objective": 1.0,
            }
            for f in fams
            for b in betas
        ]
    )
    return seed_means(validate_summary_table(df, f"{agg}-{sched}"))


def test_common_cells_deltas_and_unmatched():
    p, c = _rows("sum", router=0.5), _rows("mean", "lin100", betas=(0.1,), router=0.6)
    common, un = common_cells(p, c, ["reconstruction_family", "beta"], "comparison")
    assert len(common) == 2 and list(common.beta_label) == ["beta=.1", "beta=.1"]
    assert common.delta_matched_router_score.to_numpy() == pytest.approx([-0.1, -0.1])
    assert {"mean_matched_router_score", "sum_matched_router_score"} <= set(common.columns)
    assert list(un.beta_label) == ["beta=1", "beta=1"] and "beta=1" in un.reason.iloc[0]


def test_attribution_names_schedule_or_supports():
    p = _rows("sum")
    for comparison, want in [(_rows("mean", "lin100"), "not supported"), (_rows("mean"), "supported")]:
        common, _ = common_cells(p, comparison, ["reconstruction_family", "beta"], "comparison")
        res = attribution(p, comparison, common, ["reconstruction_family", "beta"], "comparison")
        assert res["status"] == want, res
        if want == "not supported":
            assert "beta_schedule" in res["evidence"] and "lin100" in res["evidence"]
    res = attribution(p, _rows("mean"), pd.DataFrame(), ["reconstruction_family", "beta"], "comparison")
    assert res["status"] == "not supported"
    comparison = _rows("mean", record_all=False)  # external table without latent_dim etc.: partial, naming them
    common, _ = common_cells(p, comparison, ["reconstruction_family", "beta"], "comparison")
    res = attribution(p, comparison, common, ["reconstruction_family", "beta"], "comparison")
    assert res["status"] == "partial" and "latent_dim" in res["evidence"]


def test_scale_ratio():
    p = _rows("sum").assign(inferred_zfree_reference_scale=[40.0, 40.0, 42.0, 38.0])
    c = _rows("mean").assign(inferred_zfree_reference_scale=[1.0, 1.0, 1.0, 1.0])
    common, _ = common_cells(p, c, ["reconstruction_family", "beta"], "comparison")
    s = scale_table(p, {"comparison": c}, {"comparison": common}).set_index("aggregation_mode")
    assert s.loc["sum_over_mean_comparison_ratio", "mean"] == pytest.approx(40.0)
    assert s.loc["mean_comparison_common_cells", "n"] == 4
    assert s.loc["sum", "std"] == pytest.approx(np.std([40, 40, 42, 38]))


def test_task_shares_mean_equal_loss_equals_example_share():
    task = np.array(["a"] * 3 + ["b"] * 1)
    n = np.array([10, 10, 10, 50])
    c = 0.7  # equal per-token loss
    mean_loss = c * n / n  # A_i under mean
    sum_loss = c * n  # A_i under sum
    ex = pd.Series(np.ones(4)).groupby(task).sum() / 4
    s_mean, s_sum = task_shares(task, mean_loss), task_shares(task, sum_loss)
    assert s_mean.sum() == pytest.approx(1) and s_sum.sum() == pytest.approx(1)
    assert s_mean.to_numpy() == pytest.approx(ex.to_numpy())
    assert s_sum["b"] == pytest.approx(50 / 80)  # sum: token share, not example share
    assert s_sum["b"] != pytest.approx(ex["b"])


def test_collection_with_missing_cell(monkeypatch, tmp_path):
    cfg = make_cfg(monkeypatch)
    cells = expand_cells(cfg)
    missing = cells[0].cell_id
    mp, hp = write_collection(cfg, tmp_path / "cells", skip={missing})
    mp[cells[1].cell_id].write_bytes(b"not parquet")  # unreadable: also incomplete, named
    t = aggregate_collection(cfg, mp, hp, tmp_path / "agg")
    st = t["collection_state"].set_index("cell_id")
    assert st.loc[missing, "status"] == "incomplete" and "missing" in st.loc[missing, "reason"]
    assert "unreadable" in st.loc[cells[1].cell_id, "reason"]
    assert missing not in set(t["summary"].cell_id)
    assert t["metric_distributions"].set_index("metric").loc["matched_router_score", "n"] == 2
    f = t["fairness"].set_index("claim")
    assert (
        f.loc["planned grid completeness", "status"] == "partial"
        and missing in f.loc["planned grid completeness", "evidence"]
    )
    assert (tmp_path / "agg" / "fairness.csv").exists() and (tmp_path / "agg" / "summary.parquet").exists()


def test_followup_fairness_dynamics_dominance(monkeypatch, tmp_path):
    cfg = make_cfg(monkeypatch)
    mp, hp = write_collection(cfg, tmp_path / "cells")
    t = aggregate_collection(cfg, mp, hp, tmp_path / "agg")
    f = t["fairness"].set_index("claim")
    assert f.loc["aggregation-only causal attribution (mean_matched)", "status"] == "supported"
    lin = f.loc["aggregation-only causal attribution (mean_lin100)"]
    assert lin.status == "not supported" and "beta_schedule" in lin.evidence
    assert f.loc["common-cell comparison (mean_lin100)", "status"] == "partial"
    assert f.loc["training-dynamics diagnosis", "status"] == "supported"
    c = t["common_cells"]
    assert c[c.comparison_arm == "mean_matched"].delta_matched_router_score.to_numpy() == pytest.approx([-0.1] * 4)
    assert c[c.comparison_arm == "sum_scaled"].delta_matched_router_score.to_numpy() == pytest.approx([-0.05] * 4)
    s = t["reference_scale"].set_index("aggregation_mode")
    assert s.loc["sum_over_mean_comparison_ratio (mean_matched)", "mean"] == pytest.approx(40.0)
    d = t["dynamics_summary"]
    assert set(d.first_checkpoint) == {"initialization"}
    assert d.first_base_relative_reconstruction.iloc[0] == 1.0 and d.final_base_relative_reconstruction.iloc[0] == 0.98
    assert d.max_val_scored_matched_router_score.iloc[0] == pytest.approx(
        0.7
    ) and d.final_val_scored_matched_router_score.iloc[0] == pytest.approx(0.5)
    dom = t["token_dominance"]
    assert set(dom.checkpoint) == {"initialization", "final"}
    sums = t["token_dominance_sums"]
    for m in SHARE_METRICS:
        assert sums[m].to_numpy() == pytest.approx(1.0)
    mean = dom[dom.token_aggregation == "mean"]
    assert mean.loss_share.to_numpy() == pytest.approx(mean.example_share.to_numpy())
    a = t["data_availability"].set_index("diagnostic")
    assert a.loc["Initialization / first-eval scale", "local_data"] == "yes"
    assert a.loc["Token-count dominance", "local_data"] == "yes"
    assert a.loc["Seed replication", "local_data"] == "no"
    pt = t["per_task_checkpoints"]
    assert set(pt.task_name) == set(TASKS)


def test_availability_without_init(monkeypatch, tmp_path):
    cfg = make_cfg(monkeypatch, lin100=False)
    mp, hp = write_collection(cfg, tmp_path / "cells")
    for p in hp.values():  # drop step 0: first checkpoint is step 10
        h = pd.read_parquet(p)
        h[h.step > 0].to_parquet(p)
    t = aggregate_collection(cfg, mp, hp, tmp_path / "agg")
    a = t["data_availability"].set_index("diagnostic")
    assert a.loc["Initialization / first-eval scale", "local_data"] == "partial"
    assert "step 10" in a.loc["Initialization / first-eval scale", "missing_data_note"]
    assert t["fairness"].set_index("claim").loc["training-dynamics diagnosis", "status"] == "partial"
    assert set(t["dynamics_summary"].first_checkpoint) == {"step 10"}


def test_three_seeds_give_std(monkeypatch, tmp_path):
    cfg = make_cfg(monkeypatch, seeds=[0, 1, 2], lin100=False)
    mp, hp = write_collection(cfg, tmp_path / "cells", with_history=False)
    t = aggregate_collection(cfg, mp, hp, tmp_path / "agg")
    by = t["summary_by_setting"]
    sum_rows = by[by.arm == "sum"]
    assert (sum_rows.n_seeds == 3).all()
    # within_task probe 0.5 + 0.01 * (seed % 3): std of [0.5, 0.51, 0.52] (ddof=1) = 0.01
    assert sum_rows.matched_router_score_std.to_numpy() == pytest.approx([0.01] * 4)
    assert "matched_router_score_std" in t["derived_diagnostics"].columns
    assert t["fairness"].set_index("claim").loc["seed replication", "status"] == "supported"


def test_bad_comparison_table_names_column(tmp_path):
    p = tmp_path / "comparison.csv"
    pd.DataFrame({"reconstruction_family": ["raw"], "beta": [0.1], "token_aggregation": ["mean"]}).to_csv(
        p, index=False
    )
    with pytest.raises(ValueError, match="beta_schedule.*comparison.csv|comparison.csv.*beta_schedule"):
        read_summary_table(p)
    pd.DataFrame(
        {
            "reconstruction_family": ["bogus"],
            "beta": [0.1],
            "token_aggregation": ["mean"],
            "beta_schedule": ["constant"],
            "matched_router_score": [0.5],
        }
    ).to_csv(p, index=False)
    with pytest.raises(ValueError, match="reconstruction_family"):
        read_summary_table(p)


@pytest.mark.parametrize("seeds,expect_bars", [([0, 1, 2], True), ([0], False)])
def test_three_seeds_draw_error_bars(monkeypatch, tmp_path, seeds, expect_bars):
    """Figures of a 3-seed collection carry error bars (seed std); one seed draws none."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.container import ErrorbarContainer

    from latentstrat.report import figures as F

    cfg = make_cfg(monkeypatch, seeds=seeds, lin100=False)
    mp, hp = write_collection(cfg, tmp_path / "cells", with_history=False)
    t = aggregate_collection(cfg, mp, hp, tmp_path / "agg")
    for make in (F.kl_vs_reconstruction, F.kl_recon_ratio):
        fig = make(t)
        assert fig is not None
        bars = [c for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert bool(bars) == expect_bars, make.__name__


def test_collection_metadata_names_dates_code_versions_and_stale_cells():
    summary = pd.DataFrame(
        {
            "train_code_version": ["abc123", "abc123", "def456+dirty"],
            "train_started_at": ["2026-12-01T00:10:00Z", "2026-12-01T00:05:00Z", "2026-12-01T00:20:00Z"],
            "train_finished_at": ["2026-12-01T00:12:00Z", "2026-12-01T00:07:00Z", "2026-12-01T00:30:00Z"],
            "train_host": "n1",
            "train_device": "cpu",
        }
    )
    state = pd.DataFrame({"cell_id": list("abcd"), "status": ["complete"] * 3 + ["incomplete"]})
    m = collection_metadata(summary, state, code_now="abc123").set_index("field").value
    assert m["planned cells"] == "4" and m["observed cells (with final metrics)"] == "3"
    assert m["first cell started"] == "2026-12-01T00:05:00Z" and m["last cell finished"] == "2026-12-01T00:30:00Z"
    assert m["code versions"] == "abc123 (2 cells), def456+dirty (1 cells)"
    assert m["cells trained with other code than now"].startswith("1 ")
    empty = collection_metadata(pd.DataFrame({"x": [1]}), state).set_index("field").value
    assert empty["code versions"] == "NA (not recorded)"
    assert empty["machines (pairs)"] == "NA (not recorded)"


def test_the_setup_names_every_machine_and_the_pairs_it_ran():
    """Three pairs on two machines (another CPU model under one host name, another day), one of
    them split: each machine with its pairs and cells, and the split pair counted."""
    from latentstrat.aggregate.fairness import machine_counts

    epyc = {"train_host": "vm", "train_cpu": "AMD EPYC", "train_cpu_capability": "AVX-512 + native bf16"}
    xeon = {**epyc, "train_cpu": "Intel Xeon"}
    rows = []
    for (fam, seed), arms in {
        ("raw", 1): [epyc, epyc, epyc],
        ("raw", 2): [xeon, xeon],
        ("tokcc", 1): [epyc, xeon],
    }.items():
        for m in arms:
            day = "2026-12-07" if m is epyc else "2026-12-08"
            rows.append(
                {
                    "reconstruction_family": fam,
                    "beta": 0.1,
                    "seed": seed,
                    **m,
                    "train_code_hash": "a3bb973b9b7bc56a",
                    "train_started_at": f"{day}T10:00:00Z",
                }
            )
    text = machine_counts(pd.DataFrame(rows))
    assert text == (
        "vm, AMD EPYC (AVX-512 + native bf16), code a3bb973b9b7b, from 2026-12-07: 2 pairs (4 cells); "
        "vm, Intel Xeon (AVX-512 + native bf16), code a3bb973b9b7b, from 2026-12-08: 2 pairs (3 cells); "
        "1 pair split over machines"
    )


def test_metrics_older_than_their_records_are_not_complete(tmp_path, monkeypatch):
    """After evaluate records are rewritten (or corrupted) the old metrics describe outputs that
    are gone: the partial report's aggregate lists the cell as incomplete, with the reason."""
    import os

    from aggregate_helpers import make_cfg, write_collection
    from latentstrat.cells import expand_cells

    cfg = make_cfg(monkeypatch)
    mp, hp = write_collection(cfg, tmp_path / "cells")
    cid = expand_cells(cfg)[0].cell_id
    records = tmp_path / "records.parquet"
    records.write_bytes(b"garbage")
    t = os.path.getmtime(mp[cid])
    os.utime(records, (t + 10, t + 10))
    summary, state = load_cell_rows(expand_cells(cfg), mp, upstream={cid: [records]})
    row = state.set_index("cell_id").loc[cid]
    assert row.status == "incomplete" and "older than" in row.reason and "records.parquet" in row.reason
    assert cid not in set(summary.cell_id)
    assert (state.status == "complete").sum() == len(state) - 1


def test_partial_report_lists_cells_without_metrics_as_incomplete(tmp_path, monkeypatch):
    """The report a failed run leaves: the finished cells aggregated and reported, the others
    named incomplete; nothing when no cell has finished, or when every cell has."""
    import shutil

    from aggregate_helpers import make_cfg, write_collection
    from latentstrat.cells import expand_cells
    from latentstrat.config import check_config
    from latentstrat.paths import Paths
    from latentstrat.report.partial import partial_report

    cfg = check_config({**make_cfg(monkeypatch), "results_dir": str(tmp_path / "results")})
    p = Paths.from_config(cfg)
    cells = [c.cell_id for c in expand_cells(cfg)]
    assert partial_report(cfg, log=lambda m: None) is None and not p.report_dir.exists()
    mp, hp = write_collection(cfg, tmp_path / "made", skip=cells[:1])
    for c in cells[1:]:
        p.row_path(c).parent.mkdir(parents=True)
        shutil.copy(mp[c], p.row_path(c))
        Path(p.train_files(c)["history"]).parent.mkdir(parents=True)
        shutil.copy(hp[c], p.train_files(c)["history"])
    got = partial_report(cfg, log=lambda m: None)
    assert got == {"done": cells[1:], "missing": cells[:1]}
    state = pd.read_parquet(p.aggregate_marker).set_index("cell_id")
    assert state.loc[cells[0], "status"] != "complete" and (state.status == "complete").sum() == len(cells) - 1
    import yaml

    brief = yaml.safe_load((p.report_dir / "brief.yaml").read_text())["cells"]
    assert brief["expected"] == len(cells) and brief["complete"] == len(cells) - 1
    assert [c if isinstance(c, str) else c.get("cell_id") for c in brief["incomplete"]] == cells[:1]
    # every cell has metrics (the aggregate or report job itself failed): no partial report in
    # the collection job's place, where the next run would read it as up to date
    shutil.rmtree(p.report_dir)
    p.row_path(cells[0]).parent.mkdir(parents=True)
    shutil.copy(mp[cells[1]], p.row_path(cells[0]))
    assert partial_report(cfg, log=lambda m: None) is None and not p.report_dir.exists()


def test_the_original_studys_column_name_is_read_as_base_relative_reconstruction():
    from latentstrat.aggregate.inputs import validate_summary_table

    df = pd.DataFrame(
        {
            "reconstruction_family": ["raw"],
            "beta": [0.1],
            "token_aggregation": ["mean"],
            "beta_schedule": ["constant"],
            "matched_router_score": [0.5],
            "distribution_normalized_reconstruction_loss": [0.8],
            "reconstruction_loss": [1.6],
        }
    )
    out = validate_summary_table(df, "t.csv")
    assert (
        out.base_relative_reconstruction.tolist() == [0.8] and "distribution_normalized_reconstruction_loss" not in out
    )
    assert out.inferred_zfree_reference_scale.tolist() == [2.0]


def test_a_history_written_before_the_scored_names_is_read_with_them(tmp_path):
    """The trainer's validation names its likelihood-scored router probes apart from the metrics
    row's decoded ones (metrics.SCORED_NAMES); an older history is read with the new names, and
    nothing else in it changes."""
    from latentstrat.aggregate.inputs import load_histories

    old = pd.DataFrame(
        {
            "cell_id": "c",
            "step": [0, 0, 0, 0],
            "task": "all",
            "metric": [
                "within_task_router_probe",
                "matched_router_score",
                "global_router_probe_chance",
                "kl_prior_loss",
            ],
            "value": [0.5, 0.4, 0.3, 2.0],
        }
    )
    old.to_parquet(tmp_path / "h.parquet")
    h, bad = load_histories({"c": tmp_path / "h.parquet"})
    assert bad == []
    assert list(h.metric) == [
        "scored_router_probe",
        "scored_matched_router_score",
        "scored_global_router_probe_chance",
        "kl_prior_loss",
    ]
    assert list(h.value) == [0.5, 0.4, 0.3, 2.0]


def test_the_normalized_families_contrast_leaves_raw_out(monkeypatch, tmp_path):
    """The secondary endpoint (report.normalized_secondary): each arm's contrast over the
    normalized families' common settings alone (dist_norm here: 2 of the 4), the same delta as
    the mean over those settings; off, no table."""
    cfg = make_cfg(monkeypatch)
    mp, hp = write_collection(cfg, tmp_path / "cells")
    t = aggregate_collection(cfg, mp, hp, tmp_path / "agg")
    n = t["normalized_contrasts"].set_index("comparison_arm")
    assert set(n.metric) == {cfg["report"]["primary_metric"]}
    assert n.n_cells.to_dict() == {"mean_matched": 2, "sum_scaled": 2, "mean_lin100": 1}  # lin100: beta 0.1 only
    m = f"delta_{cfg['report']['primary_metric']}"
    c = t["common_cells"]
    for arm in ("mean_matched", "sum_scaled"):
        own = c[(c.comparison_arm == arm) & (c[FAMILY_COL] == "dist norm")]
        assert n.loc[arm, "mean_delta"] == pytest.approx(own[m].mean())
    cfg["report"]["normalized_secondary"] = False
    assert "normalized_contrasts" not in aggregate_collection(cfg, mp, hp, tmp_path / "agg2")
