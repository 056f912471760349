# Config loading, cells, paths, params and resources shared by every rule.
#
# The package (latentstrat.config) is the one place for schema validation, defaults, cell
# expansion, canonical cell ids and the output layout; this file only adapts it to Snakemake.
import copy
import json
import re
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

from latentstrat.config import (
    ConfigError,
    Paths,
    base_guard,
    expand_cells,
    external_arms,
    load_config,
    tokenizer_identity,
)
from latentstrat.shipped import MANIFEST, bases_root


def _typed(value, nested=False):
    """`--config` parses nested values with YAML's BaseLoader (all strings): re-type them."""
    if isinstance(value, dict):
        return {k: _typed(v, True) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v, True) for v in value]
    if nested and isinstance(value, str):
        try:
            typed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        return (
            typed if isinstance(typed, (bool, int, float)) or typed is None else value
        )
    return value


def _deep_update(dst, src):
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_update(dst[k], v)
        else:
            dst[k] = v


_deep_update(config, _typed(dict(workflow.config_settings.config)))

# `extends:` resolves relative to the folder of the config file that says it; made absolute
# here, so the rule scripts (which see `config` as is) resolve the same file
CONFIG_FILE = Path((list(workflow.overwrite_configfiles) or ["config/config.yaml"])[-1])
if config.get("extends") and not Path(config["extends"]).is_absolute():
    config["extends"] = str((CONFIG_FILE.resolve().parent / config["extends"]).resolve())
try:
    CFG = load_config(cfg=config)
except ConfigError as e:
    raise WorkflowError(f"invalid collection config: {e}") from None
# Second check with Snakemake's own validator on the resolved config (same schema).
validate(copy.deepcopy(CFG), schema="../schemas/config.schema.yaml", set_default=False)

P = Paths.from_config(CFG)
CELLS = {c.cell_id: c for c in expand_cells(CFG, validated=True)}
logger.info(
    f"collection {CFG['collection']}: {len(CELLS)} cells on base {CFG['base']}; "
    f"data stage tokenizer: {tokenizer_identity(CFG['backbone'])}"
)
TASKS = list(CFG["data"]["tasks"])
RES = CFG["resources"]
# entangle and reference run alone, before any cell: they may take more threads than a cell
THREADS_BASE = RES["threads_base"] or RES["threads"]
LOGS = P.logs_dir
BENCH = P.collection_dir / "benchmarks"
BASE_LOGS = P.base_dir / "logs"
BASE_BENCH = P.base_dir / "benchmarks"
SRC = Path(workflow.basedir) / "src" / "latentstrat"


wildcard_constraints:
    cell="[^/]+",
    task="|".join(re.escape(t) for t in TASKS),


# ----------------------------------------------------------------------------- base guard


BASE_CONFIG = P.data_dir / "base_config.json"
if BASE_CONFIG.exists():
    try:
        _why = base_guard(json.loads(BASE_CONFIG.read_text()), CFG)
    except json.JSONDecodeError as e:
        raise WorkflowError(f"{BASE_CONFIG} is not valid JSON ({e}); delete it or the base") from None
    if _why:
        raise WorkflowError(f"{_why} (base folder: {P.base_dir})")


# ----------------------------------------------------------------------------- params
# Each rule gets, as params, exactly the config sections its stage reads. Snakemake's
# `params` rerun trigger then reruns a job only when those sections change: a report setting
# never retrains, a train setting retrains every cell, a cell's own settings rerun that cell.


def sections(*names):
    return {k: CFG[k] for k in names}


# Base and cell-work params name no collection: collections on one base share the base stages
# and, with equal CELL_WORK_SECTIONS, each cell's train/evaluate/probe outputs (the path of
# those holds the sections' hash), so running a second collection reruns none of them.
BASE_SECTIONS = ("base", "data", "backbone", "entangle")
TRAIN_SECTIONS = BASE_SECTIONS + ("lora", "train")
EVALUATE_SECTIONS = TRAIN_SECTIONS + ("evaluate",)


def _cell(wildcards):
    if wildcards.cell not in CELLS:
        raise WorkflowError(
            f"unknown cell {wildcards.cell!r}: not in the grid of collection {CFG['collection']!r}"
        )
    return CELLS[wildcards.cell]


def cell_json(wildcards):
    """The cell as this collection sees it (arm and role too): for its metrics row."""
    return _cell(wildcards).to_json()


def cell_work_json(wildcards):
    """The cell's id and settings only (no arm or role): what its shared work depends on."""
    c = _cell(wildcards)
    return {"cell_id": c.cell_id, **c.settings}


# ----------------------------------------------------------------------------- resources


GPU = RES["gpu"]
MODEL_JOB = "gpu" if GPU > 0 else "cpu"  # entangle, reference, train, evaluate


def job_resources(kind, mem_mb, runtime):
    """A job's resources: Slurm partition / account / qos / constraint (and GPUs, GPU model)
    from the config's `resources.slurm.<kind>` (falling back to `resources.slurm_partition` /
    `slurm_account`): the one place to set them; memory and runtime grow with each retry."""
    s = RES["slurm"][kind]
    out = {
        "slurm_partition": s["partition"] or RES["slurm_partition"],
        "slurm_account": s["account"] or RES["slurm_account"],
        "qos": s["qos"],
        "constraint": s["constraint"],
    }
    out = {k: v for k, v in out.items() if v}
    if kind == "gpu":
        out["gpu"] = GPU
        if s.get("gpu_model"):
            out["gpu_model"] = s["gpu_model"]
    out["mem_mb"] = lambda wildcards, attempt: mem_mb * attempt
    out["runtime"] = lambda wildcards, attempt: runtime * attempt
    return out


# ----------------------------------------------------------------------------- paths


def data_files():
    d = P.data_dir
    return {
        "train": str(d / "train.parquet"),
        "validation": str(d / "validation.parquet"),
        "test": str(d / "test.parquet"),
        "tokenizer": str(d / "tokenizer.json"),
        "tokenizer_info": str(d / "tokenizer_info.json"),
    }


def entangle_files():
    """The entangle stage's outputs; with `entangle.mode: skip` (cells with init: direct use
    the backbone as is) it writes no model, only the quality record and an empty history.
    """
    d = P.entangle_dir
    files = {
        "quality": str(d / "quality.json"),
        "entangle_history": str(d / "history.parquet"),
    }
    if CFG["entangle"]["mode"] != "skip":
        files["entangle_config"] = str(d / "model" / "config.json")
        files["entangle_weights"] = str(d / "model" / "model.safetensors")
    return files


# `entangle.mode: shipped`: the base's entangled model shipped in this repository
SHIPPED = bases_root(workflow.basedir) / CFG["base"]


def shipped_files():
    """The entangle stage's input with `entangle.mode: shipped`: the shipped base's manifest."""
    if CFG["entangle"]["mode"] != "shipped":
        return {}
    if not (SHIPPED / MANIFEST).is_file():
        have = sorted(p.name for p in SHIPPED.parent.glob("*/")) if SHIPPED.parent.is_dir() else []
        raise WorkflowError(
            f"entangle.mode is 'shipped' but this repository ships no base {CFG['base']!r} "
            f"({SHIPPED} has no {MANIFEST}; shipped bases: {', '.join(have) or 'none'}). "
            f"Train it with --config entangle='{{mode: train}}'."
        )
    return {"shipped": str(SHIPPED / MANIFEST)}


def reference_files():
    d = P.reference_dir
    return {
        "tokens": str(d / "tokens.parquet"),
        "scales": str(d / "scales.json"),
        "token_counts": str(d / "token_counts.parquet"),
    }


def train_files(cid):
    d = P.train_dir(cid)
    return {
        "cell_model": str(d / "model.safetensors"),
        "history": str(d / "history.parquet"),
        "summary": str(d / "summary.json"),
    }


def probe_files(cid):
    return [str(P.probe_path(cid, t)) for t in TASKS] + [
        str(P.probe_path(cid, "global"))
    ]


def metrics_files():
    return [str(P.metrics_path(c)) for c in CELLS]


def history_files():
    return [train_files(c)["history"] for c in CELLS]


def aggregate_marker():
    return str(P.aggregate_dir / "collection_state.parquet")


def report_targets():
    return [str(P.report_dir / "results.md"), str(P.report_dir / "analysis.md")]


def all_targets():
    """Every declared output of the collection, not only the report.

    Snakemake checks missing outputs only for target jobs: were `all` to ask for the report
    alone, a deleted cell would go unnoticed while the report is up to date. Listing every
    base and cell output makes a deleted (or deliberately removed, corrupt) file rerun its job
    and everything downstream of it, and nothing else.
    """
    files = list(data_files().values()) + list(entangle_files().values())
    files += list(reference_files().values())
    for cid in CELLS:
        files += list(train_files(cid).values()) + [str(P.records_path(cid))]
        files += probe_files(cid) + [str(P.metrics_path(cid))]
    return files + report_targets()


# ----------------------------------------------------------------------------- collection


def code_files(*relpaths):
    """Existing package source files under src/latentstrat (files or folders of *.py)."""
    out = []
    for rel in relpaths:
        p = SRC / rel
        out += (
            sorted(str(f) for f in p.glob("*.py"))
            if p.is_dir()
            else [str(p)] * p.exists()
        )
    return out


def comparison_tables():
    return [arm["table"] for arm in external_arms(CFG)]


COLLECTION_SETTINGS = {k: v for k, v in CFG.items() if k != "resources"}


def partial_report(log):
    """After a failed run (e.g. --keep-going with a failed cell): aggregate and report over
    the cells that finished, listing the others as incomplete. Runs in the main Snakemake
    process; the next complete run replaces these outputs (the missing metrics are newer).
    """
    done = [c for c in CELLS if Path(P.metrics_path(c)).exists()]
    if not done:
        logger.warning("partial report: no cell has metrics yet; nothing to report")
        return
    from latentstrat import aggregate as ls_aggregate
    from latentstrat import report as ls_report

    missing = [c for c in CELLS if c not in done]
    logger.warning(
        f"partial report: {len(done)}/{len(CELLS)} cells complete; "
        f"incomplete: {', '.join(missing) or 'none'} -> {P.report_dir}"
    )
    try:
        quality = entangle_files()["quality"]
        quality = quality if Path(quality).exists() else None
        ls_aggregate.aggregate_collection(
            CFG,
            dict(zip(CELLS, metrics_files())),
            dict(zip(CELLS, history_files())),
            str(P.aggregate_dir),
            quality_path=quality,
            upstream={c: [str(P.records_path(c))] + probe_files(c) for c in CELLS},
        )
        meta = {
            "collection": CFG["collection"],
            "config": CFG,
            "cells": list(CELLS),
            "partial": True,
        }
        if quality:
            meta["entangle_quality"] = ls_report.load_entangle_quality(quality)
        ls_report.build_report(str(P.aggregate_dir), str(P.report_dir), meta)
    except Exception as e:  # never mask the original failure
        logger.error(f"partial report failed: {type(e).__name__}: {e}")
