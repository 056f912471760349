# latentstrat: a grid of latent-strategy models, trained, evaluated, probed, aggregated and
# reported per collection. `snakemake -n` shows the grid; `snakemake --profile slurm` runs it.
# The collection config is config/config.yaml unless --configfile names another one.
from snakemake.utils import min_version

min_version("9.0")


if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"


wildcard_constraints:
    cell="[^/]+",
    init="[^/]+",
    task=TASK_PATTERN,


# one rule file per stage, in pipeline order (latentstrat.stages declares them)
for _stage in STAGES:

    include: f"workflow/rules/{_stage.name}.smk"


# the rules' path templates are where the package reads (latentstrat.paths)
check_layout(rules)


# `snakemake --report report.html`: the landing page carries the headline once the report job ran
report: landing_page()


rule all:
    default_target: True
    input:
        all_targets(),


onerror:
    partial_report(log)
