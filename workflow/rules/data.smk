# Stage 1: synthetic tasks -> parquet splits, tokenizer, data card (shared by the base).


rule data:
    output:
        **data_files(),
        card=str(P.data_dir / "data_card.parquet"),
        base_config=str(BASE_CONFIG),
    params:
        settings=sections(*BASE_SECTIONS),
    log:
        str(BASE_LOGS / "data.log"),
    benchmark:
        str(BASE_BENCH / "data.tsv")
    threads: 1
    resources:
        mem_mb=RES["mem_mb"],
        runtime=30,
        **SLURM,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/data.py"
