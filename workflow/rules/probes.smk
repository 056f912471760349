# Stage 6a (per cell): every task's probes and the global one in one job, the libraries imported
# once. Probes and the cell's row (tabulate.smk) are separate jobs, not a `group:`: Snakemake
# loses track of a running group job when a checkpoint (the base stages here) finishes meanwhile
# and the run stops with `KeyError: metrics` (snakemake/snakemake issues 1331 and 4202).


rule probes:
    input:
        unpack(after_base("cell", lambda w: {"records": str(P.records_path(w.cell))})),
    output:
        # one table per task, then the global one
        expand(f"{WORK}/probes/{{task}}.parquet", task=[*TASKS, "global"], allow_missing=True),
    log:
        f"{COLLECTION}/logs/probe/{{cell}}.log",
    benchmark:
        f"{COLLECTION}/benchmarks/probe/{{cell}}.tsv"
    priority: cell_priority
    conda:
        "../../envs/latentstrat.yaml"
    threads: 1
    resources:
        **job_resources("cpu", 2000, 15),
    params:
        settings=settings("probes"),
        tasks=TASKS,
        tables_version=CELL_TABLES_VERSION,
    script:
        "../scripts/stage.py"
