from pathlib import Path

from _stage import logged, stage_config

from latentstrat import report

with logged(snakemake):
    cfg = stage_config(snakemake)
    meta = {"collection": cfg["collection"], "config": cfg, "cells": list(snakemake.params.cells)}
    report.build_report(snakemake.input.aggregate, Path(snakemake.output.results).parent, meta)
