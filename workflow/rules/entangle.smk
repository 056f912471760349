# Stage 2: the z-free (entangled) model on the task mixture; the reference for every cell.
# Trained here (entangle.mode train) or installed from the repository (shipped).


checkpoint entangle:
    input:
        unpack(after_base("entangle", lambda w: {**P.data_files(), **shipped_files()})),
    output:
        **entangled_model_outputs(
            entangle_config=f"{BASE}/entangle/model/config.json",
            entangle_weights=f"{BASE}/entangle/model/model.safetensors",
            shipped_reference=f"{BASE}/entangle/reference_tokens.parquet",
        ),
        quality=f"{BASE}/entangle/quality.json",
        entangle_history=f"{BASE}/entangle/history.parquet",
        # the model, unless `entangle.mode: skip`; with `shipped`, the reference table shipped with it
    log:
        f"{BASE}/logs/entangle.log",
    benchmark:
        f"{BASE}/benchmarks/entangle.tsv"
    conda:
        "../../envs/latentstrat.yaml"
    threads: THREADS_BASE
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_entangle"]),
    params:
        settings=settings("entangle"),
    script:
        "../scripts/stage.py"
