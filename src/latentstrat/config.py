"""Collection config: loading (with `extends:` and overrides), schema validation with errors that
name the key, defaults, the checks the schema cannot express, and what defines a base (its
settings, the guard against reusing a base folder built from other ones).

The cells a config describes: latentstrat.cells; where their outputs live: latentstrat.paths.
`python -m latentstrat.config FILE...` checks configs before a run.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml

from latentstrat import schedules
from latentstrat.cells import ABLATED_KEY, arm_differences, expand_cells
from latentstrat.families import accepted_names, name_pattern, parse_family
from latentstrat.schema import fill_defaults, parsed_schema


class ConfigError(ValueError):
    """A config problem; the message names the offending key."""


# ----------------------------------------------------------------------------- validation


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
    if err.validator == "pattern" and err.schema.get("pattern") == name_pattern():
        return f"config key {where}: unknown reconstruction family {err.instance!r} (expected {accepted_names()})"
    if err.validator == "pattern" and err.schema.get("pattern") == schedules.name_pattern():
        return f"config key {where}: unknown beta schedule {err.instance!r} (expected {schedules.accepted_names()})"
    return f"config key {where}: {err.message}"


def check_config(cfg: dict) -> dict:
    """Check a config against the schema and the semantic rules and fill its defaults. Returns
    a new dict; raises ConfigError naming the key."""
    if not isinstance(cfg, dict):
        raise ConfigError("config must be a mapping")
    cfg = copy.deepcopy(cfg)
    schema = parsed_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        raise ConfigError(_schema_error_message(errors[0]))
    fill_defaults(cfg, schema, schema)
    _check_semantics(cfg)
    return cfg


def _check_semantics(cfg: dict) -> None:
    """What the schema cannot say, in the order a reader meets it: names (tasks, families, the
    backbone's path), arms and the primary contrast, then the cells they expand to."""
    _check_names(cfg)
    names = [cfg["primary_arm"]] + [a["name"] for a in cfg["comparison_arms"]]
    for i, arm in enumerate(cfg["comparison_arms"]):
        _check_arm(arm, f"comparison_arms[{i}]", names)
    contrast = cfg["report"]["primary_contrast"]
    if contrast is not None and contrast not in names[1:]:
        raise ConfigError(
            f"config key report.primary_contrast: {contrast!r} is not a comparison arm "
            f"(comparison arms: {', '.join(names[1:]) or 'none'})"
        )
    _check_split(cfg["report"]["contrast_split"], names, contrast or (names[1] if len(names) > 1 else None))
    r = cfg["report"]
    if r["followup_min_fresh_seeds"] > r["followup_max_seeds"]:
        raise ConfigError(
            f"config key report.followup_min_fresh_seeds: {r['followup_min_fresh_seeds']} is more than "
            f"report.followup_max_seeds ({r['followup_max_seeds']}): no follow-up could be planned"
        )
    levels = cfg["report"]["alpha_by_look"]
    if sum(levels) > 0.05 + 1e-12:
        raise ConfigError(
            f"config key report.alpha_by_look: {levels} add up to {sum(levels):g}, more than the 0.05 error "
            "budget the looks share"
        )
    gpu_jobs = cfg["resources"]["slurm"]["gpu"]
    if gpu_jobs["gres"] and gpu_jobs["gpu_model"]:
        raise ConfigError(
            "config keys resources.slurm.gpu.gres and gpu_model: a gpu job asks Slurm either for a generic "
            f"resource ({gpu_jobs['gres']!r}) or for whole GPUs of a model ({gpu_jobs['gpu_model']!r}), not both"
        )
    cells = expand_cells(cfg)
    _check_cells(cfg, cells)
    for diff in arm_differences(cfg, cells):
        if diff.arm == contrast and diff.confounded and not diff.meant:
            where = f"comparison_arms[{names.index(contrast) - 1}]"
            raise ConfigError(
                f"config key report.primary_contrast: arm {contrast!r} is confounded: its cells differ from the "
                f"primary arm's in {', '.join(diff.keys)}, not in {ABLATED_KEY} alone. Match its settings, or "
                f"declare the confound meant with `confounded: true` at {where}"
            )


def _check_split(split, names: list[str], contrast: str | None) -> None:
    """report.contrast_split names known arms, in a chain from the primary arm to the primary
    contrast's arm (each part's subtrahend the next part's minuend), so its parts add up to the
    primary contrast on the settings they share."""
    if not split:
        return
    for i, part in enumerate(split):
        for arm in part["arms"]:
            if arm not in names:
                raise ConfigError(
                    f"config key report.contrast_split[{i}].arms: {arm!r} is not an arm of this collection "
                    f"(arms: {', '.join(names)}); a config that drops an arm sets `contrast_split: null`"
                )
    chain = [split[0]["arms"][0]] + [p["arms"][1] for p in split]
    joined = all(split[i]["arms"][1] == split[i + 1]["arms"][0] for i in range(len(split) - 1))
    if not joined or chain[0] != names[0] or chain[-1] != contrast:
        raise ConfigError(
            f"config key report.contrast_split: its parts ({', '.join(' - '.join(p['arms']) for p in split)}) must "
            f"run from the primary arm {names[0]!r} to the primary contrast {contrast!r}, each part's second arm "
            "the next part's first, so that they add up to the primary contrast"
        )
    seen = [p["name"] for p in split]
    if len(set(seen)) != len(seen):
        raise ConfigError(f"config key report.contrast_split: part names repeat ({', '.join(seen)})")


def _check_names(cfg: dict) -> None:
    """Every task and reconstruction family is known; a backbone read from disk names its path."""
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
        raise ConfigError(
            f"config key backbone.name_or_path: required when backbone.source is {cfg['backbone']['source']!r}"
        )


def _check_arm(arm: dict, where: str, names: list[str]) -> None:
    """One comparison arm: a unique name, and either run here (settings / grid / seeds) or read
    from an external table, each said once."""
    if names.count(arm["name"]) > 1:
        raise ConfigError(f"config key {where}.name: arm name {arm['name']!r} is used twice")
    if "table" in arm and ("grid" in arm or arm.get("settings")):
        raise ConfigError(
            f"config key {where}: give either `table` (external) or `settings`/`grid` (run here), not both"
        )
    if "table" not in arm and not arm.get("settings") and "grid" not in arm and "seeds" not in arm:
        raise ConfigError(f"config key {where}: needs `settings`/`grid`/`seeds` (run here) or `table` (external)")
    if "seeds" in arm and "seed" in arm.get("settings", {}):
        raise ConfigError(f"config key {where}: give the arm's seeds once: `seeds` or `settings.seed`, not both")
    if "table" in arm and "seeds" in arm:
        raise ConfigError(f"config key {where}: `seeds` is for arms run here, not an external `table`")


def _check_cells(cfg: dict, cells: list) -> None:
    """The expanded cells: an entangled start needs the entangle stage and its record layout, and
    no cell id appears in two arms."""
    if cfg["entangle"]["mode"] == "skip" and any(c.settings["init"] == "entangled" for c in cells):
        raise ConfigError("config key entangle.mode: 'skip' but some cells have init: entangled")
    slots = cfg["entangle"]["z_slots"]
    for c in cells:
        if c.settings["init"] == "entangled" and int(c.settings["z_slots"]) != slots:
            raise ConfigError(
                f"config key cell/grid/comparison_arms z_slots: cell {c.cell_id} has z_slots "
                f"{c.settings['z_slots']} but the entangled model it starts from is trained with "
                f"entangle.z_slots {slots} (a cell must start as that model: same record layout)"
            )
    ids = [c.cell_id for c in cells]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"config keys grid/comparison_arms: cell {dup[0]!r} appears in two arms")
    _check_replicates(cfg, cells)


def _check_replicates(cfg: dict, cells: list) -> None:
    """Every replicate group names settings some cell has: a group that matches none adds no
    seed, and the verdict would then read `training noise unknown` for a typo."""
    from latentstrat.cells import format_value, replicate_groups

    raw = cfg.get("replicates")
    for i, g in enumerate(replicate_groups(cfg)):
        if not g["grid"] or not g["extra_seeds"]:
            continue
        hit = any(
            all(format_value(c.settings[k]) in {format_value(v) for v in vals} for k, vals in g["grid"].items())
            for c in cells
        )
        if not hit:
            where = f"replicates[{i}]" if isinstance(raw, list) else "replicates"
            axes = ", ".join(f"{k}: {list(v)}" for k, v in g["grid"].items())
            raise ConfigError(
                f"config key {where}.grid: no cell has {axes} (the group would add no seed; check the values "
                "against the grid and the arms' settings)"
            )


def _family_values(cfg: dict):
    yield "cell.reconstruction_family", [cfg["cell"]["reconstruction_family"]]
    yield "grid.reconstruction_family", cfg["grid"].get("reconstruction_family", [])
    for i, arm in enumerate(cfg["comparison_arms"]):
        if "reconstruction_family" in arm.get("settings", {}):
            yield f"comparison_arms[{i}].settings.reconstruction_family", [arm["settings"]["reconstruction_family"]]
        yield f"comparison_arms[{i}].grid.reconstruction_family", arm.get("grid", {}).get("reconstruction_family", [])


def load_config(
    path: str | Path | None = None,
    overrides: dict | None = None,
    cfg: dict | None = None,
    here: str | Path | None = None,
) -> dict:
    """Read a YAML config (or take `cfg`, read from a file in folder `here`), deep-merge
    `overrides`, check it and fill defaults (`check_config`). `extends:` resolves relative to
    the config's folder."""
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
                raise ConfigError(
                    f"config file {path} is not valid YAML{at}: {getattr(e, 'problem', None) or e}"
                ) from None
    cfg = resolve_extends(copy.deepcopy(cfg), Path(path).parent if path else (Path(here) if here else None))
    if overrides:
        _deep_merge(cfg, overrides)
    return check_config(cfg)


def config_for_command(path: str | Path, overrides: dict | None = None) -> dict:
    """load_config for a command-line tool: a config that is missing, unreadable, not YAML or
    wrong ends the command with one line naming the file and the culprit (no traceback)."""
    try:
        return load_config(path, overrides=overrides)
    except ConfigError as e:
        raise SystemExit(f"{path}: {e}") from None


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


# ----------------------------------------------------------------------------- the base


@dataclass(frozen=True)
class Base:
    """A base as its stages read it: its name and the config sections that build it (data,
    backbone, entangle: stages.BASE_SECTIONS), as validated. `settings` is what its entangled
    model is a function of (the base's guard, the data stage's base_config.json), `recipe` the
    same in plain JSON values (a shipped base's provenance)."""

    name: str
    data: dict
    backbone: dict
    entangle: dict

    @classmethod
    def of(cls, cfg: Mapping) -> Base:
        """From a config, or the sections a stage reads (jobs.Sections)."""
        return cls(cfg["base"], cfg["data"], cfg["backbone"], cfg["entangle"])

    @property
    def mode(self) -> str:
        """How its entangled model is obtained (`entangle.mode`: train, shipped or skip)."""
        return self.entangle["mode"]

    def settings(self) -> dict:
        """Its sections and the tokenizer the data is encoded with: a base built with one
        tokenizer is never reused with another. `entangle.mode` is left out: it says how the
        entangled model is obtained (trained here or shipped, latentstrat.base.shipped), not what
        it is; `backbone.attn_implementation` says how the model is run."""
        return {
            "data": self.data,
            "backbone": {k: v for k, v in self.backbone.items() if k != "attn_implementation"},
            "entangle": {k: v for k, v in self.entangle.items() if k != "mode"},
            "tokenizer": tokenizer_identity(self.backbone),
        }

    def recipe(self) -> dict:
        return json.loads(json.dumps(self.settings(), default=str))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flatten(v, key) if isinstance(v, dict) and v else {key: v})
    return out


def settings_diff(stored: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between two nested settings dicts."""
    a, b = _flatten(json.loads(json.dumps(stored, default=str))), _flatten(json.loads(json.dumps(current, default=str)))
    return sorted(k for k in set(a) | set(b) if a.get(k, "<unset>") != b.get(k, "<unset>"))


def base_guard(stored: dict, base: Base) -> str | None:
    """Why the base folder built with `stored` settings (its data/base_config.json) cannot serve
    this config's `base`, or None."""
    diff = settings_diff(stored, base.settings())
    if not diff:
        return None
    return (
        f"base {base.name!r} was built with different settings: {', '.join(diff)} differ from this config. "
        f"Use a new `base` name for the new settings, or delete the base folder to rebuild it "
        f"(and retrain every collection on it)."
    )


def pretrained_source(backbone_cfg: dict) -> tuple[str, str | None]:
    """(name_or_path, revision) of a pretrained backbone. A name that looks like a local path
    (absolute, ./ or ../, ~) must exist: the error names it before anything is loaded."""
    path = backbone_cfg.get("name_or_path")
    if not path:
        raise ValueError("config key backbone.name_or_path: required when backbone.source is 'pretrained'")
    local = os.path.expanduser(path)
    if path.startswith(("/", "./", "../", "~")) and not Path(local).is_dir():
        raise FileNotFoundError(
            f"config key backbone.name_or_path: local model directory {path!r} does not exist "
            f"(it must hold the model's config.json, weights and tokenizer files)"
        )
    return (local if Path(local).is_dir() else path), backbone_cfg.get("revision")


def tokenizer_identity(backbone: dict) -> str:
    """`word-level` (built by the data stage from the task texts) for the embedded and
    config_json backbones; `pretrained:<name_or_path>@<revision>` for a pretrained one (its own
    tokenizer, with the record markers added)."""
    if backbone.get("source") == "pretrained":
        return f"pretrained:{backbone.get('name_or_path')}@{backbone.get('revision') or 'default'}"
    return "word-level"


def describe(cfg: dict) -> list[str]:
    """What a checked config will run, in lines: the collection, its base and cells, then per
    comparison arm the settings its cells change against the primary arm's (cells.arm_differences),
    `confounded` where that is more than the ablated key. The workflow prints the same lines."""
    cells = expand_cells(cfg)
    lines = [f"collection {cfg['collection']}: {len(cells)} cells on base {cfg['base']}"]
    primary = cfg["report"]["primary_contrast"]
    for diff in arm_differences(cfg, cells):
        tag = " (the primary contrast)" if diff.arm == primary else ""
        miss = f"; {diff.unmatched} of its cells have no primary partner" if diff.unmatched else ""
        lines.append(f"  {diff.text()}{tag}{miss}")
    return lines


def main(argv=None) -> int:
    """`python -m latentstrat.config FILE...`: check collection configs before a run."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.config",
        description="Check collection configs before a run: per file its collection, base and cell count, and "
        "per comparison arm the settings it changes (confounded where more than token aggregation), or "
        "one line naming what is wrong. Exit 1 when any file is wrong. The keys: docs/config.md.",
    )
    ap.add_argument("configfile", nargs="+", help="collection config YAML file(s)")
    args = ap.parse_args(argv)
    bad = 0
    for f in args.configfile:
        try:
            cfg = load_config(f)
        except ConfigError as e:
            bad += 1
            print(f"{f}: {e}", file=sys.stderr)
            continue
        first, *rest = describe(cfg)
        print(f"{f}: ok: {first}")
        for line in rest:
            print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
