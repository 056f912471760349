from pathlib import Path

from _stage import logged, stage_config

from latentstrat.base import data
from latentstrat.config import base_settings

with logged(snakemake):
    cfg = stage_config(snakemake)
    out_dir = Path(snakemake.output.base_config).parent
    data.build_dataset(cfg["data"], out_dir, base_config=base_settings(cfg), backbone_cfg=cfg["backbone"])
