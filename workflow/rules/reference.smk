# Stage 3: per-token z-free NLL b_it for every example, S_ref / T_ref scales, token counts.


rule reference:
    input:
        **data_files(),
        **entangle_files(),
    output:
        **reference_files(),
    log:
        str(BASE_LOGS / "reference.log"),
    benchmark:
        str(BASE_BENCH / "reference.tsv")
    threads: THREADS_BASE
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_evaluate"]),
    params:
        settings=sections(*BASE_SECTIONS),
    script:
        "../scripts/reference.py"
