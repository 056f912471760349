# The one rule script: the rule's job, built once from snakemake.input/output/params/threads
# (latentstrat.jobs.Job), run by its stage's entry (latentstrat.stages), its output in the log.
from _stage import logged

from latentstrat.jobs import Job
from latentstrat.stages import entry

with logged(snakemake):
    entry(snakemake.rule)(Job.from_rule(snakemake))
