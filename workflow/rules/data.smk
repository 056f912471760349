# Stage 1: synthetic tasks -> parquet splits, tokenizer, data card (shared by the base).


rule data:
    output:
        **data_files(),
        card=str(P.data_dir / "data_card.parquet"),
        base_config=str(BASE_CONFIG),
    log:
        str(BASE_LOGS / "data.log"),
    benchmark:
        str(BASE_BENCH / "data.tsv")
    threads: 1
    resources:
        **job_resources("cpu", RES["mem_mb"], 30),
    params:
        settings=sections(*BASE_SECTIONS),
    script:
        "../scripts/data.py"
