"""The collection config's schema (schemas/config.schema.yaml): read once per process, the
reconstruction families' name pattern set from their declarations (latentstrat.families), with
its defaults filled into a config (`fill_defaults`)."""

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
    """The schema (parsed once per process), the family pattern from the families declared now."""
    from latentstrat.families import name_pattern

    schema = _parsed()
    schema["$defs"]["family"]["pattern"] = name_pattern()
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
