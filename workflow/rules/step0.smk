# Stage 4a (per init): the step-0 validation of a model every cell of one init starts from (the
# same init settings and training seed: the two arms of a pair), shared by those cells.


checkpoint step0:
    input:
        unpack(after_base("step0", lambda w: {**P.data_files(), **P.entangled_model_files(MODE)})),
    output:
        passes=f"{INIT}/passes.parquet",
        measured=f"{INIT}/measured.json",
    log:
        f"{COLLECTION}/logs/step0/{{init}}.log",
    benchmark:
        f"{COLLECTION}/benchmarks/step0/{{init}}.tsv"
    priority: init_priority
    conda:
        "../../envs/latentstrat.yaml"
    threads: RES["threads"]
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_evaluate"]),
    params:
        init=init_json,
        entangle_dir=ENTANGLE_DIR,
        settings=settings("step0"),
    script:
        "../scripts/stage.py"
