# Stage 6 (per cell: every task's probes and the global one in one job, the libraries imported
# once) and the cell's metrics row. The two are separate jobs, not a `group:`: Snakemake loses
# track of a running group job when a checkpoint (the base stages here) finishes meanwhile and
# the run stops with `KeyError: metrics` (snakemake/snakemake issues 1331 and 4202).


rule probes:
    input:
        unpack(after_base("cell", lambda w: {"records": str(P.records_path(w.cell))})),
    output:
        P.probe_files("{cell}", TASKS),
    log:
        str(P.log_path("probes", "{cell}")),
    benchmark:
        str(P.bench_path("probes", "{cell}"))
    conda:
        "../../envs/latentstrat.yaml"
    threads: 1
    resources:
        **job_resources("cpu", 2000, 15),
    params:
        settings=sections("probes"),
        tasks=TASKS,
        tables_version=CELL_TABLES_VERSION,
    script:
        "../scripts/probes.py"


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
