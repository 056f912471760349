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
    params:
        cell=cell_json,
        settings=sections(*EVALUATE_SECTIONS),
    log:
        str(LOGS / "evaluate" / "{cell}.log"),
    benchmark:
        str(BENCH / "evaluate" / "{cell}.tsv")
    threads: RES["threads"]
    resources:
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_evaluate"],
        gpu=GPU,
        **SLURM,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/evaluate.py"
