import json
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from aggregate_helpers import make_cfg, write_collection
from latentstrat.aggregate.collection import aggregate_collection
from latentstrat.cells import expand_cells
from latentstrat.report import build_report
from latentstrat.report.__main__ import main as cli_main

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def partial_report(tmp_path_factory):
    mp_ = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("rep")
    cfg = make_cfg(mp_)
    cells = expand_cells(cfg)
    missing = cells[2].cell_id
    mp, hp = write_collection(cfg, tmp / "cells", skip={missing})
    aggregate_collection(cfg, mp, hp, tmp / "agg")
    t0 = time.perf_counter()
    res = build_report(tmp / "agg", tmp / "report", {})
    res["wall"] = time.perf_counter() - t0
    yield tmp / "report", res, missing
    mp_.undo()


def test_partial_report_lists_and_excludes_missing(partial_report):
    out, res, missing = partial_report
    results = (out / "results.md").read_text()
    assert missing in results and "excluded" in results
    assert "14 expected cells: 13 have final metrics and 1 remain" in results
    # excluded from quantitative summaries: distributions over the 3 remaining primary cells
    assert "| matched router score | 3 |" in results
    brief = yaml.safe_load((out / "brief.yaml").read_text())
    assert brief["cells"]["incomplete"] == [missing]


def test_report_outputs_and_findings(partial_report):
    out, res, _ = partial_report
    assert res["wall"] < 30
    names = {n for n, _ in res["figures"]}
    assert {
        "objective_scale_heatmap",
        "token_count_dominance",
        "dynamics_kl",
        "per_task_router_dynamics",
        "reconstruction_router_trajectory",
    } <= names
    for n in names:
        assert (out / "figures" / f"{n}.png").stat().st_size > 1000
    f = {x["question"][:30]: x for x in json.loads((out / "findings.json").read_text())["findings"]}
    assert len(f) == 7
    scale = next(x for k, x in f.items() if k.startswith("Is sum failing"))
    # toy data: sum - sum_scaled = -0.05, sum_scaled - mean = -0.05: both move the score
    assert scale["status"] == "cannot tell" and "-0.05" in scale["evidence"]
    early = next(x for k, x in f.items() if k.startswith("Do sum runs lose"))
    # 3 checkpoints cannot show a rise then a fall at the 5% level (smallest p = 1/3)
    assert early["status"] == "cannot tell" and "too few checkpoints" in early["evidence"]
    dom = next(x for k, x in f.items() if k.startswith("Under token-sum"))
    assert dom["status"] == "supported"
    analysis = (out / "analysis.md").read_text()
    assert "near_zero_delta = 0.01" in analysis and "## Fairness Assessment" in analysis


def test_absent_figures_are_listed_not_crashing(tmp_path):
    rc = cli_main(
        [
            "--summary",
            str(FIX / "study001_sum_summary.csv"),
            "--comparison",
            str(FIX / "study001_mean_lin100.csv"),
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    results = (tmp_path / "results.md").read_text()
    assert "Figures skipped because their data is absent" in results and "KL dynamics (`dynamics_kl.png`)" in results
    assert (tmp_path / "figures" / "objective_scale_heatmap.png").exists()
    assert "40.02" in (tmp_path / "analysis.md").read_text()


def test_cli_bad_table_names_column(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("reconstruction_family,beta\nraw,0.1\n")
    assert cli_main(["--summary", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "token_aggregation" in capsys.readouterr().err and not (tmp_path / "o" / "results.md").exists()


def test_entangle_quality_check_is_reported_with_its_failures(partial_report, tmp_path):
    from latentstrat.base.quality import quality_report
    from latentstrat.report import load_entangle_quality
    from latentstrat.tasks import TASKS

    t = TASKS["multidigit_addition"]
    xs = ["add 1 2 + 3 4", "add 5 6 + 7 8", "add 9 1 + 2 3", "add 4 4 + 5 5"]
    # every sample follows right_to_left: traces and answers right, strategy prior 100/0 -> TV fails
    samples = __import__("pandas").DataFrame(
        dict(task=t.name, x=xs, y_generated=[t.render(x, "right_to_left") for x in xs])
    )
    rep = quality_report(
        samples,
        {t.name: {"right_to_left": 0.5, "left_to_right": 0.5}},
        {"quality_min_answer_accuracy": 0.9, "quality_min_strategy_match": 0.85, "quality_max_strategy_tv": 0.15},
    )
    rep.update(temperature=1.0, samples_per_task=4)
    (tmp_path / "quality.json").write_text(json.dumps(rep))
    quality = load_entangle_quality(tmp_path / "quality.json")
    agg = partial_report[0].parent / "agg"
    build_report(agg, tmp_path / "rep", {"entangle_quality": quality}, figures=False)
    results = (tmp_path / "rep" / "results.md").read_text()
    assert "## Entangled Model Quality Check" in results
    assert "**Failed: multidigit_addition.strategy_tv.**" in results
    assert "0.5 (FAIL, <= 0.15)" in results and "1 (ok, >= 0.9)" in results
    assert yaml.safe_load((tmp_path / "rep" / "brief.yaml").read_text())["entangle_quality_passed"] is False
    # without the stage's report the section says so instead of claiming a pass
    assert "Not recorded for this report" in (partial_report[0] / "results.md").read_text()
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json is unreadable"):
        load_entangle_quality(tmp_path / "bad.json")


def _gap_tables(acc_hi, gap_lo, entangled=0.987):
    """Two primary cells with the given accuracy upper bounds and gap lower bounds."""
    from latentstrat.report.findings import q_accuracy_hides_gap

    s = pd.DataFrame(
        {
            "cell_id": ["a", "b"],
            "role": "primary",
            "final_answer_accuracy": [0.98, 0.98],
            "final_answer_accuracy_ci_high": acc_hi,
            "posterior_router_probe_gap": [0.43, 0.43],
            "posterior_router_probe_gap_ci_low": gap_lo,
            "posterior_router_probe_gap_ci_high": [0.5, 0.5],
        }
    )
    sanity = pd.DataFrame({"cell_id": ["a", "b"], "entangled_answer_accuracy": entangled})
    return q_accuracy_hides_gap({"summary": s, "cell_sanity": sanity}, 0.01)


def test_accuracy_hides_gap_is_decided_from_intervals_not_a_saturation_threshold():
    # accuracy 0.98 (interval up to 0.99) against the entangled 0.987, gap 0.43 with its interval above 0:
    # the old 0.99 saturation threshold read "not supported"; the intervals say supported
    f = _gap_tables(acc_hi=[0.99, 0.985], gap_lo=[0.35, 0.3])
    assert f["status"] == "supported" and f["numbers"]["with_gap_above_0"] == 2
    # negative controls: the gap's interval reaches 0, or the accuracy is far below the entangled model's
    assert _gap_tables(acc_hi=[0.99, 0.99], gap_lo=[-0.02, -0.01])["status"] == "not supported"
    f = _gap_tables(acc_hi=[0.90, 0.91], gap_lo=[0.35, 0.3])
    assert f["status"] == "not supported" and f["numbers"]["near_entangled_accuracy"] == 0
    assert _gap_tables(acc_hi=[0.99, 0.99], gap_lo=[0.3, -0.1])["status"] == "cannot tell"


def test_html_report_pages_carry_the_headline_and_a_caption_per_figure(partial_report):
    """report/html.py: the landing page is analysis.md's headline rendered (one text, two places), each
    figure has its own caption with the collection's numbers, and the pages render the markdown."""
    import jinja2

    from latentstrat.report.figures import FIGURE_NOTES, FIGURES
    from latentstrat.report.html import PAGES, TABLE_PAGES, _rst_text

    out, res, missing = partial_report
    assert set(FIGURE_NOTES) == set(FIGURES)  # every figure declared with its caption
    brief = yaml.safe_load((out / "brief.yaml").read_text())
    landing = (out / "landing.rst").read_text()
    # the first screen: verdict, the arms' values, the next step, the setup, links to the sections
    assert f"<strong>Verdict: {brief['verdict']}</strong>" in landing and "13 of 14 cells complete (partial)" in landing
    assert "<th" in landing and ">sum</span></td>" in landing and "<strong>Next:</strong>" in landing
    for row in ("model", "training", "tasks", "data per task", "seeds", "hardware"):
        assert f">{row}</td>" in landing, row
    assert "results[" in landing and "app.showCategory(&#x27;2. Figures&#x27;)" in landing
    assert "<code>" not in landing and "`" not in landing.split(".. raw:: html", 1)[1]  # no literal backticks
    # the captions as Snakemake renders them: one Jinja template, the figure's name selects its block
    template = jinja2.Environment().from_string((out / "captions.rst").read_text())
    seen = set()
    for name, _ in res["figures"]:
        wildcards = type("W", (), {"figure": name})
        text = template.render(snakemake=type("S", (), {"wildcards": wildcards}))
        assert _rst_text(FIGURE_NOTES[name].text)[:60] in text, name
        if FIGURE_NOTES[name].metric:
            assert "In this collection" in text and "``sum`` median" in text, text
        seen.add(text)
    assert len(seen) == len(res["figures"])  # one caption per figure, none shared
    # the report's Figures section: one page per figure, the image inside it and its caption under it
    for name, title in res["figures"]:
        fig_page = (out / "figure_pages" / f"{name}.html").read_text()
        img, caption = fig_page.index('<img src="data:image/png;base64,'), fig_page.index("<figcaption>")
        assert img < caption and FIGURE_NOTES[name].text[:20] in fig_page[caption:], name
    for stem in [*PAGES, *TABLE_PAGES]:
        html = (out / "html" / f"{stem}.html").read_text()
        assert html.startswith("<!DOCTYPE html>") and "<h" in html
    analysis = (out / "html" / "analysis.html").read_text()
    assert "<h2>Headline</h2>" in analysis and "<table>" in (out / "html" / "results.html").read_text()
    assert missing in (out / "html" / "results.html").read_text()
    # every figure travels inside the Results page (no relative path to resolve in Snakemake's
    # report) with its caption visible under it, the collection's numbers in it
    results = (out / "html" / "results.html").read_text()
    assert 'src="../figures/' not in results and 'src="figures/' not in results
    assert results.count('src="data:image/png;base64,') == len(res["figures"])
    md = (out / "results.md").read_text()
    for name, title in res["figures"]:
        after = md.split(f"![{title}](figures/{name}.png)", 1)[1].lstrip()
        assert after.startswith("*" + FIGURE_NOTES[name].text[:40]), name


def test_the_dominance_caption_quotes_the_final_panels_numbers():
    """The token-count dominance caption quotes, per aggregation, the largest loss share at the
    end of training, recomputed here from the figure's own data frame (checkpoints in training
    order: `initialization` then `final`, which sort the other way as strings)."""
    import pandas as pd

    from latentstrat.report.html import dominance_numbers

    d = pd.DataFrame(
        {
            "token_aggregation": ["sum"] * 4 + ["mean"] * 4,
            "checkpoint": ["initialization", "initialization", "final", "final"] * 2,
            "task": ["grid", "addition"] * 4,
            "example_share": [0.5] * 8,
            "loss_share": [0.49, 0.51, 0.99, 0.01, 0.59, 0.41, 0.92, 0.08],
        }
    )
    text = dominance_numbers({"token_dominance": d})
    for agg, g in d.groupby("token_aggregation"):
        final = g[g.checkpoint == "final"]
        top = final.loc[final.loss_share.idxmax()]
        assert f"under ``{agg}``, {top.task} takes {top.loss_share:.0%} of the loss" in text
    assert "51%" not in text and "59%" not in text  # the initialization panels' numbers


def test_each_figures_caption_quotes_the_numbers_of_the_frame_it_draws(partial_report):
    """Per figure, the numbers its caption quotes are recomputed here from the frame the figure
    draws (report/frames.py): per arm the median and range at the checkpoint the caption names;
    the dynamics figures show both arms of the primary contrast; the heatmap counts its deltas
    clear of 0 on the one scale it colours them with."""
    import pandas as pd

    from latentstrat.report.figures import FIGURE_NOTES
    from latentstrat.report.frames import caption_frame, heatmap_frame, sig3
    from latentstrat.report.html import figure_caption
    from latentstrat.report.tables import load_aggregate

    out, res, _ = partial_report
    t, _meta = load_aggregate(out.parent / "agg")
    arms = yaml.safe_load((out / "brief.yaml").read_text())["primary_contrast"]
    t["primary_contrast"] = pd.DataFrame([{**arms, "metric": "router_information"}])
    checked = 0
    for name, _ in res["figures"]:
        note, caption = FIGURE_NOTES[name], figure_caption(t, name)
        if note.frame is None:
            continue
        rows, col, _what, when = caption_frame(t, note.frame, note.metric)
        assert when in caption, name
        for arm, g in rows.groupby("arm"):
            v = pd.to_numeric(g[col], errors="coerce").dropna()
            assert f"`{arm}` median {sig3(v.median())} ({sig3(v.min())} to {sig3(v.max())}," in caption, (name, caption)
        if note.frame.startswith("history"):  # both arms of the contrast drawn and quoted
            assert f"`{arms['primary_arm']}` median" in caption and f"`{arms['comparison_arm']}` median" in caption
        checked += 1
    assert checked >= 10
    delta, z = heatmap_frame(t)
    clear = f"{int((z.abs() >= 1).sum().sum())} of {int(delta.notna().sum().sum())} deltas have an interval clear of 0"
    assert clear in figure_caption(t, "objective_scale_heatmap")


def test_tables_have_worded_headers_one_precision_per_column_and_split_when_wide():
    import pandas as pd

    from latentstrat.report.tables import MAX_COLUMNS, md_table

    df = pd.DataFrame(
        {
            "arm": ["sum", "matched_mean"],
            "reconstruction_loss_family_label": ["raw", "dist norm"],
            "router_information": [0.31259, 0.2],
            "router_information_ci_low": [0.224, 0.1],
            "interval_df": [float("inf"), 3.0],
            "n_cells": [12, 3],
            "kl_prior_loss": [1234.5678, float("nan")],
        }
    )
    lines = md_table(df).splitlines()
    assert (
        lines[0]
        == "| arm | family | router information | router information: CI low | interval df | n cells | KL to prior |"
    )
    assert lines[2] == "| sum | raw | 0.313 | 0.224 | inf | 12 | 1235 |"  # 3 significant digits of a column's size
    assert lines[3] == "| matched_mean | dist norm | 0.200 | 0.100 | 3 | 3 | NA |"
    wide = pd.DataFrame({"cell": ["a"], **{f"m{i}": [float(i) + 0.5] for i in range(20)}})
    parts = [p for p in md_table(wide).split("\n\n") if p.strip()]
    assert len(parts) == 3 and all(p.startswith("| cell |") for p in parts)  # the key column repeated
    assert all(p.splitlines()[0].count("|") - 1 <= MAX_COLUMNS for p in parts)
