"""Size limits that ruff has no rule for: a module of the package at most 600 lines, a function
(or method) at most 80 lines, so that each file and function reads top to bottom."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "latentstrat"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def oversized(source: str, where: str) -> list[str]:
    """What in one module's source is over the limits: the module, and each long function."""
    out = []
    n = len(source.splitlines())
    if n > MAX_MODULE_LINES:
        out.append(f"{where}: {n} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{where}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return out


def test_modules_and_functions_stay_within_their_sizes():
    found = [line for p in sorted(PACKAGE.rglob("*.py")) for line in oversized(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, "\n".join(found)


def test_the_check_finds_a_long_function_and_a_long_module():
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    long_function = f"def f():\n{body}\n"  # 81 lines with its def
    assert oversized(long_function, "m.py") == ["m.py:1 f: 81 lines (at most 80)"]
    assert oversized("def f():\n" + "\n".join(body.splitlines()[:79]) + "\n", "m.py") == []
    assert oversized("x = 1\n" * 601, "m.py") == ["m.py: 601 lines (at most 600)"]


MAX_GLUE_LINES = 180  # workflow/rules/common.smk: input functions and final targets, no checks


def test_the_workflow_glue_stays_glue():
    """common.smk holds the workflow's input functions, params and final targets; what it checks
    and how lives in the package (tested there), so the file stays short."""
    n = len((ROOT / "workflow" / "rules" / "common.smk").read_text().splitlines())
    assert n <= MAX_GLUE_LINES, f"workflow/rules/common.smk: {n} lines (at most {MAX_GLUE_LINES})"


# The config travels as sections, not as the whole config. The whole config (a `cfg` or
# `config` parameter) reaches only the modules that read all of it: its validation, the grid's
# expansion, the layout and the rules' glue, the status command, and the collection-level stages
# (the aggregate and the partial report). A stage entry takes its stage's `sections`
# (jobs.Sections). Every other function takes the sections, or the typed objects (config.Base,
# cells.Collection, cells.CellSettings, validation.ValidationSettings), it reads. The counts are
# held at what they are now, so they only go down.
WHOLE, STAGE = ("cfg", "config"), ("sections",)
WHOLE_CONFIG_MODULES = (
    "config.py",
    "cells.py",
    "paths.py",
    "rules.py",
    "status/__init__.py",
    "report/partial.py",
    "aggregate/collection.py",
)
MAX_CFG_FUNCTIONS = 27
MAX_CFG_SUBSCRIPTS = 48  # whole-config subscripts outside config.py
MAX_SECTIONS_SUBSCRIPTS = 19  # a stage entry's reads of its sections


def cfg_uses(package: Path = PACKAGE, names=WHOLE) -> tuple[list[str], list[str]]:
    """(functions with a parameter of one of `names`, their `name[...]` subscripts outside
    config.py), as where."""
    functions, subscripts = [], []
    for p in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(a.arg in names for a in [*node.args.args, *node.args.kwonlyargs]):
                    functions.append(f"{p.relative_to(package)}:{node.name}")
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in names:
                if p.name != "config.py":
                    subscripts.append(f"{p.relative_to(package)}:{node.lineno}")
    return functions, subscripts


def test_the_whole_config_reaches_few_functions():
    functions, subscripts = cfg_uses()
    elsewhere = [f for f in functions if f.split(":")[0] not in WHOLE_CONFIG_MODULES]
    assert not elsewhere, f"these take the whole config; pass the sections they read: {elsewhere}"
    assert len(functions) <= MAX_CFG_FUNCTIONS, "\n".join(functions)
    assert len(subscripts) <= MAX_CFG_SUBSCRIPTS, "\n".join(subscripts)


def test_only_a_stage_entry_takes_its_stages_sections():
    from latentstrat.stages import STAGES

    entries = {s.entry.split(":")[0].removeprefix("latentstrat.").replace(".", "/") for s in STAGES}
    functions, subscripts = cfg_uses(names=STAGE)
    functions = [f for f in functions if f != "jobs.py:__init__"]  # jobs.Sections itself
    outside = [f for f in functions if f.split(":")[0].removesuffix(".py") not in entries]
    assert not outside, f"only a stage's entry module reads its sections: {outside}"
    assert len(subscripts) <= MAX_SECTIONS_SUBSCRIPTS, "\n".join(subscripts)


def test_the_config_count_sees_a_parameter_and_a_subscript(tmp_path):
    source = "def f(cfg):\n    return cfg['a'] + cfg['b']\n\ndef g(train):\n    return train['x']\n"
    (tmp_path / "m.py").write_text(source)
    assert cfg_uses(tmp_path) == (["m.py:f"], ["m.py:2", "m.py:2"])
