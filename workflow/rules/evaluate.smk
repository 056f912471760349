# Stage 5 (per cell): router-sampled generations on the test split, verified and matched;
# posterior means; per-example losses. One parquet row per test example.


rule evaluate:
    input:
        **data_files(),
        **entangle_files(),
        **reference_files(),
        **train_files("{cell}"),
    output:
        records=str(P.records_path("{cell}")),
    log:
        str(LOGS / "evaluate" / "{cell}.log"),
    benchmark:
        str(BENCH / "evaluate" / "{cell}.tsv")
    conda:
        "../../envs/latentstrat.yaml"
    threads: RES["threads"]
    resources:
        **SLURM,
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_evaluate"],
        gpu=GPU,
    params:
        cell=cell_work_json,
        settings=sections(*EVALUATE_SECTIONS),
    script:
        "../scripts/evaluate.py"
