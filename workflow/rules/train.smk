# Stage 4b (per cell): disentangle router / generator / posterior. Checkpoints under
# train/checkpoints/ are not outputs, so a preempted or cancelled job resumes from them.
# Its step-0 validation comes from the step0 stage (step0.smk).


rule train:
    input:
        unpack(after_base("cell", train_inputs)),
    output:
        **P.train_files("{cell}"),
    log:
        str(P.log_path("train", "{cell}")),
    benchmark:
        str(P.bench_path("train", "{cell}"))
    threads: RES["threads"]
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_train"]),
    params:
        cell=cell_work_json,
        entangle_dir=entangle_dir,
        settings=sections(*TRAIN_SECTIONS),
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/stage.py"
