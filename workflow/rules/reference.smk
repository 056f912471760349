# Stage 3: per-token z-free NLL b_it for every example, S_ref / T_ref scales, token counts.


rule reference:
    input:
        **data_files(),
        **entangle_files(),
    output:
        **reference_files(),
    params:
        settings=sections(*BASE_SECTIONS),
    log:
        str(BASE_LOGS / "reference.log"),
    benchmark:
        str(BASE_BENCH / "reference.tsv")
    threads: RES["threads"]
    resources:
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_evaluate"],
        gpu=GPU,
        **SLURM,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/reference.py"
