# Stage 6 (per cell x task) and the cell's metrics row. The probe jobs and the metrics job of
# one cell are connected through `metrics`, so the group "probe" makes them ONE submission per
# cell on Slurm (the jobs of a group run together in one allocation).


rule probe_task:
    input:
        records=str(P.records_path("{cell}")),
    output:
        str(P.probe_path("{cell}", "{task}")),
    params:
        settings=sections("probes"),
    log:
        str(LOGS / "probe" / "{cell}" / "{task}.log"),
    benchmark:
        str(BENCH / "probe" / "{cell}" / "{task}.tsv")
    group:
        "probe"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
        **SLURM,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/probe_task.py"


rule probe_global:
    input:
        records=str(P.records_path("{cell}")),
    output:
        str(P.probe_path("{cell}", "global")),
    params:
        settings=sections("probes"),
    log:
        str(LOGS / "probe" / "{cell}" / "global.log"),
    benchmark:
        str(BENCH / "probe" / "{cell}" / "global.tsv")
    group:
        "probe"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
        **SLURM,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/probe_global.py"


rule metrics:
    input:
        records=str(P.records_path("{cell}")),
        probes=lambda w: probe_files(w.cell),
    output:
        str(P.metrics_path("{cell}")),
    params:
        cell=cell_json,
        settings=sections("probes"),
    log:
        str(LOGS / "metrics" / "{cell}.log"),
    benchmark:
        str(BENCH / "metrics" / "{cell}.tsv")
    group:
        "probe"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
        **SLURM,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/metrics.py"
