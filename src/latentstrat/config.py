"""Collection config: loading, schema validation, defaults, cells and their canonical ids.

A collection config (see config/config.yaml) holds fixed cell settings (`cell`), the primary
arm's grid axes (`grid`), an optional `seeds` axis, and comparison arms. This module is the one
place that turns it into cells; Snakemake's common.smk and every stage call it.

Cell ids are canonical strings built from the cell's settings (never from the position in a
grid): `agg-sum_fam-raw_beta-0.01_seed-314159`, plus `key-value` for every other cell setting
that differs from the schema default (e.g. `sched-lin100`). `1` and `1.0` are the same beta.
"""
from __future__ import annotations

import copy
import os
import functools
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).parent / "schemas" / "config.schema.yaml"

# cell setting -> short id key, in id order. agg, fam, beta and seed always appear.
ID_KEYS = {
    "token_aggregation": "agg",
    "reconstruction_family": "fam",
    "beta": "beta",
    "beta_schedule": "sched",
    "init": "init",
    "adaptation": "adapt",
    "latent_dim": "zdim",
    "z_slots": "slots",
    "posterior_variance_weight": "lpv",
    "router_marginal_kl_weight": "lrmk",
    "seed": "seed",
}
ALWAYS_IN_ID = ("token_aggregation", "reconstruction_family", "beta", "seed")
CELL_KEYS = tuple(ID_KEYS)


class ConfigError(ValueError):
    """A config problem; the message names the offending key."""


# ----------------------------------------------------------------------------- schema


@functools.lru_cache(maxsize=1)
def _schema_text() -> str:
    return SCHEMA_PATH.read_text()


def load_schema() -> dict:
    """The config schema (a fresh copy; the file is read once per process)."""
    return copy.deepcopy(_parsed_schema())


@functools.lru_cache(maxsize=1)
def _parsed_schema() -> dict:
    return yaml.safe_load(_schema_text())


def _fill_defaults(instance: Any, schema: dict, root: dict) -> None:
    """Fill `default`s of `properties` recursively (objects only), following $ref/allOf."""
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        target = root
        for part in ref[2:].split("/"):
            target = target[part]
        _fill_defaults(instance, target, root)
    for sub in schema.get("allOf", []):
        _fill_defaults(instance, sub, root)
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill_defaults(instance[key], sub, root)


def _key_path(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<root>"


def _schema_error_message(err: jsonschema.ValidationError) -> str:
    where = _key_path(err.absolute_path)
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        known = ", ".join(sorted(err.schema.get("properties", {})))
        names = ", ".join(f"{where}.{k}" if where != "<root>" else k for k in extra)
        return f"unknown config key {names} (known keys here: {known})"
    if err.validator == "required":
        return f"config key {where}: {err.message}"
    if err.validator in ("minItems", "minProperties") and not err.instance:
        return f"config key {where}: must not be empty"
    if err.validator == "pattern" and "tokcc" in str(err.schema.get("pattern", "")):
        return (f"config key {where}: unknown reconstruction family {err.instance!r} "
                "(expected raw, dist_norm, tokcc_a<alpha>, dist_tokcc_<p>_<q>[_a<alpha>])")
    if err.validator == "pattern" and "lin" in str(err.schema.get("pattern", "")):
        return f"config key {where}: unknown beta schedule {err.instance!r} (expected constant or lin<N>)"
    return f"config key {where}: {err.message}"


def validate(cfg: dict) -> dict:
    """Validate against the schema and fill defaults. Returns a new dict; raises ConfigError."""
    if not isinstance(cfg, dict):
        raise ConfigError("config must be a mapping")
    cfg = copy.deepcopy(cfg)
    if "reference_arms" in cfg:
        raise ConfigError("config key reference_arms: renamed comparison_arms (\"reference\" now names only the "
                          "z-free reference stage); rename the key")
    schema = _parsed_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        raise ConfigError(_schema_error_message(errors[0]))
    _fill_defaults(cfg, schema, schema)
    _check_semantics(cfg)
    return cfg


def _check_semantics(cfg: dict) -> None:
    from latentstrat.tasks import TASKS  # local import: tasks import nothing from config

    for i, name in enumerate(cfg["data"]["tasks"]):
        if name not in TASKS:
            raise ConfigError(f"config key data.tasks[{i}]: unknown task {name!r} (known: {', '.join(sorted(TASKS))})")
    for where, values in _family_values(cfg):
        for i, fam in enumerate(values):
            try:
                parse_family(fam)
            except ValueError as e:
                raise ConfigError(f"config key {where}[{i}]: {e}") from None
    if cfg["backbone"]["source"] in ("pretrained", "config_json") and not cfg["backbone"]["name_or_path"]:
        raise ConfigError(f"config key backbone.name_or_path: required when backbone.source is {cfg['backbone']['source']!r}")
    names = [cfg["primary_arm"]] + [a["name"] for a in cfg["comparison_arms"]]
    for i, arm in enumerate(cfg["comparison_arms"]):
        where = f"comparison_arms[{i}]"
        if names.count(arm["name"]) > 1:
            raise ConfigError(f"config key {where}.name: arm name {arm['name']!r} is used twice")
        if "table" in arm and ("grid" in arm or arm.get("settings")):
            raise ConfigError(f"config key {where}: give either `table` (external) or `settings`/`grid` (run here), not both")
        if "table" not in arm and not arm.get("settings") and "grid" not in arm:
            raise ConfigError(f"config key {where}: needs `settings`/`grid` (run here) or `table` (external)")
    cells = expand_cells(cfg, validated=True)
    if cfg["entangle"]["mode"] == "skip" and any(c.settings["init"] == "entangled" for c in cells):
        raise ConfigError("config key entangle.mode: 'skip' but some cells have init: entangled")
    slots = cfg["entangle"]["z_slots"]
    for c in cells:
        if c.settings["init"] == "entangled" and int(c.settings["z_slots"]) != slots:
            raise ConfigError(f"config key cell/grid/comparison_arms z_slots: cell {c.cell_id} has z_slots "
                              f"{c.settings['z_slots']} but the entangled model it starts from is trained with "
                              f"entangle.z_slots {slots} (a cell must start as that model: same record layout)")
    ids = [c.cell_id for c in cells]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"config keys grid/comparison_arms: cell {dup[0]!r} appears in two arms")


def _family_values(cfg: dict):
    yield "cell.reconstruction_family", [cfg["cell"]["reconstruction_family"]]
    yield "grid.reconstruction_family", cfg["grid"].get("reconstruction_family", [])
    for i, arm in enumerate(cfg["comparison_arms"]):
        if "reconstruction_family" in arm.get("settings", {}):
            yield f"comparison_arms[{i}].settings.reconstruction_family", [arm["settings"]["reconstruction_family"]]
        yield f"comparison_arms[{i}].grid.reconstruction_family", arm.get("grid", {}).get("reconstruction_family", [])


def load_config(path: str | Path | None = None, overrides: dict | None = None, cfg: dict | None = None,
                here: str | Path | None = None) -> dict:
    """Read a YAML config (or take `cfg`, read from a file in folder `here`), deep-merge
    `overrides`, validate, fill defaults. `extends:` resolves relative to the config's folder."""
    if cfg is None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        with open(path) as f:
            try:
                cfg = yaml.safe_load(f)
            except yaml.YAMLError as e:
                where = getattr(e, "problem_mark", None)
                at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
                raise ConfigError(f"config file {path} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    cfg = resolve_extends(copy.deepcopy(cfg), Path(path).parent if path else (Path(here) if here else None))
    if overrides:
        _deep_merge(cfg, overrides)
    return validate(cfg)


def resolve_extends(cfg: dict, here: Path | None = None, _seen: tuple = ()) -> dict:
    """`extends: config.yaml` deep-merges this config over another one.

    A relative path is relative to the extending file's folder (`here`; the working directory
    when the config came without a file), never to wherever the package is installed: a
    second checkout sharing an environment reads its own parent config. One place for shared
    sections: a follow-up collection extends the default one and changes only what differs
    (the shared `base` then matches by construction).
    """
    parent = cfg.pop("extends", None)
    if parent is None:
        return cfg
    candidates = [Path(parent)] if Path(parent).is_absolute() else [(here or Path.cwd()) / parent]
    for cand in candidates:
        if cand.exists():
            break
    else:
        raise ConfigError(f"config key extends: {parent!r} not found (looked in {', '.join(map(str, candidates))})")
    if cand.resolve() in _seen:
        raise ConfigError(f"config key extends: cycle through {cand}")
    with open(cand) as f:
        base = yaml.safe_load(f) or {}
    base = resolve_extends(base, cand.parent, _seen + (cand.resolve(),))
    _deep_merge(base, cfg)
    return base


def typed_cli_values(value, nested: bool = False):
    """Snakemake's `--config k=v` parses nested values with YAML's BaseLoader (all strings):
    give scalars their YAML types again (`{beta: [0.1]}` -> 0.1, not "0.1")."""
    if isinstance(value, dict):
        return {k: typed_cli_values(v, True) for k, v in value.items()}
    if isinstance(value, list):
        return [typed_cli_values(v, True) for v in value]
    if nested and isinstance(value, str):
        try:
            typed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        return typed if isinstance(typed, (bool, int, float)) or typed is None else value
    return value


def from_snakemake(config: dict, cli_config: dict, configfile: str | Path) -> dict:
    """The validated config of a Snakemake run: its `config` with the `--config` values
    re-typed on top; a relative `extends:` made absolute against `configfile`'s folder (so the
    rule scripts, which read `config` as is, resolve the same file). Updates `config` in place."""
    _deep_merge(config, typed_cli_values(dict(cli_config)))
    if config.get("extends") and not Path(config["extends"]).is_absolute():
        config["extends"] = str((Path(configfile).resolve().parent / config["extends"]).resolve())
    return load_config(cfg=config)


def _deep_merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _deep_merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


# ----------------------------------------------------------------------------- families


@dataclass(frozen=True)
class Family:
    """A reconstruction family: kind in raw|dist_norm|tokcc|dist_tokcc, with its parameters."""
    name: str
    kind: str
    alpha: float = 0.25  # tokcc exponent a
    p: float = 0.0  # dist_tokcc weight on dist_norm
    q: float = 0.0  # dist_tokcc weight on tokcc


_FAMILY_RE = re.compile(
    r"^(?:(?P<raw>raw)|(?P<dist>dist_norm)|tokcc_a(?P<a>[0-9.]+)|dist_tokcc_(?P<p>[0-9.]+)_(?P<q>[0-9.]+)(?:_a(?P<a2>[0-9.]+))?)$")


def parse_family(name: str) -> Family:
    m = _FAMILY_RE.match(str(name))
    if not m:
        raise ValueError(f"unknown reconstruction family {name!r} (expected raw, dist_norm, tokcc_a<alpha>, dist_tokcc_<p>_<q>[_a<alpha>])")
    try:
        if m["raw"]:
            return Family(name, "raw")
        if m["dist"]:
            return Family(name, "dist_norm")
        if m["a"] is not None:
            return Family(name, "tokcc", alpha=float(m["a"]))
        return Family(name, "dist_tokcc", alpha=float(m["a2"]) if m["a2"] else 0.25, p=float(m["p"]), q=float(m["q"]))
    except ValueError:
        raise ValueError(f"unknown reconstruction family {name!r}: malformed number") from None


def family_label(name: str) -> str:
    """Human label used by tables and figures: `tokcc a.25`, `dist+tokcc 0.05/0.95`."""
    f = parse_family(name)
    if f.kind == "raw":
        return "raw"
    if f.kind == "dist_norm":
        return "dist norm"
    a = _short(f.alpha)
    if f.kind == "tokcc":
        return f"tokcc a{a}"
    return f"dist+tokcc {f.p:g}/{f.q:g}" + ("" if f.alpha == 0.25 else f" a{a}")


def _short(x: float) -> str:
    s = f"{x:g}"
    return s[1:] if s.startswith("0.") else s


def schedule_warmup(schedule: str) -> int:
    """`constant` -> 0, `linN` -> N."""
    if schedule == "constant":
        return 0
    m = re.fullmatch(r"lin([1-9][0-9]*)", schedule)
    if not m:
        raise ValueError(f"unknown beta schedule {schedule!r}")
    return int(m[1])


# ----------------------------------------------------------------------------- cells


def format_value(v: Any) -> str:
    """Canonical text of a setting value: 1 and 1.0 -> '1'; 0.010 -> '0.01'."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        f = float(v)
        if f.is_integer() and abs(f) < 1e15:
            return str(int(f))
        return repr(f)
    return str(v)


def beta_label(beta: float) -> str:
    """Label as the original study writes it: beta=.01, beta=1."""
    return "beta=" + _short(float(beta))


def schema_cell_defaults() -> dict:
    props = _parsed_schema()["properties"]["cell"]["properties"]
    return {k: v["default"] for k, v in props.items()}


def cell_id(settings: dict) -> str:
    defaults = schema_cell_defaults()
    parts = []
    for key, short in ID_KEYS.items():
        v = settings[key]
        if key in ALWAYS_IN_ID or _canon(v) != _canon(defaults[key]):
            parts.append(f"{short}-{format_value(v)}")
    return "_".join(parts)


# the cell settings that decide its model as built (model.build_model): cells that agree on them
# start from the same weights and share one step-0 validation (train.step0_validation)
INIT_KEYS = ("init", "adaptation", "latent_dim", "z_slots", "seed")


def init_id(settings: dict) -> str:
    """The name of a cell's model at step 0, from its INIT_KEYS, e.g. init-entangled_adapt-lora_..."""
    return "_".join(f"{ID_KEYS[k]}-{format_value(settings[k])}" for k in INIT_KEYS)


def _canon(v):
    return format_value(v)


def parse_cell_id(cid: str) -> dict:
    """Inverse of cell_id for the keys it names (values as strings)."""
    rev = {v: k for k, v in ID_KEYS.items()}
    out = {}
    for part in cid.split("_"):
        short, _, value = part.partition("-")
        if short not in rev:
            # family names contain underscores: glue back onto the previous part
            last = list(out)[-1]
            out[last] += "_" + part
            continue
        out[rev[short]] = value
    return out


@dataclass(frozen=True)
class Cell:
    cell_id: str
    arm: str
    role: str  # primary | reference | comparison
    settings: dict = field(hash=False)

    def to_json(self) -> dict:
        return {"cell_id": self.cell_id, "arm": self.arm, "role": self.role, **self.settings}


def _normalize_settings(s: dict) -> dict:
    out = dict(s)
    for k in ("beta", "posterior_variance_weight", "router_marginal_kl_weight"):
        out[k] = float(out[k])
    for k in ("latent_dim", "z_slots", "seed"):
        out[k] = int(out[k])
    return out


def _arm_cells(name: str, role: str, base: dict, grid: dict, seeds: list[int]) -> list[Cell]:
    axes = [k for k in CELL_KEYS if k in grid and k != "seed"]
    cells, seen = [], set()
    for values in itertools.product(*(grid[k] for k in axes)):
        for seed in seeds:
            s = dict(base)
            s.update(zip(axes, values))
            s["seed"] = seed
            s = _normalize_settings(s)
            cid = cell_id(s)
            if cid in seen:  # e.g. beta [1, 1.0]
                continue
            seen.add(cid)
            cells.append(Cell(cid, name, role, s))
    return cells


def expand_cells(cfg: dict, validated: bool = False) -> list[Cell]:
    """All cells run by this workflow: the primary arm, then each run-here comparison arm."""
    if not validated:
        cfg = validate(cfg)
    seeds = cfg.get("seeds") or [cfg["cell"]["seed"]]
    cells = _arm_cells(cfg["primary_arm"], "primary", cfg["cell"], cfg["grid"], seeds)
    for arm in cfg["comparison_arms"]:
        if "table" in arm:
            continue
        base = {**cfg["cell"], **arm.get("settings", {})}
        grid = {k: v for k, v in cfg["grid"].items() if k not in arm.get("settings", {})}
        grid.update(arm.get("grid", {}))
        cells += _arm_cells(arm["name"], arm.get("role", "reference"), base, grid, seeds)
    return cells


def external_arms(cfg: dict) -> list[dict]:
    return [a for a in cfg["comparison_arms"] if "table" in a]


# ----------------------------------------------------------------------------- paths


# Config sections that, with a cell's own settings and the base, decide what its train,
# evaluate and probe jobs compute. Collections on one base whose sections agree share those
# outputs: a follow-up collection that repeats a cell reuses it instead of retraining it.
CELL_WORK_SECTIONS = ("lora", "train", "evaluate", "probes")
# how a cell's training is run, not what it computes: left out of the work key
RUN_ONLY_TRAIN_KEYS = ("gradient_checkpointing",)


def cell_work_key(cfg: dict) -> str:
    """`w` + 10 hex digits of the hash of CELL_WORK_SECTIONS (validated, defaults filled)."""
    work = {k: cfg[k] for k in CELL_WORK_SECTIONS}
    work["train"] = {k: v for k, v in work["train"].items() if k not in RUN_ONLY_TRAIN_KEYS}
    blob = json.dumps(work, sort_keys=True, default=str)
    return "w" + hashlib.sha256(blob.encode()).hexdigest()[:10]


# The file names inside a stage's folder: Paths joins them for the rules and the status
# command, and the stages write and read them by these names.
ENTANGLE_FILES = {"quality": "quality.json", "entangle_history": "history.parquet"}
# with entangle.mode shipped, the reference table shipped with the base, installed beside the model
SHIPPED_REFERENCE_FILE = "reference_tokens.parquet"
REFERENCE_FILES = {"tokens": "tokens.parquet", "scales": "scales.json", "token_counts": "token_counts.parquet"}
STEP0_FILES = {"passes": "passes.parquet", "measured": "measured.json"}
# a trained cell (model.LatentStrategyModel.save_trained): the heads, written last, mark it
# complete; beside them its peft adapters (adapters/<name>/) or full copies (backbones/<name>/)
TRAIN_FILES = {"heads": "heads/heads.safetensors", "heads_config": "heads/config.json", "history": "history.parquet",
               "summary": "summary.json"}


@dataclass(frozen=True)
class Paths:
    """Where every stage reads and writes: the one place for the layout and the file names.
    The workflow's rules take their inputs and outputs from here, the status command its
    outputs to look for."""
    results: Path
    collection: str
    base: str
    cell_key: str  # cell_work_key(cfg): where this config's cells' work lives

    @classmethod
    def from_config(cls, cfg: dict) -> "Paths":
        return cls(Path(cfg["results_dir"]), cfg["collection"], cfg["base"], cell_work_key(cfg))

    # base-level (shared by collections with the same `base`)
    @property
    def base_dir(self) -> Path: return self.results / "base" / self.base
    @property
    def data_dir(self) -> Path: return self.base_dir / "data"
    @property
    def base_config(self) -> Path: return self.data_dir / "base_config.json"
    @property
    def entangle_dir(self) -> Path: return self.base_dir / "entangle"
    @property
    def reference_dir(self) -> Path: return self.base_dir / "reference"
    @property
    def base_logs_dir(self) -> Path: return self.base_dir / "logs"
    @property
    def base_bench_dir(self) -> Path: return self.base_dir / "benchmarks"

    def data_files(self) -> dict[str, str]:
        d = self.data_dir
        return {"train": str(d / "train.parquet"), "validation": str(d / "validation.parquet"),
                "test": str(d / "test.parquet"), "tokenizer": str(d / "tokenizer.json"),
                "tokenizer_info": str(d / "tokenizer_info.json")}

    def entangle_files(self, mode: str = "train") -> dict[str, str]:
        """The entangle stage's outputs; with `entangle.mode: skip` (cells with init: direct use
        the backbone as is) only the quality record and an empty history."""
        d = self.entangle_dir
        files = {k: str(d / name) for k, name in ENTANGLE_FILES.items()}
        if mode != "skip":
            files.update(entangle_config=str(d / "model" / "config.json"),
                         entangle_weights=str(d / "model" / "model.safetensors"))
        if mode == "shipped":
            files["shipped_reference"] = str(d / SHIPPED_REFERENCE_FILE)
        return files

    def entangled_model_files(self, mode: str = "train") -> dict[str, str]:
        """The entangle outputs a model job reads: the model's config and weights (and with
        `entangle.mode: shipped` the reference table shipped with it); with `skip`, the quality
        record that stands for the backbone used as is. Never the quality record of a trained or
        installed model, whose timings differ on every run: re-creating the same model must not
        rerun the jobs downstream of it (docs/rerun-policy.md)."""
        files = self.entangle_files(mode)
        keep = ("quality",) if mode == "skip" else ("entangle_config", "entangle_weights", "shipped_reference")
        return {k: v for k, v in files.items() if k in keep}

    def reference_files(self) -> dict[str, str]:
        return {k: str(self.reference_dir / name) for k, name in REFERENCE_FILES.items()}

    # a cell's work (train, evaluate, probes): shared by collections with the same base and
    # CELL_WORK_SECTIONS, keyed by the cell id (its settings)
    def cell_dir(self, cid: str) -> Path: return self.base_dir / "cells" / self.cell_key / cid
    def train_dir(self, cid: str) -> Path: return self.cell_dir(cid) / "train"
    # the step-0 validation shared by the cells that start from one model (config.init_id)
    def step0_dir(self, iid: str) -> Path: return self.base_dir / "step0" / self.cell_key / iid

    def step0_files(self, iid: str) -> dict[str, str]:
        return {k: str(self.step0_dir(iid) / name) for k, name in STEP0_FILES.items()}

    def train_files(self, cid: str) -> dict[str, str]:
        return {k: str(self.train_dir(cid) / name) for k, name in TRAIN_FILES.items()}

    def trained_weight_files(self, cid: str) -> list[Path]:
        """The trained cell's adapter or backbone weights that exist (beside the heads)."""
        d = self.train_dir(cid)
        return sorted([*d.glob("adapters/*/adapter_model.safetensors"), *d.glob("backbones/*/model.safetensors")])

    def records_path(self, cid: str) -> Path: return self.cell_dir(cid) / "evaluate" / "records.parquet"
    def probe_path(self, cid: str, task: str) -> Path: return self.cell_dir(cid) / "probes" / f"{task}.parquet"

    def probe_files(self, cid: str, tasks) -> list[str]:
        """Per-task probes, then the global one."""
        return [str(self.probe_path(cid, t)) for t in [*tasks, "global"]]

    # collection-level: the cell's row in this collection (its arm and role), tables, report
    @property
    def collection_dir(self) -> Path: return self.results / self.collection
    def metrics_path(self, cid: str) -> Path: return self.collection_dir / "cells" / cid / "metrics.parquet"
    def bootstrap_path(self, cid: str) -> Path: return self.collection_dir / "cells" / cid / "bootstrap.parquet"
    @property
    def logs_dir(self) -> Path: return self.collection_dir / "logs"
    @property
    def bench_dir(self) -> Path: return self.collection_dir / "benchmarks"

    def log_path(self, stage: str, cid: str) -> Path:
        """A cell stage's job log (probes: the global probe's)."""
        return {"train": self.logs_dir / "train" / f"{cid}.log", "evaluate": self.logs_dir / "evaluate" / f"{cid}.log",
                "probes": self.logs_dir / "probe" / cid / "global.log",
                "metrics": self.logs_dir / "metrics" / f"{cid}.log"}[stage]

    @property
    def aggregate_dir(self) -> Path: return self.collection_dir / "aggregate"
    @property
    def aggregate_marker(self) -> Path: return self.aggregate_dir / "collection_state.parquet"
    @property
    def report_dir(self) -> Path: return self.collection_dir / "report"

    def report_files(self) -> dict[str, str]:
        d = self.report_dir
        return {"results": str(d / "results.md"), "analysis": str(d / "analysis.md"),
                "brief": str(d / "brief.yaml"), "findings": str(d / "findings.json")}


def base_settings(cfg: dict) -> dict:
    """The config sections that define the shared base (data, backbone, entangle) and the
    tokenizer the data is encoded with: a base built with one tokenizer is never reused with
    another. `entangle.mode` is left out: it says how the entangled model is obtained (trained
    here or shipped, latentstrat.shipped), not what it is; `backbone.attn_implementation` says
    how the model is run."""
    entangle = {k: v for k, v in cfg["entangle"].items() if k != "mode"}
    backbone = {k: v for k, v in cfg["backbone"].items() if k != "attn_implementation"}
    return {"data": cfg["data"], "backbone": backbone, "entangle": entangle,
            "tokenizer": tokenizer_identity(cfg["backbone"])}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flatten(v, key) if isinstance(v, dict) and v else {key: v})
    return out


def settings_diff(stored: dict, current: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two nested settings dicts (`ignore`: dotted keys
    left out, e.g. ones an older version recorded)."""
    a, b = _flatten(json.loads(json.dumps(stored, default=str))), _flatten(json.loads(json.dumps(current, default=str)))
    return sorted(k for k in set(a) | set(b) if k not in ignore and a.get(k, "<unset>") != b.get(k, "<unset>"))


def base_guard(stored: dict, cfg: dict) -> str | None:
    """Why the base folder built with `stored` settings (its data/base_config.json) cannot serve
    this config, or None. Bases written before `entangle.mode` left the base settings carry it:
    it is ignored."""
    diff = settings_diff(stored, base_settings(cfg), ignore=("entangle.mode",))
    if not diff:
        return None
    return (f"base {cfg['base']!r} was built with different settings: {', '.join(diff)} differ from this config. "
            f"Use a new `base` name for the new settings, or delete the base folder to rebuild it "
            f"(and retrain every collection on it).")


def pretrained_source(backbone_cfg: dict) -> tuple[str, str | None]:
    """(name_or_path, revision) of a pretrained backbone. A name that looks like a local path
    (absolute, ./ or ../, ~) must exist: the error names it before anything is loaded."""
    path = backbone_cfg.get("name_or_path")
    if not path:
        raise ValueError("config key backbone.name_or_path: required when backbone.source is 'pretrained'")
    local = os.path.expanduser(path)
    if path.startswith(("/", "./", "../", "~")) and not Path(local).is_dir():
        raise FileNotFoundError(f"config key backbone.name_or_path: local model directory {path!r} does not exist "
                                f"(it must hold the model's config.json, weights and tokenizer files)")
    return (local if Path(local).is_dir() else path), backbone_cfg.get("revision")


def tokenizer_identity(backbone: dict) -> str:
    """`word-level` (built by the data stage from the task texts) for the embedded and
    config_json backbones; `pretrained:<name_or_path>@<revision>` for a pretrained one (its own
    tokenizer, with the record markers added)."""
    if backbone.get("source") == "pretrained":
        return f"pretrained:{backbone.get('name_or_path')}@{backbone.get('revision') or 'default'}"
    return "word-level"


def dump_json(obj: Any, path: str | Path) -> None:
    """Write JSON atomically (temp file, then rename)."""
    from latentstrat.io import atomic_path
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=str)
            f.write("\n")


def main(argv=None) -> None:
    """`python -m latentstrat.config FILE...`: check collection configs before a run; one line
    per file (its collection, base and cell count, or what is wrong with it)."""
    import sys

    files = list(sys.argv[1:] if argv is None else argv)
    if not files:
        raise SystemExit("usage: python -m latentstrat.config CONFIG.yaml [...]")
    bad = 0
    for f in files:
        try:
            cfg = load_config(f)
            print(f"{f}: ok: collection {cfg['collection']}, base {cfg['base']}, {len(expand_cells(cfg, validated=True))} cells")
        except ConfigError as e:
            bad += 1
            print(f"{f}: {e}", file=sys.stderr)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
