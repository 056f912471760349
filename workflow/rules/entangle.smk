# Stage 2: the z-free (entangled) model on the task mixture; the reference for every cell.


rule entangle:
    input:
        **data_files(),
    output:
        **entangle_files(),
    params:
        settings=sections(*BASE_SECTIONS),
    log:
        str(BASE_LOGS / "entangle.log"),
    benchmark:
        str(BASE_BENCH / "entangle.tsv")
    threads: RES["threads"]
    resources:
        mem_mb=RES["mem_mb"],
        runtime=RES["runtime_entangle"],
        gpu=GPU,
        **SLURM,
    conda:
        "../../envs/latentstrat.yaml"
    script:
        "../scripts/entangle.py"
