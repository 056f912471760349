# Stage 6 (per cell x task) and the cell's metrics row. The probe jobs and the metrics job of
# one cell are connected through `metrics`, so the group "probe" makes them ONE submission per
# cell on Slurm (the jobs of a group run together in one allocation).


rule probe_task:
    input:
        records=str(P.records_path("{cell}")),
    output:
        str(P.probe_path("{cell}", "{task}")),
    log:
        str(P.logs_dir / "probe" / "{cell}" / "{task}.log"),
    benchmark:
        str(P.bench_dir / "probe" / "{cell}" / "{task}.tsv")
    group:
        "probe"
    threads: 1
    resources:
        **job_resources("cpu", 2000, 15),
    params:
        settings=sections("probes"),
        tables_version=CELL_TABLES_VERSION,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/probe_task.py"


rule probe_global:
    input:
        records=str(P.records_path("{cell}")),
    output:
        str(P.probe_path("{cell}", "global")),
    log:
        str(P.logs_dir / "probe" / "{cell}" / "global.log"),
    benchmark:
        str(P.bench_dir / "probe" / "{cell}" / "global.tsv")
    group:
        "probe"
    threads: 1
    resources:
        **job_resources("cpu", 2000, 15),
    params:
        settings=sections("probes"),
        tables_version=CELL_TABLES_VERSION,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/probe_global.py"


rule metrics:
    input:
        records=str(P.records_path("{cell}")),
        probes=lambda w: P.probe_files(w.cell, TASKS),
        summary=lambda w: P.train_files(w.cell)["summary"],
    output:
        metrics=str(P.metrics_path("{cell}")),
        bootstrap=str(P.bootstrap_path("{cell}")),
    log:
        str(P.logs_dir / "metrics" / "{cell}.log"),
    benchmark:
        str(P.bench_dir / "metrics" / "{cell}.tsv")
    group:
        "probe"
    threads: 1
    resources:
        **job_resources("cpu", 2000, 10),
    params:
        cell=cell_json,
        settings=sections("probes"),
        tables_version=CELL_TABLES_VERSION,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/metrics.py"
