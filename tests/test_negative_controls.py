"""Negative controls through the workflow: A/A collections (the comparison arm is the primary
arm's settings with other seeds). One whose cells trained a handful of steps: its headline must
read `cannot tell`, with training noise measured (replicates) and every cell `empty`; brief.yaml
carries every headline key. The quick A/A (config/quick-aa.yaml), whose cells learn: its headline
reads `cannot tell` with training noise in the interval, the interval itself deciding (every cell
`strategy`, so no guard for empty cells speaks)."""

import re

import pandas as pd
import pytest
import yaml

from workflow_helpers import copy_workflow, snakemake, tiny_collection

HEADLINE_KEYS = {
    "primary_endpoint",
    "primary_contrast",
    "verdict",
    "delta",
    "ci_low",
    "ci_high",
    "detectable_delta",
    "seeds_per_cell",
    "training_noise_in_interval",
    "cell_states",
}


@pytest.mark.slow
def test_an_aa_collection_of_few_step_cells_reads_cannot_tell_with_every_cell_empty(tmp_path):
    wd = copy_workflow(tmp_path)
    tiny_collection(
        wd,
        "aa",
        {"reconstruction_family": ["dist_norm"], "beta": [0.01]},
        test_per_task=10,
        collection="aa-few-steps",
        comparison_arms=[{"name": "aa", "settings": {"token_aggregation": "sum", "seed": 271828}}],
        replicates={"extra_seeds": 1},
    )
    r = snakemake(wd, "--cores", "2", "-q", configfile="config/aa.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    report = wd / "results" / "aa-few-steps" / "report"
    brief = yaml.safe_load((report / "brief.yaml").read_text())
    assert HEADLINE_KEYS <= set(brief)
    assert brief["primary_endpoint"] == "router_information"
    assert brief["primary_contrast"] == {"primary_arm": "sum", "comparison_arm": "aa"}
    assert brief["verdict"] == "cannot tell"
    assert brief["training_noise_in_interval"] is True and brief["seeds_per_cell"] == {"min": 2, "max": 2}
    assert brief["cell_states"] == {"sum": {"empty": 2}, "aa": {"empty": 2}}
    assert brief["ci_low"] <= brief["delta"] <= brief["ci_high"]
    analysis = (report / "analysis.md").read_text()
    assert analysis.index("## Headline") < analysis.index("## Every Contrast")
    assert "**positive**" not in analysis and "**negative**" not in analysis
    assert "empty` in both arms" in analysis
    # the per-token base-relative reconstruction (the states' one weighting) reaches every cell row
    summary = pd.read_parquet(wd / "results" / "aa-few-steps" / "aggregate" / "summary.parquet")
    assert summary.token_base_relative_reconstruction.notna().all() and len(summary) == 4


@pytest.fixture(scope="module")
def quick_aa(tmp_path_factory):
    """The quick A/A collection run through the workflow, and its HTML report (snakemake --report)."""
    tmp = tmp_path_factory.mktemp("quick-aa")
    wd = copy_workflow(tmp)
    r = snakemake(wd, "--cores", "2", "-q", configfile="config/quick-aa.yaml", timeout=1500)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    out = tmp / "report.html"
    r = snakemake(wd, "--report", str(out), configfile="config/quick-aa.yaml")
    assert r.returncode == 0 and "ERROR" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    return wd, out


@pytest.mark.slow
def test_the_quick_aa_collection_of_cells_that_learn_reads_cannot_tell(quick_aa):
    wd, _ = quick_aa
    report = wd / "results" / "quick-aa" / "report"
    brief = yaml.safe_load((report / "brief.yaml").read_text())
    assert brief["primary_contrast"] == {"primary_arm": "sum", "comparison_arm": "aa"}
    assert brief["cell_states"] == {"sum": {"strategy": 2}, "aa": {"strategy": 2}}, brief["cell_states"]
    assert brief["training_noise_in_interval"] is True and brief["seeds_per_cell"] == {"min": 2, "max": 2}
    assert brief["verdict"] == "cannot tell" and brief["why"] == ""  # the interval decides, no guard
    assert brief["ci_low"] < 0 < brief["ci_high"] and brief["failing_cells"] == []


@pytest.mark.slow
def test_the_html_report_carries_the_verdict_and_a_caption_per_figure(quick_aa):
    """The HTML report a Snakemake user shares: the verdict on its landing page, one caption per
    figure with the collection's own numbers (report/html.py), no path of the machine that ran it."""
    import re

    from latentstrat.report.figures import FIGURES

    wd, report = quick_aa
    page = report.read_text()
    assert "<strong>Verdict: cannot tell</strong>" in page and "2 strategy" in page  # the landing page
    titles = {t for t in re.findall(r"<strong>([^<]+)</strong> \(", page) if t in {v[0] for v in FIGURES.values()}}
    assert len(titles) >= 10, titles  # a caption of its own per figure
    assert page.count("In this collection") >= 10
    for section in ("1. Finding", "2. Figures", "3. Tables", "Arm contrasts", "Fairness", "Data availability"):
        assert section in page, section
    # no path of this machine beyond the results folder the test itself set as an absolute path
    shown = page.replace(str(wd / "results"), "results")
    assert str(wd) not in shown and str(wd.resolve()) not in shown
    assert "empty_kl" not in page  # no config dump beside the figures (the report rule passes no params)


@pytest.mark.slow
def test_the_html_report_reads_in_a_browser(quick_aa, tmp_path):
    """In headless Chromium at 1400x900: the title and the verdict in the first viewport, the
    landing page's link opens the Analysis page; every page's images are PNGs inside the page
    (none broken) and every figure page has its caption under its figure."""
    import base64
    import io

    from PIL import Image

    from browser_helpers import browser, probe_landing

    wd, report = quick_aa
    pages = [*(wd / "results" / "quick-aa" / "report" / d for d in ("html", "figure_pages"))]
    files = [f for d in pages for f in sorted(d.glob("*.html"))]
    assert len(files) >= 20
    for f in files:
        html = f.read_text()
        for src in re.findall(r'<img src="([^"]+)"', html):
            assert src.startswith("data:image/png;base64,"), (f.name, src[:60])
            Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).verify()  # a PNG, whole
        if f.parent.name == "figure_pages":
            assert html.index("<img") < html.index("<figcaption>"), f.name
    if browser() is None:
        pytest.skip("no Chromium on this machine: the landing page is not measured in a browser")
    got = probe_landing(report, tmp_path)
    height = got["viewport"][1]
    assert got["title"] and 0 <= got["title"][0] and got["title"][1] <= height, got
    assert got["verdict"] and 0 <= got["verdict"][0] and got["verdict"][1] <= height, got
    assert got["after_click"] == "data:text/html;charset", got


@pytest.mark.slow
def test_a_real_cell_broken_after_training_fails_its_sanity_check_and_is_named(quick_aa, tmp_path):
    """Negative control for the cell sanity check on a state the code produces: one real trained
    cell of the quick A/A collection gets noise on its generator's adapter, then is evaluated,
    probed and tabulated again by the workflow: it fails the answer-accuracy and reconstruction
    checks, is named in brief.yaml and as one the headline rests on; its partner still passes."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    wd, _ = quick_aa
    new = tmp_path / "wd"
    shutil.copytree(wd, new, symlinks=True)
    cells = new / "results" / "quick-aa" / "cells"
    victim = sorted(d.name for d in cells.iterdir() if "seed-2718" not in d.name)[0]  # a primary-arm cell
    (adapter,) = new.glob(f"results/**/{victim}/train/adapters/generator/adapter_model.safetensors")
    (records,) = new.glob(f"results/**/{victim}/evaluate/records.parquet")
    gen = torch.Generator().manual_seed(0)
    w = {k: v + torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in load_file(adapter).items()}
    save_file(w, adapter)
    records.unlink()
    r = snakemake(new, "--cores", "2", "-q", configfile="config/quick-aa.yaml", timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert not re.search(r"\brule train\b", r.stdout + r.stderr)
    brief = yaml.safe_load((new / "results" / "quick-aa" / "report" / "brief.yaml").read_text())
    assert brief["cell_checks_passed"] is False
    failing = {f["cell_id"]: f["why"] for f in brief["failing_cells"]}
    assert list(failing) == [victim], failing
    assert "answer accuracy" in failing[victim] and "final per-token base-relative reconstruction" in failing[victim]
    assert brief["headline_failing_cells"] == [victim]
    common = pd.read_parquet(new / "results" / "quick-aa" / "aggregate" / "common_cells.parquet")
    assert common.loc[common.primary_cell.str.contains(victim), "cell_check"].eq("FAIL").all()


@pytest.mark.slow
def test_another_declared_endpoint_reaches_the_headline_and_the_endpoint_figure(quick_aa):
    """The quick A/A collection with `report.primary_metric: matched_router_score` declared: only
    the aggregate and the report run again (the cells are the same), and the headline, the landing
    page and the endpoint figure with its caption are about the declared endpoint. Runs last in
    this module: it rewrites the fixture's report."""
    wd, _ = quick_aa
    declared = ["report={primary_metric: matched_router_score}"]
    r = snakemake(wd, "--cores", "2", "-q", configfile="config/quick-aa.yaml", config=declared, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert not re.search(r"\brule (train|evaluate|probes)\b", r.stdout + r.stderr)  # no cell work again
    report = wd / "results" / "quick-aa" / "report"
    brief = yaml.safe_load((report / "brief.yaml").read_text())
    assert brief["primary_endpoint"] == "matched_router_score"
    assert "matched router score" in (report / "analysis.md").read_text().split("## Headline", 1)[1][:1500]
    assert "in matched router score" in (report / "landing.rst").read_text()
    page = (report / "figure_pages" / "endpoint_by_cell.html").read_text()
    assert "In this collection, matched router score at the end of training" in page
