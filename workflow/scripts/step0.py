from pathlib import Path

from _stage import logged, stage_config

from latentstrat.cell import step0

with logged(snakemake):
    cfg = stage_config(snakemake)
    step0.step0_validation(
        cfg,
        snakemake.params.init,
        data_dir=Path(snakemake.input.tokenizer).parent,
        entangle_dir=Path(snakemake.params.entangle_dir),
        out_dir=Path(snakemake.output.measured).parent,
        threads=snakemake.threads,
    )
