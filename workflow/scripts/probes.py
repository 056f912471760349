from _stage import logged, stage_config

from latentstrat.cell import probes

with logged(snakemake):
    cfg = stage_config(snakemake)
    probes.probe_cell(cfg, snakemake.input.records, snakemake.params.tasks, list(snakemake.output))
