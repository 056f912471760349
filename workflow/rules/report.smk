# Stage 8 (per collection): results.md, analysis.md, figures, brief.yaml, findings.json.
# Figures are declared for `snakemake --report` (captions in workflow/report/).


rule report:
    input:
        aggregate=str(P.aggregate_dir),
        quality=entangle_files()["quality"],
        code=code_files("report"),
    output:
        results=str(P.report_dir / "results.md"),
        analysis=str(P.report_dir / "analysis.md"),
        brief=str(P.report_dir / "brief.yaml"),
        findings=str(P.report_dir / "findings.json"),
        figures=report(
            directory(str(P.report_dir / "figures")),
            patterns=["{figure}.png"],
            caption="../report/figures.rst",
            category="Figures",
            labels={"figure": "{figure}"},
        ),
    log:
        str(LOGS / "report.log"),
    benchmark:
        str(BENCH / "report.tsv")
    threads: 1
    resources:
        **job_resources("cpu", 4000, 15),
    params:
        settings=COLLECTION_SETTINGS,
    script:
        "../scripts/report.py"
