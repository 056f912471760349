# Stage 6b (per cell): tabulate: the cell's row of metrics (declared in latentstrat.metrics) and
# its bootstrap replicates, from its evaluation records, probes and training summary.


rule tabulate:
    input:
        unpack(
            after_base(
                "cell",
                lambda w: {
                    "records": str(P.records_path(w.cell)),
                    "probes": P.probe_files(w.cell, TASKS),
                    "summary": P.train_files(w.cell)["summary"],
                    "reference_tokens": P.reference_files()["tokens"],
                },
            )
        ),
    output:
        row=f"{COLLECTION}/cells/{{cell}}/row.parquet",
        bootstrap=f"{COLLECTION}/cells/{{cell}}/bootstrap.parquet",
    log:
        f"{COLLECTION}/logs/tabulate/{{cell}}.log",
    benchmark:
        f"{COLLECTION}/benchmarks/tabulate/{{cell}}.tsv"
    priority: cell_priority
    conda:
        "../../envs/latentstrat.yaml"
    threads: 1
    resources:
        **job_resources("cpu", 2000, 10),
    params:
        cell=cell_json,
        settings=settings("tabulate"),
        tables_version=CELL_TABLES_VERSION,
    script:
        "../scripts/stage.py"
