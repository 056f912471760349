# Stage 2: the z-free (entangled) model on the task mixture; the reference for every cell.
# Trained here (entangle.mode train) or installed from the repository (shipped).


checkpoint entangle:
    input:
        unpack(after_base("entangle", lambda w: {**P.data_files(), **shipped_files()})),
    output:
        **P.entangle_files(MODE),
    log:
        str(P.base_logs_dir / "entangle.log"),
    benchmark:
        str(P.bench_path("entangle"))
    threads: THREADS_BASE
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_entangle"]),
    params:
        settings=sections(*BASE_SECTIONS),
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/stage.py"
