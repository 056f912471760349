from pathlib import Path

from _stage import logged, stage_config

from latentstrat.cell import evaluate

with logged(snakemake):
    cfg = stage_config(snakemake)
    evaluate.evaluate_cell(
        cfg,
        snakemake.params.cell,
        data_dir=Path(snakemake.input.tokenizer).parent,
        entangle_dir=Path(snakemake.params.entangle_dir),
        reference_dir=Path(snakemake.input.scales).parent,
        train_dir=Path(snakemake.input.summary).parent,
        out_path=snakemake.output.records,
        threads=snakemake.threads,
    )
