# Glue between the collection config and the rules: the validated config, the roots of the rules'
# path templates, input functions, params and resources, and the final targets. What to check
# and how lives in the package: the config (latentstrat.config), the cells (latentstrat.cells),
# the stages and their files (latentstrat.stages, latentstrat.paths), the base's guard and a lost
# base (latentstrat.base.guard), the layout check and resources (latentstrat.rules).
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from latentstrat.base.guard import base_problem, lost_base_stages, shipped_manifest, upstream
from latentstrat.cells import expand_cells, external_arms, init_id, init_settings, pair_priorities
from latentstrat.config import Base, ConfigError, from_snakemake
from latentstrat.metrics import CELL_TABLES_VERSION
from latentstrat.paths import Paths
from latentstrat import rules as package_rules
from latentstrat.stages import BY_NAME, STAGES

CONFIG_FILE = (list(workflow.overwrite_configfiles) or ["config/config.yaml"])[-1]
try:
    CFG = from_snakemake(config, workflow.config_settings.config, CONFIG_FILE)
except ConfigError as e:
    raise WorkflowError(f"invalid collection config: {e}") from None
_why = base_problem(Base.of(CFG), Paths.from_config(CFG), workflow.basedir)  # a base built otherwise is never reused
if _why:
    raise WorkflowError(_why)

P = Paths.from_config(CFG)
# the roots the rules' path templates start from; check_layout holds the rules' file names equal
# to the stages' declarations (which the stages, the status command and the partial report read)
BASE = str(P.base_dir)  # <results_dir>/base/<base>: shared by the collections on one base
WORK = str(P.cell_dir("{cell}"))  # <BASE>/cells/<work key>/{cell}: a cell's work, shared likewise
INIT = str(P.step0_dir("{init}"))  # <BASE>/step0/<work key>/{init}: one model as built
COLLECTION = str(P.collection_dir)  # <results_dir>/<collection>: rows, logs, tables, report
CELLS = {c.cell_id: c for c in expand_cells(CFG)}
ARCHIVED = package_rules.archived(P, list(CELLS.values()))  # read from results/archive, never run
TASKS = list(CFG["data"]["tasks"])
# the cells' models as built (the training seed among them): the two arms of a pair share one
INITS = {init_id(c.settings): init_settings(c.settings) for c in CELLS.values()}
PRIORITY = pair_priorities(list(CELLS.values()))  # a pair's cells run together, pairs in replicate order
INIT_PRIORITY = {init_id(c.settings): PRIORITY[cid] for cid, c in CELLS.items()}  # a pair's init is one
RES = CFG["resources"]
MODE = CFG["entangle"]["mode"]
THREADS_BASE = RES["threads_base"] or RES["threads"]  # entangle and reference run before any cell
MODEL_JOB = "gpu" if RES["gpu"] > 0 else "cpu"  # entangle, reference, step0, train, evaluate
ENTANGLE_DIR = str(P.entangle_dir)  # a model job's param: where the entangled model is
_parallel = package_rules.parallel_cell_jobs(workflow, RES["threads"])
logger.info(package_rules.start_message(CFG, _parallel, workflow.is_main_process, CONFIG_FILE))
logger.addFilter(package_rules.NoLockNotice(lambda: workflow.execution_settings))
TASK_PATTERN = "|".join(re.escape(t) for t in TASKS)  # the `task` wildcard (the Snakefile's constraints)


def settings(stage):
    """The config sections a stage reads (its declaration), as its rule's params."""
    return package_rules.stage_settings(CFG, stage)


def job_resources(kind, mem_mb, runtime):
    """A job's Slurm resources from `resources.slurm.<kind>` (latentstrat.rules)."""
    return package_rules.job_resources(RES, kind, mem_mb, runtime)


def check_layout(rules):
    """Each stage's rule writes where its declaration lays it out (its outputs, log and benchmark)."""
    declared = {}
    for stage in STAGES:
        r = getattr(rules, stage.name, None)
        if r is not None:
            declared[stage.name] = (dict(r.output.items()) or dict(enumerate(r.output)), r.log[0], r.benchmark)
    why = package_rules.layout_problem(P, declared, MODE, TASKS)
    if why:
        raise WorkflowError(why)


# ----------------------------------------------------------------------------- inputs
def _cell(wildcards):
    if wildcards.cell not in CELLS:
        raise WorkflowError(f"unknown cell {wildcards.cell!r}: not in the grid of collection {CFG['collection']!r}")
    return CELLS[wildcards.cell]


def cell_json(wildcards):
    """The cell as this collection sees it (arm and role too): for its metrics row."""
    return _cell(wildcards).to_json()


def cell_priority(wildcards):
    """A cell job's priority: its pair's (cells.pair_priorities); a stopped run leaves only the pairs in flight."""
    return PRIORITY.get(wildcards.cell, 0)


def init_priority(wildcards):
    return INIT_PRIORITY.get(wildcards.init, 0)


def init_json(wildcards):
    """The settings of a model as built (the step-0 validation's params)."""
    if wildcards.init not in INITS:
        raise WorkflowError(f"unknown init {wildcards.init!r}: no cell of {CFG['collection']!r} starts from it")
    return INITS[wildcards.init]


def cell_work_json(wildcards):
    """The cell's id, settings and training seed (no arm or role): what its shared work depends on."""
    return _cell(wildcards).work_json()


def entangled_model_outputs(**files):
    """The entangle stage's outputs in this `entangle.mode` (its declaration's `only`)."""
    return {k: v for k, v in files.items() if k in BY_NAME["entangle"].outputs(MODE)}


def shipped_files():
    """The entangle stage's input with `entangle.mode: shipped`: the shipped base's manifest."""
    return {"shipped": str(shipped_manifest(CFG["base"], workflow.basedir))} if MODE == "shipped" else {}


def base_files():
    """What every cell job reads: the data, the entangled model and the reference."""
    return {**P.data_files(), **P.entangled_model_files(MODE), **P.reference_files()}


def train_inputs(wildcards):
    """What a cell's train job reads: the base and its init's step-0 validation (step0_*)."""
    step0 = P.step0_files(init_id(_cell(wildcards).settings))
    return {**base_files(), **{f"step0_{k}": v for k, v in step0.items()}}


def comparison_tables():
    """External summary tables a comparison arm reads (the aggregate's inputs)."""
    return [arm["table"] for arm in external_arms(CFG)]


# The base stages are checkpoints. When one of their folders is lost while work that reads it
# exists, every later job asks for its inputs only once the base stages are back, and Snakemake
# decides again what to run (latentstrat.base.guard); else the whole DAG is built at once.
LOST_BASE = lost_base_stages(P, {cid: init_id(c.settings) for cid, c in CELLS.items()}, MODE)
if LOST_BASE:
    logger.info(
        f"base stage(s) {', '.join(LOST_BASE)} lost while later work exists: they run first, then "
        "Snakemake decides again which later jobs need to run (same bytes: none)"
    )


def after_base(stage, files):
    """An input function for the rule of `stage` ("cell" for every later stage), `files(wildcards)`,
    asked for after the base stages it reads are complete when a base stage was lost."""

    def inputs(wildcards):
        if LOST_BASE:
            for s in upstream(stage):
                for init in INITS if BY_NAME[s].level == "init" else [None]:
                    getattr(checkpoints, s).get(**({"init": init} if init else {}))
        return files(wildcards)

    return inputs


# ----------------------------------------------------------------------------- final targets
def all_targets():
    """Every stage's outputs but the archived cells' (latentstrat.rules.final_targets)."""
    return package_rules.final_targets(P, CELLS, MODE, TASKS, ARCHIVED)


def partial_report(log):
    """After a failed run: aggregate and report the finished cells (latentstrat.report.partial)."""
    from latentstrat.report.partial import partial_report as write_partial

    try:
        write_partial(CFG, log=logger.warning)
    except Exception as e:  # never mask the original failure
        logger.error(f"partial report failed: {type(e).__name__}: {e}")


def landing_page():
    """The HTML report's landing page: the report job's, else the static one (before any report)."""
    landing = Path(P.report_files()["landing"]).resolve()
    return str(landing) if landing.exists() else "workflow/report/workflow.rst"
