# Stage 7 (per collection): collection tables from every cell's row and history.
# Package code is not an input of the cell rules (editing it never retrains); the aggregate
# and report code ARE inputs here, so editing them reruns only aggregate + report.


rule aggregate:
    input:
        unpack(
            after_base(
                "cell",
                lambda w: {
                    "rows": package_rules.cell_file_list(P, CELLS, ARCHIVED, "row"),
                    "bootstrap": package_rules.cell_file_list(P, CELLS, ARCHIVED, "bootstrap"),
                    "history": package_rules.cell_file_list(P, CELLS, ARCHIVED, "history"),
                    "comparison_tables": comparison_tables(),
                    "quality": P.entangle_files(MODE)["quality"],
                    "code": package_rules.code_files(workflow.basedir, "aggregate", "metrics.py"),
                },
            )
        ),
    output:
        tables=directory(f"{COLLECTION}/aggregate"),
    log:
        f"{COLLECTION}/logs/aggregate.log",
    benchmark:
        f"{COLLECTION}/benchmarks/aggregate.tsv"
    conda:
        "../../envs/latentstrat.yaml"
    threads: 1
    resources:
        **job_resources("cpu", 4000, 15),
    params:
        settings=settings("aggregate"),
        cells=list(CELLS),
        bench_dir=str(P.bench_dir),
        configfile=CONFIG_FILE,
    script:
        "../scripts/stage.py"
