from _stage import logged, stage_config

from latentstrat import probes

with logged(snakemake):
    cfg = stage_config(snakemake)
    probes.probe_task(cfg, snakemake.input.records, snakemake.wildcards.task, snakemake.output[0])
