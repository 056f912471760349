# Glue between the collection config and the rules: validate the config (latentstrat.config),
# input functions, params, resources and the final outputs. The cells come from
# latentstrat.cells, file names and the layout from latentstrat.paths; the base guard and the
# partial report live in the package too.
import json
import logging
import re
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from latentstrat.cells import expand_cells, external_arms, init_id, init_settings, training_seed
from latentstrat.config import ConfigError, base_guard, describe, from_snakemake, tokenizer_identity
from latentstrat.metrics import CELL_TABLES_VERSION
from latentstrat.paths import Paths
from latentstrat.stages import STAGES
from latentstrat.status import start_line
from latentstrat.base.shipped import MANIFEST, bases_root

CONFIG_FILE = (list(workflow.overwrite_configfiles) or ["config/config.yaml"])[-1]
try:
    CFG = from_snakemake(config, workflow.config_settings.config, CONFIG_FILE)
except ConfigError as e:
    raise WorkflowError(f"invalid collection config: {e}") from None

P = Paths.from_config(CFG)
# The roots the rules' path templates start from; the file names below them are written out in
# each rule and held equal to the package's layout (latentstrat.paths, which the stages, the
# status command and the partial report read) by check_layout when the workflow loads.
BASE = str(P.base_dir)  # <results_dir>/base/<base>: shared by the collections on one base
WORK = str(P.cell_dir("{cell}"))  # <BASE>/cells/<work key>/{cell}: a cell's work, shared likewise
INIT = str(P.step0_dir("{init}"))  # <BASE>/step0/<work key>/{init}: one model as built
COLLECTION = str(P.collection_dir)  # <results_dir>/<collection>: rows, logs, tables, report
CELLS = {c.cell_id: c for c in expand_cells(CFG)}
TASKS = list(CFG["data"]["tasks"])
# the cells' models as built (cells.INIT_KEYS, the training seed among them): the cells that
# agree on them, the two arms of a pair, share one step-0 validation
INITS = {init_id(c.settings): init_settings(c.settings) for c in CELLS.values()}
RES = CFG["resources"]
MODE = CFG["entangle"]["mode"]
_first, *_arms = describe(CFG)
if workflow.is_main_process:
    try:  # cell jobs at once: --cores / threads per cell job locally, --jobs on a cluster
        _parallel = (workflow._cores or 0) // max(RES["threads"], 1) if workflow.local_exec else workflow.nodes
    except (TypeError, ValueError):
        _parallel = None
    _arms.append(start_line(CFG, _parallel))
logger.info(
    "\n".join(
        [
            f"{_first}; data stage tokenizer: {tokenizer_identity(CFG['backbone'])}; entangled model: {MODE}",
            *_arms,
        ]
    )
)


wildcard_constraints:
    cell="[^/]+",
    init="[^/]+",
    task="|".join(re.escape(t) for t in TASKS),


# a base folder built with other settings is never reused
if P.base_config.exists():
    try:
        _why = base_guard(json.loads(P.base_config.read_text()), CFG)
    except json.JSONDecodeError as e:
        raise WorkflowError(f"{P.base_config} is not valid JSON ({e}); delete it or the base") from None
    if _why:
        raise WorkflowError(f"{_why} (base folder: {P.base_dir})")

# `entangle.mode: shipped`: the base's entangled model shipped in this repository
SHIPPED = bases_root(workflow.basedir) / CFG["base"]
if MODE == "shipped" and not (SHIPPED / MANIFEST).is_file():
    _have = sorted(d.name for d in SHIPPED.parent.glob("*/")) if SHIPPED.parent.is_dir() else []
    raise WorkflowError(
        f"entangle.mode is 'shipped' but this repository ships no base {CFG['base']!r} ({SHIPPED} "
        f"has no {MANIFEST}; shipped bases: {', '.join(_have) or 'none'}). "
        f"Train it with --config entangle='{{mode: train}}'."
    )


# ----------------------------------------------------------------------------- params
# Each rule gets, as params, exactly the config sections its stage reads; Snakemake's `params`
# rerun trigger then reruns a job only when those change. Base and cell-work params name no
# collection, so collections on one base share those jobs' outputs.
BASE_SECTIONS = ("base", "data", "backbone", "entangle")
TRAIN_SECTIONS = BASE_SECTIONS + ("lora", "train")
EVALUATE_SECTIONS = TRAIN_SECTIONS + ("evaluate",)
COLLECTION_SETTINGS = {k: v for k, v in CFG.items() if k != "resources"}


def sections(*names):
    return {k: CFG[k] for k in names}


def _cell(wildcards):
    if wildcards.cell not in CELLS:
        raise WorkflowError(f"unknown cell {wildcards.cell!r}: not in the grid of collection {CFG['collection']!r}")
    return CELLS[wildcards.cell]


def cell_json(wildcards):
    """The cell as this collection sees it (arm and role too): for its metrics row."""
    return _cell(wildcards).to_json()


def init_json(wildcards):
    """The settings of a model as built (the step-0 validation's params)."""
    if wildcards.init not in INITS:
        raise WorkflowError(
            f"unknown init {wildcards.init!r}: no cell of collection {CFG['collection']!r} starts from it"
        )
    return INITS[wildcards.init]


def cell_work_json(wildcards):
    """The cell's id, settings and training seed (cells.training_seed; no arm or role): what its
    shared work depends on."""
    c = _cell(wildcards)
    return {"cell_id": c.cell_id, **c.settings, "training_seed": training_seed(c.settings)}


# ----------------------------------------------------------------------------- resources
# entangle and reference run alone, before any cell: they may take more threads than a cell
THREADS_BASE = RES["threads_base"] or RES["threads"]
MODEL_JOB = "gpu" if RES["gpu"] > 0 else "cpu"  # entangle, reference, train, evaluate


def job_resources(kind, mem_mb, runtime):
    """A job's Slurm partition / account / qos / constraint (and GPUs, GPU model) from
    `resources.slurm.<kind>` (else `resources.slurm_partition` / `slurm_account`); memory and
    runtime grow with each retry."""
    s = RES["slurm"][kind]
    out = {
        "slurm_partition": s["partition"] or RES["slurm_partition"],
        "slurm_account": s["account"] or RES["slurm_account"],
        "qos": s["qos"],
        "constraint": s["constraint"],
    }
    out = {k: v for k, v in out.items() if v}
    if kind == "gpu" and s.get("gres"):  # a share of a GPU (e.g. shard:1): several cells per GPU
        out["gres"] = s["gres"]
    elif kind == "gpu":
        out["gpu"] = RES["gpu"]
        if s.get("gpu_model"):
            out["gpu_model"] = s["gpu_model"]
    out["mem_mb"] = lambda wildcards, attempt: mem_mb * attempt
    out["runtime"] = lambda wildcards, attempt: runtime * attempt
    return out


# ----------------------------------------------------------------------------- layout


def entangled_model_outputs(entangle_config, entangle_weights, shipped_reference):
    """The entangle stage's mode-dependent outputs: the model unless `entangle.mode: skip`, and
    with `shipped` the reference table shipped with it."""
    files = {} if MODE == "skip" else {"entangle_config": entangle_config, "entangle_weights": entangle_weights}
    return files | ({"shipped_reference": shipped_reference} if MODE == "shipped" else {})


def check_layout(rules):
    """Each stage's rule writes where latentstrat.paths says: its named outputs (the probes' and
    the aggregate's in order; a stage the layout does not know, only its rule writes), its log
    and its benchmark. A rule file and the package that disagree are a WorkflowError naming the
    rule and the file, before any job runs."""
    key = {"init": "{init}", "cell": "{cell}"}
    want = {
        "data": {**P.data_files(), "card": str(P.data_card), "base_config": str(P.base_config)},
        "entangle": P.entangle_files(MODE),
        "reference": P.reference_files(),
        "step0": P.step0_files("{init}"),
        "train": P.train_files("{cell}"),
        "evaluate": {"records": str(P.records_path("{cell}"))},
        "probes": dict(enumerate(P.probe_files("{cell}", TASKS))),
        "tabulate": {"row": str(P.row_path("{cell}")), "bootstrap": str(P.bootstrap_path("{cell}"))},
        "aggregate": {0: str(P.aggregate_dir)},
        "report": {
            **P.report_files(),
            "figures": str(P.report_dir / "figures"),
            "figure_pages": str(P.report_dir / "figure_pages"),
            "pages": str(P.report_dir / "html"),
        },
    }
    for stage in STAGES:
        declared = getattr(rules, stage.name)
        named = dict(declared.output.items()) or dict(enumerate(declared.output))
        have = {k: str(v) for k, v in named.items()}
        if stage.level in key:
            log = P.log_path(stage.name, key[stage.level])
        else:
            log = (P.base_logs_dir if stage.level == "base" else P.logs_dir) / f"{stage.name}.log"
        have["log"], want_log = str(declared.log[0]), str(log)
        have["benchmark"] = str(declared.benchmark)
        expected = {
            **want.get(stage.name, have),
            "log": want_log,
            "benchmark": str(P.bench_path(stage.name, key.get(stage.level, ""))),
        }
        for name in sorted(set(have) | set(expected), key=str):
            if have.get(name) != expected.get(name):
                raise WorkflowError(
                    f"rule {stage.name} (workflow/rules/{stage.name}.smk): its {name} is {have.get(name)!r} "
                    f"but latentstrat.paths lays it out as {expected.get(name)!r}; edit both together"
                )


# ----------------------------------------------------------------------------- inputs


def shipped_files():
    """The entangle stage's input with `entangle.mode: shipped`: the shipped base's manifest."""
    return {"shipped": str(SHIPPED / MANIFEST)} if MODE == "shipped" else {}


def entangle_dir(wildcards):
    """The entangle stage's folder, from the model files a job reads (with `entangle.mode: skip`,
    from the quality record standing for the backbone)."""
    files = P.entangled_model_files(MODE)
    if "entangle_config" in files:
        return str(Path(files["entangle_config"]).parent.parent)
    return str(Path(files["quality"]).parent)


def base_files():
    """What every cell job reads: the data, the entangled model and the reference."""
    return {**P.data_files(), **P.entangled_model_files(MODE), **P.reference_files()}


def step0_files(cid):
    """A cell's shared step-0 validation (its init's), as inputs named step0_*."""
    return {f"step0_{k}": v for k, v in P.step0_files(init_id(CELLS[cid].settings)).items()}


def train_inputs(wildcards):
    """What a cell's train job reads: the base and its init's step-0 validation."""
    return {**base_files(), **step0_files(_cell(wildcards).cell_id)}


# ----------------------------------------------------------------------------- a lost base
# The base stages (data, entangle, reference, step0) are checkpoints. When one of their folders
# is lost while work downstream of it exists, every later job asks for its inputs only once the
# base stages are back: Snakemake then decides again which jobs need to run, and inputs that
# came back with the same bytes rerun nothing (docs/rerun-policy.md). Otherwise (a fresh or an
# intact base) the whole DAG is built at once and `snakemake -n` shows every job.
BASE_STAGE_FILES = {
    "data": [*P.data_files().values(), str(P.data_card), str(P.base_config)],
    "entangle": list(P.entangle_files(MODE).values()),
    "reference": list(P.reference_files().values()),
    "step0": [f for iid in INITS for f in P.step0_files(iid).values()],
}
# the base stages each stage reads ("cell": every job after the base)
UPSTREAM = {
    "entangle": ("data",),
    "reference": ("data", "entangle"),
    "step0": ("data", "entangle"),
    "cell": tuple(BASE_STAGE_FILES),
}


def lost_base_stages():
    """The base stages with a missing output while a later stage's output (or a cell's trained
    model) exists: a lost base folder, not a base still to be built. A step-0 validation is lost
    only when a cell that starts from its model was trained: a new setting's (its own training
    seed, its own model) is still to be built."""
    stages = list(BASE_STAGE_FILES)
    # what reads a stage's outputs (UPSTREAM), not what comes after it in order: step0 does not
    # read the reference, so a reference still to run beside a finished step0 is not lost
    later = {s: [f for t in stages if s in UPSTREAM.get(t, ()) for f in BASE_STAGE_FILES[t]] for s in stages}
    trained = {cid: P.train_files(cid)["summary"] for cid in CELLS}

    def lost(s):
        if s == "step0":
            return any(
                any(not Path(f).exists() for f in P.step0_files(init_id(c.settings)).values())
                and Path(trained[cid]).exists()
                for cid, c in CELLS.items()
            )
        return any(not Path(f).exists() for f in BASE_STAGE_FILES[s]) and any(
            Path(f).exists() for f in later[s] + list(trained.values())
        )

    return [s for s in stages if lost(s)]


class _NoLockNotice(logging.Filter):
    """`--nolock` (a dry run beside a running collection): Snakemake 9 still prints its lock
    notice in a dry run ("Error: Directory cannot be locked": its warn-only locking overrides
    --nolock); the user asked for no lock, so the notice is dropped. The execution settings
    reach the workflow after this file is read, so they are read when a record is logged."""

    def filter(self, record):
        settings = workflow.execution_settings
        nolock = settings is not None and not settings.lock
        return not (nolock and "Directory cannot be locked" in record.getMessage())


logger.addFilter(_NoLockNotice())


LOST_BASE = lost_base_stages()
if LOST_BASE:
    logger.info(
        f"base stage(s) {', '.join(LOST_BASE)} lost while later work exists: they run first, then "
        "Snakemake decides again which later jobs need to run (same bytes: none)"
    )


def after_base(stage, files):
    """An input function for `stage`'s rule ("cell": every rule after the base): `files(wildcards)`,
    asked for after the base stages it reads are complete when a base stage was lost."""

    def inputs(wildcards):
        if LOST_BASE:
            for s in UPSTREAM[stage]:
                for init in (INITS if s == "step0" else [None]):
                    getattr(checkpoints, s).get(**({"init": init} if init else {}))
        return files(wildcards)

    return inputs


def code_files(*relpaths):
    """Existing package sources under src/latentstrat (files, or folders of *.py): inputs of
    the aggregate and report rules only, so editing them reruns those and never trains."""
    src = Path(workflow.basedir) / "src" / "latentstrat"
    return [
        str(f)
        for rel in relpaths
        for f in (sorted((src / rel).glob("*.py")) if (src / rel).is_dir() else [src / rel] * (src / rel).exists())
    ]


def comparison_tables():
    return [arm["table"] for arm in external_arms(CFG)]


# ----------------------------------------------------------------------------- final outputs


def all_targets():
    """Every declared output of the collection, not only the report: Snakemake checks missing
    outputs only for target jobs, so a deleted (or removed, corrupt) cell file reruns its job
    and everything downstream of it, and nothing else."""
    files = [f for stage_files in BASE_STAGE_FILES.values() for f in stage_files]
    for cid in CELLS:
        files += [
            *P.train_files(cid).values(),
            str(P.records_path(cid)),
            *P.probe_files(cid, TASKS),
            str(P.row_path(cid)),
        ]
    return files + [*P.report_files().values()]


def partial_report(log):
    """After a failed run: aggregate and report the finished cells (latentstrat.report.partial)."""
    from latentstrat.report.partial import partial_report as write_partial

    try:
        write_partial(CFG, log=logger.warning)
    except Exception as e:  # never mask the original failure
        logger.error(f"partial report failed: {type(e).__name__}: {e}")


def landing_page():
    """The HTML report's landing page: the one the report job wrote (the headline with its numbers),
    else the static one (before any report)."""
    landing = Path(P.report_files()["landing"]).resolve()
    return str(landing) if landing.exists() else "workflow/report/workflow.rst"
