# Stage 3: per-token z-free NLL b_it for every example, S_ref / T_ref scales, token counts.


checkpoint reference:
    input:
        unpack(after_base("reference", lambda w: {**P.data_files(), **P.entangled_model_files(MODE)})),
    output:
        tokens=f"{BASE}/reference/tokens.parquet",
        scales=f"{BASE}/reference/scales.json",
        token_counts=f"{BASE}/reference/token_counts.parquet",
    log:
        f"{BASE}/logs/reference.log",
    benchmark:
        f"{BASE}/benchmarks/reference.tsv"
    conda:
        "../../envs/latentstrat.yaml"
    threads: THREADS_BASE
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_evaluate"]),
    params:
        entangle_dir=ENTANGLE_DIR,
        settings=settings("reference"),
    script:
        "../scripts/stage.py"
