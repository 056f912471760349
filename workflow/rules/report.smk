# Stage 8 (per collection): results.md, analysis.md, figures, brief.yaml, findings.json.
# Figures are declared for `snakemake --report` (captions in workflow/report/).


rule report:
    input:
        unpack(
            after_base(
                "cell",
                lambda w: {
                    "aggregate": str(P.aggregate_dir),
                    "quality": P.entangle_files(MODE)["quality"],
                    "code": code_files("report"),
                },
            )
        ),
    output:
        **P.report_files(),
        figures=report(
            directory(str(P.report_dir / "figures")),
            patterns=["{figure}.png"],
            caption="../report/figures.rst",
            category="Figures",
            labels={"figure": "{figure}"},
        ),
    log:
        str(P.logs_dir / "report.log"),
    benchmark:
        str(P.bench_path("report"))
    threads: 1
    resources:
        **job_resources("cpu", 4000, 15),
    params:
        settings=COLLECTION_SETTINGS,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/report.py"
