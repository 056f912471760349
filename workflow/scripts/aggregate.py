from _stage import logged, stage_config

from latentstrat.aggregate.collection import aggregate_collection

with logged(snakemake):
    cfg = stage_config(snakemake)
    cells = snakemake.params.cells
    aggregate_collection(
        cfg,
        dict(zip(cells, snakemake.input.rows)),
        dict(zip(cells, snakemake.input.history)),
        snakemake.output[0],
        quality_path=snakemake.input.quality,
        bench_dir=snakemake.params.bench_dir,
        configfile=snakemake.params.configfile,
    )
