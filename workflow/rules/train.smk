# Stage 4 (per cell): disentangle router / generator / posterior. Checkpoints under
# train/checkpoints/ are not outputs, so a preempted or cancelled job resumes from them.
# The cells that start from one model (same init settings and training seed: the two arms of a
# pair) share its step-0 validation.


checkpoint step0:
    input:
        unpack(after_base("step0", lambda w: {**P.data_files(), **P.entangled_model_files(MODE)})),
    output:
        **P.step0_files("{init}"),
    log:
        str(P.log_path("step0", "{init}")),
    benchmark:
        str(P.bench_path("step0", "{init}"))
    threads: RES["threads"]
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_evaluate"]),
    params:
        init=init_json,
        entangle_dir=entangle_dir,
        settings=sections(*EVALUATE_SECTIONS, "probes"),
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/step0.py"


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
        "../scripts/train.py"
