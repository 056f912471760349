# Stage 5 (per cell): router-sampled generations on the test split, verified and matched;
# posterior means; per-example losses. One parquet row per test example.


rule evaluate:
    input:
        unpack(after_base("cell", lambda w: {**base_files(), **P.train_files(w.cell)})),
    output:
        records=str(P.records_path("{cell}")),
    log:
        str(P.log_path("evaluate", "{cell}")),
    benchmark:
        str(P.bench_path("evaluate", "{cell}"))
    threads: RES["threads"]
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_evaluate"]),
    params:
        cell=cell_work_json,
        entangle_dir=entangle_dir,
        settings=sections(*EVALUATE_SECTIONS),
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/stage.py"
