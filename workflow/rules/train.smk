# Stage 4b (per cell): disentangle router / generator / posterior. Checkpoints under
# train/checkpoints/ are not outputs, so a preempted or cancelled job resumes from them.
# Its step-0 validation comes from the step0 stage (step0.smk).


rule train:
    input:
        unpack(after_base("cell", train_inputs)),
    output:
        heads=f"{WORK}/train/heads/heads.safetensors",
        heads_config=f"{WORK}/train/heads/config.json",
        history=f"{WORK}/train/history.parquet",
        summary=f"{WORK}/train/summary.json",
    log:
        f"{COLLECTION}/logs/train/{{cell}}.log",
    benchmark:
        f"{COLLECTION}/benchmarks/train/{{cell}}.tsv"
    priority: cell_priority
    conda:
        "../../envs/latentstrat.yaml"
    threads: RES["threads"]
    resources:
        **job_resources(MODEL_JOB, RES["mem_mb"], RES["runtime_train"]),
    params:
        cell=cell_work_json,
        entangle_dir=ENTANGLE_DIR,
        settings=settings("train"),
    script:
        "../scripts/stage.py"
