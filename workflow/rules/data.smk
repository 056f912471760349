# Stage 1: synthetic tasks -> parquet splits, tokenizer, data card (shared by the base).


checkpoint data:
    output:
        train=f"{BASE}/data/train.parquet",
        validation=f"{BASE}/data/validation.parquet",
        test=f"{BASE}/data/test.parquet",
        tokenizer=f"{BASE}/data/tokenizer.json",
        tokenizer_info=f"{BASE}/data/tokenizer_info.json",
        card=f"{BASE}/data/data_card.parquet",
        base_config=f"{BASE}/data/base_config.json",
    log:
        f"{BASE}/logs/data.log",
    benchmark:
        f"{BASE}/benchmarks/data.tsv"
    conda:
        "../../envs/latentstrat.yaml"
    threads: 1
    resources:
        **job_resources("cpu", RES["mem_mb"], 30),
    params:
        settings=settings("data"),
    script:
        "../scripts/stage.py"
