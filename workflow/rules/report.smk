# Stage 8 (per collection): results.md, analysis.md, figures, brief.yaml, findings.json, and the
# pages of `snakemake --report report.html`: its landing page (the Snakefile's `report:`), one
# page per figure with its caption, and the rendered analysis, results and tables
# (latentstrat.report.html). No params: the report reads its settings from the aggregate's meta,
# and Snakemake's report would show a rule's params beside every figure.
from latentstrat.report.html import PAGES, TABLE_PAGES, figure_question, figure_title
from latentstrat.report.landing import FIGURES, FINDING, TABLES


rule report:
    input:
        unpack(
            after_base(
                "cell",
                lambda w: {
                    "aggregate": str(P.aggregate_dir),
                    "quality": P.entangle_files(MODE)["quality"],
                    "code": package_rules.code_files(workflow.basedir, "report"),
                },
            )
        ),
    output:
        results=f"{COLLECTION}/report/results.md",
        analysis=f"{COLLECTION}/report/analysis.md",
        brief=f"{COLLECTION}/report/brief.yaml",
        findings=f"{COLLECTION}/report/findings.json",
        # for `snakemake --report` (report.html): the landing page and the figures' captions
        landing=f"{COLLECTION}/report/landing.rst",
        captions=f"{COLLECTION}/report/captions.rst",
        figures=directory(f"{COLLECTION}/report/figures"),
        # one page per figure, its caption under it (captions written by this job: report/html.py)
        figure_pages=report(
            directory(f"{COLLECTION}/report/figure_pages"),
            patterns=["{figure}.html"],
            caption=str(Path(f"{COLLECTION}/report/captions.rst").resolve()),
            category=FIGURES,
            subcategory=lambda w: figure_question(w.figure),
            labels=lambda w: {"figure": figure_title(w.figure)},
        ),
        pages=report(
            directory(f"{COLLECTION}/report/html"),
            patterns=["{page}.html"],
            caption="../report/pages.rst",
            category=lambda w: FINDING if w.page in PAGES else TABLES,
            labels=lambda w: {"page": PAGES.get(w.page) or TABLE_PAGES[w.page][0]},
        ),
    log:
        f"{COLLECTION}/logs/report.log",
    benchmark:
        f"{COLLECTION}/benchmarks/report.tsv"
    conda:
        "../../envs/latentstrat.yaml"
    threads: 1
    resources:
        **job_resources("cpu", 4000, 15),
    script:
        "../scripts/stage.py"
