# Stage 2: the z-free (entangled) model on the task mixture; the reference for every cell.
# Trained here (entangle.mode train) or installed from the repository (shipped).


rule entangle:
    input:
        **data_files(),
        **shipped_files(),
    output:
        **entangle_files(),
    log:
        str(BASE_LOGS / "entangle.log"),
    benchmark:
        str(BASE_BENCH / "entangle.tsv")
    threads: THREADS_BASE
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_entangle"]),
    params:
        settings=sections(*BASE_SECTIONS),
    script:
        "../scripts/entangle.py"
