from pathlib import Path

from _stage import logged, stage_config

from latentstrat.base import reference

with logged(snakemake):
    cfg = stage_config(snakemake)
    data_dir = Path(snakemake.input.tokenizer).parent
    entangle_dir = Path(snakemake.params.entangle_dir)
    out_dir = Path(snakemake.output.scales).parent
    reference.run_reference(cfg, data_dir, entangle_dir, out_dir, snakemake.threads)
