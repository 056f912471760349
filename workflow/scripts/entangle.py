from pathlib import Path

from _stage import logged, stage_config

from latentstrat.base import entangle

with logged(snakemake):
    cfg = stage_config(snakemake)
    data_dir = Path(snakemake.input.tokenizer).parent
    out_dir = Path(snakemake.output.quality).parent
    shipped = snakemake.input.get("shipped")
    entangle.run_entangle(
        cfg, data_dir, out_dir, snakemake.threads, shipped_dir=Path(shipped).parent if shipped else None
    )
