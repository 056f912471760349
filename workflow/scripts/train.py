from pathlib import Path

from _stage import logged, stage_config

from latentstrat.cell import train

with logged(snakemake):
    cfg = stage_config(snakemake)
    train.train_cell(
        cfg,
        snakemake.params.cell,
        data_dir=Path(snakemake.input.tokenizer).parent,
        entangle_dir=Path(snakemake.params.entangle_dir),
        reference_dir=Path(snakemake.input.scales).parent,
        out_dir=Path(snakemake.output.summary).parent,
        threads=snakemake.threads,
        step0_dir=Path(snakemake.input.step0_measured).parent,
    )
