# Stage 1: synthetic tasks -> parquet splits, tokenizer, data card (shared by the base).


checkpoint data:
    output:
        **P.data_files(),
        card=str(P.data_card),
        base_config=str(P.base_config),
    log:
        str(P.base_logs_dir / "data.log"),
    benchmark:
        str(P.bench_path("data"))
    threads: 1
    resources:
        **job_resources("cpu", RES["mem_mb"], 30),
    params:
        settings=sections(*BASE_SECTIONS),
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/stage.py"
