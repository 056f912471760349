# Stage 7 (per collection): collection tables from every cell's metrics and history.
# Package code is not an input of the cell rules (editing it never retrains); the aggregate
# and report code ARE inputs here, so editing them reruns only aggregate + report.


def code_files(*relpaths):
    """Existing package source files under src/latentstrat (files or folders of *.py)."""
    out = []
    for rel in relpaths:
        p = SRC / rel
        out += sorted(str(f) for f in p.glob("*.py")) if p.is_dir() else [str(p)] * p.exists()
    return out


def reference_tables():
    return [arm["table"] for arm in external_arms(CFG)]


COLLECTION_SETTINGS = {k: v for k, v in CFG.items() if k != "resources"}


rule aggregate:
    input:
        metrics=metrics_files(),
        history=history_files(),
        reference_tables=reference_tables(),
        code=code_files("aggregate.py", "metrics.py"),
    output:
        directory(str(P.aggregate_dir)),
    params:
        settings=COLLECTION_SETTINGS,
    log:
        str(LOGS / "aggregate.log"),
    benchmark:
        str(BENCH / "aggregate.tsv")
    threads: 1
    resources:
        mem_mb=4000,
        runtime=15,
        **SLURM,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/aggregate.py"
