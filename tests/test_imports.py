"""The package's imports follow the data flow: no cycle between its modules (a module imported
inside a function counts too), and the report does not pull in torch."""

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# the packages in data-flow order: a module may import from its own package and earlier ones only
STAGE_PACKAGES = ("modeling", "base", "cell")
# packages whose modules are nodes of their own in the import graph (a cycle inside them counts)
MODULE_NODES = (*STAGE_PACKAGES, "bench")
FLOW = ("tasks", "top", "modeling", "base", "cell", "aggregate", "report")


def import_graph() -> dict[str, set[str]]:
    """module -> package modules it imports: the modules of the stage packages (modeling/, base/,
    cell/) and of bench/ each a node; tasks/, aggregate/ and report/ one node each."""

    def node(name: str) -> str:
        parts = name.split(".")
        return ".".join(parts[:3] if len(parts) > 2 and parts[1] in MODULE_NODES else parts[:2])

    graph: dict[str, set[str]] = {}
    for f in (SRC / "latentstrat").rglob("*.py"):
        name = node(".".join(f.relative_to(SRC).with_suffix("").parts))
        deps = graph.setdefault(name, set())
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("latentstrat"):
                packages = ("latentstrat", *(f"latentstrat.{p}" for p in MODULE_NODES))
                targets = [f"{n.module}.{a.name}" for a in n.names] if n.module in packages else [n.module]
            elif isinstance(n, ast.Import):
                targets = [a.name for a in n.names if a.name.startswith("latentstrat")]
            else:
                continue
            deps.update(node(t) for t in targets if node(t) != name)
    return graph


def cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module: the modules that reach each other."""

    def reach(v) -> set:
        seen, todo = set(), [v]
        while todo:
            for w in graph.get(todo.pop(), ()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen

    reached = {v: reach(v) for v in graph}
    comps = {tuple(sorted({v} | {w for w in reached[v] if v in reached.get(w, ())})) for v in graph}
    return sorted(list(c) for c in comps if len(c) > 1)


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def package_of(module: str) -> str:
    """The package of a module: a stage package, tasks / aggregate / report / bench, else top."""
    parts = module.split(".")
    if parts[1] in ("tasks", "aggregate", "report", "bench") or (len(parts) > 2 and parts[1] in STAGE_PACKAGES):
        return parts[1]
    return "top"


def against_the_flow(graph) -> list[str]:
    """Imports from a later package of FLOW (bench/ stands outside the pipeline and is left out)."""
    out = []
    for mod, deps in graph.items():
        if package_of(mod) not in FLOW:
            continue
        for dep in deps:
            if package_of(dep) in FLOW and FLOW.index(package_of(dep)) > FLOW.index(package_of(mod)):
                out.append(f"{mod} imports {dep}")
    return sorted(out)


def test_the_packages_follow_the_data_flow():
    """The tasks, the infrastructure at the top, the model, the base stages, the cell stages, the aggregate
    and the report: no module imports from a package after its own."""
    assert against_the_flow(import_graph()) == []
    # the control: a top-level module importing a cell stage is caught
    assert against_the_flow({"latentstrat.paths": {"latentstrat.cell.train"}}) == [
        "latentstrat.paths imports latentstrat.cell.train"
    ]


def test_the_control_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_imports_train():
    users = sorted(m for m, deps in import_graph().items() if "latentstrat.cell.train" in deps)
    # the benchmarks that time the trainer's step or run it (learning curves, a cell at scale)
    assert users == [f"latentstrat.bench.{m}" for m in ("curve", "seedscale", "step", "train")]


def test_the_report_imports_no_torch():
    code = (
        "import sys, latentstrat.report, latentstrat.report.markdown, latentstrat.report.findings; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def reachable(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_collection_stages_sit_below_the_model_stages():
    """The aggregate and the report read the cells' tables, never the code that trains, samples
    or scores a model (which would lift them above those stages in the import graph)."""
    graph = import_graph()
    model_side = {
        "latentstrat.modeling.model",
        "latentstrat.modeling.backbone",
        "latentstrat.modeling.decode",
        "latentstrat.base.quality",
    }
    for package in ("latentstrat.aggregate", "latentstrat.report"):
        assert reachable(graph, package) & model_side == set(), package
    assert "latentstrat.modeling.decode" in reachable(
        graph, "latentstrat.cell.evaluate"
    )  # the control: a stage that samples


def test_test_modules_share_helpers_not_each_other():
    """Test modules share code through conftest.py and helper modules, never by importing
    another test module (which would run its module fixtures and tests' imports twice)."""
    tests = Path(__file__).resolve().parent
    offenders = []
    for f in tests.glob("test_*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            names = (
                [n.module]
                if isinstance(n, ast.ImportFrom) and n.module
                else [a.name for a in n.names]
                if isinstance(n, ast.Import)
                else []
            )
            offenders += [f"{f.name} imports {m}" for m in names if m.startswith("test_")]
    assert offenders == []


def test_the_workflow_starts_without_torch():
    """Snakemake parses the workflow on every invocation (a dry run, each Slurm job's start):
    the modules common.smk imports do not import torch (about 2.5 s on a 2-core CPU)."""
    import subprocess
    import sys

    code = (
        "import sys, latentstrat.cells, latentstrat.config, latentstrat.paths, latentstrat.base.shipped; "
        "print('torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr
