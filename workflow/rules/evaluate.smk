# Stage 5 (per cell): router-sampled generations on the test split, verified and matched;
# posterior means; per-example losses. One parquet row per test example.


rule evaluate:
    input:
        unpack(after_base("cell", lambda w: {**base_files(), **P.train_files(w.cell)})),
    output:
        records=f"{WORK}/evaluate/records.parquet",
    log:
        f"{COLLECTION}/logs/evaluate/{{cell}}.log",
    benchmark:
        f"{COLLECTION}/benchmarks/evaluate/{{cell}}.tsv"
    priority: cell_priority
    conda:
        "../../envs/latentstrat.yaml"
    threads: RES["threads"]
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_evaluate"]),
    params:
        cell=cell_work_json,
        entangle_dir=ENTANGLE_DIR,
        settings=settings("evaluate"),
    script:
        "../scripts/stage.py"
