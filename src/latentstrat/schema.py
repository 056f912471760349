"""The collection config's schema (schemas/config.schema.yaml): read once per process, the
reconstruction families' name pattern and the token aggregations set from their declarations
(latentstrat.families, latentstrat.aggregations), with its defaults filled into a config
(`fill_defaults`)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).parent / "schemas" / "config.schema.yaml"


@functools.lru_cache(maxsize=1)
def _schema_text() -> str:
    return SCHEMA_PATH.read_text()


def load_schema() -> dict:
    """The config schema (a fresh copy; the file is read once per process)."""
    return copy.deepcopy(parsed_schema())


@functools.lru_cache(maxsize=1)
def _parsed() -> dict:
    return yaml.safe_load(_schema_text())


def parsed_schema() -> dict:
    """The schema (parsed once per process), the family and schedule patterns and the token
    aggregations from the declarations now."""
    from latentstrat import schedules
    from latentstrat.aggregations import AGGREGATIONS
    from latentstrat.families import name_pattern
    from latentstrat.metrics import CONTRAST_METRICS, ENDPOINT

    schema = _parsed()
    schema["$defs"]["family"]["pattern"] = name_pattern()
    schema["$defs"]["schedule"]["pattern"] = schedules.name_pattern()
    schema["$defs"]["aggregation"]["enum"] = list(AGGREGATIONS)
    endpoint = schema["properties"]["report"]["properties"]["primary_metric"]
    endpoint["default"], endpoint["enum"] = ENDPOINT, list(CONTRAST_METRICS)
    return schema


def fill_defaults(instance: Any, schema: dict, root: dict) -> None:
    """Fill `default`s of `properties` recursively (objects only), following $ref/allOf."""
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        target = root
        for part in ref[2:].split("/"):
            target = target[part]
        fill_defaults(instance, target, root)
    for sub in schema.get("allOf", []):
        fill_defaults(instance, sub, root)
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            fill_defaults(instance[key], sub, root)


# ----------------------------------------------------------------------------- the config reference


def _resolve(node: dict, root: dict) -> dict:
    """A schema node with its $ref (and allOf refs) merged in; the node's own keys win."""
    out = {}
    for sub in node.get("allOf", []):
        out.update(_resolve(sub, root))
    if "$ref" in node:
        target = root
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        out.update(_resolve(target, root))
    out.update({k: v for k, v in node.items() if k not in ("$ref", "allOf")})
    if "properties" in out and any("properties" in _resolve(s, root) for s in node.get("allOf", [])):
        merged = {}
        for sub in node.get("allOf", []):
            merged.update(_resolve(sub, root).get("properties", {}))
        for k, v in node.get("properties", {}).items():
            merged[k] = {**merged.get(k, {}), **v}
        out["properties"] = merged
    return out


def _type_text(node: dict, root: dict) -> str:
    ref = node.get("$ref", "")
    if ref.endswith("/grid"):
        return "grid (cell setting: list of values)"
    if ref.endswith("/seed_list"):
        return "list of seeds"
    n = _resolve(node, root)
    if "enum" in n:
        return " / ".join(str(v) for v in n["enum"])
    if "oneOf" in n:
        return " or ".join(_type_text(o, root) if "const" not in o else str(o["const"]) for o in n["oneOf"])
    t = n.get("type", "")
    t = " or ".join(x for x in t if x != "null") + " or null" if isinstance(t, list) else t
    if t == "array" and "items" in n:
        t = f"list of {_type_text(n['items'], root)}"
    bounds = [
        f">= {n['minimum']}" if "minimum" in n else "",
        f"> {n['exclusiveMinimum']}" if "exclusiveMinimum" in n else "",
    ]
    return " ".join([t or "value", *[b for b in bounds if b]])


def _cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ").strip()


def _rows(node: dict, root: dict, prefix: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every key under node, depth first."""
    rows = []
    for key, sub in _resolve(node, root).get("properties", {}).items():
        full = _resolve(sub, root)
        default = (
            f"`{sub['default']!r}`"
            if "default" in sub and sub["default"] == ""
            else (f"`{sub['default']}`" if "default" in sub and not isinstance(sub["default"], dict) else "")
        )
        rows.append((prefix + key, _type_text(sub, root), default, full.get("description", "")))
        if "properties" in full and not sub.get("$ref", "").endswith("/grid") and key != "cell":
            rows += _rows(sub, root, prefix + key + ".")
        for alt in full.get("oneOf", [])[:1]:  # e.g. replicates: a group or a list of groups
            if "properties" in _resolve(alt, root):
                rows += _rows(alt, root, prefix + key + ".")
    return rows


def reference_markdown() -> str:
    """docs/config.md: every config key with its type, default and description, from the schema."""
    root = parsed_schema()
    settings = root["$defs"]["cell_settings"]
    cell_defaults = root["properties"]["cell"]["properties"]
    out = [
        "# Config reference",
        "",
        "Every key of a collection config (`config/*.yaml`), generated from the schema",
        "(`src/latentstrat/schemas/config.schema.yaml`) by `python -m latentstrat.schema > docs/config.md`; a",
        "test keeps the two in sync. Keys not in a config take their default; unknown keys are errors.",
        "`python -m latentstrat.config FILE` checks a config and prints what it will run.",
        "",
        f"{root['description'].strip()}",
        "",
        "## Cell settings",
        "",
        "What makes a cell. Each can be fixed in `cell:`, be a grid axis (`grid:`, a list of values), be",
        "overridden by a comparison arm (`comparison_arms[].settings`) or name the settings `replicates:` covers.",
        "",
        "| key | type | default (`cell`) | description |",
        "|---|---|---|---|",
    ]
    for key, sub in settings["properties"].items():
        d = cell_defaults.get(key, {}).get("default")
        default = "" if d is None else f"`{d}`"
        out.append(f"| `{key}` | {_cell(_type_text(sub, root))} | {default} | {_cell(sub.get('description', ''))} |")
    out += ["", "## Keys", "", "| key | type | default | description |", "|---|---|---|---|"]
    for key, typ, default, desc in _rows(root, root, ""):
        if key.startswith("cell."):
            continue
        out.append(f"| `{key}` | {_cell(typ)} | {_cell(default)} | {_cell(desc)} |")
    return "\n".join(out) + "\n"


def undescribed_keys() -> list[str]:
    """Config keys (and cell settings) the schema gives no description."""
    root = parsed_schema()
    missing = [f"cell.{k}" for k, v in root["$defs"]["cell_settings"]["properties"].items() if not v.get("description")]
    return missing + [k for k, _, _, d in _rows(root, root, "") if not d and not k.startswith("cell.")]


if __name__ == "__main__":
    print(reference_markdown(), end="")
