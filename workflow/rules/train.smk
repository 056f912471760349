# Stage 4 (per cell): disentangle router / generator / posterior. Checkpoints under
# train/checkpoints/ are not outputs, so a preempted or cancelled job resumes from them.


rule train:
    input:
        **base_files(),
    output:
        **P.train_files("{cell}"),
    log:
        str(P.logs_dir / "train" / "{cell}.log"),
    benchmark:
        str(P.bench_dir / "train" / "{cell}.tsv")
    threads: RES["threads"]
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_train"]),
    params:
        cell=cell_work_json,
        settings=sections(*TRAIN_SECTIONS),
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/train.py"
