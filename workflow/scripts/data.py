from _stage import logged, stage_config

from latentstrat import data
from latentstrat.config import base_settings, dump_json

with logged(snakemake):
    cfg = stage_config(snakemake)
    data.build_dataset(cfg["data"], snakemake.output.base_config.rsplit("/", 1)[0])
    dump_json(base_settings(cfg), snakemake.output.base_config)
