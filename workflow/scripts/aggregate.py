from _stage import logged, stage_config

from latentstrat import aggregate

with logged(snakemake):
    cfg = stage_config(snakemake)
    aggregate.aggregate_collection(
        cfg, list(snakemake.input.metrics), list(snakemake.input.history), snakemake.output[0]
    )
