# Stage 6b (per cell): the cell's metrics row and its bootstrap replicates, from its evaluation
# records, probes and training summary.


rule metrics:
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
        metrics=str(P.metrics_path("{cell}")),
        bootstrap=str(P.bootstrap_path("{cell}")),
    log:
        str(P.log_path("metrics", "{cell}")),
    benchmark:
        str(P.bench_path("metrics", "{cell}"))
    conda:
        "../../envs/latentstrat.yaml"
    threads: 1
    resources:
        **job_resources("cpu", 2000, 10),
    params:
        cell=cell_json,
        settings=sections("probes"),
        tables_version=CELL_TABLES_VERSION,
    script:
        "../scripts/metrics.py"
