"""Every metric is declared once (latentstrat.metrics): a registered metric name spelled as a string
anywhere else in the package or the workflow fails here, so a rename or a new metric touches the
declaration and the code that computes it, nothing else. Docstrings and comments may name metrics
in prose; code refers to `M.<name>` (`row[M.name]`, not `row.name`)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from latentstrat.metrics import LEVELS, METRICS, USES, M

ROOT = Path(__file__).resolve().parents[1]
DECLARATION = ROOT / "src" / "latentstrat" / "metrics.py"
NAME = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(METRICS, key=len, reverse=True)) + r")(?![A-Za-z0-9_])")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def spelled_in_python(text: str) -> list[tuple[int, str]]:
    """(line, spelling) of every string constant (f-string parts included, docstrings aside), every
    attribute (`row.router_information`, not `M.router_information`) and every keyword argument
    (`assign(kl_prior_loss=...)`) that names a registered metric."""
    tree = ast.parse(text)
    skip = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if NAME.search(node.value):
                out.append((node.lineno, node.value))
        elif isinstance(node, ast.Attribute) and node.attr in METRICS:
            if not (isinstance(node.value, ast.Name) and node.value.id == "M"):
                out.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.keyword) and node.arg in METRICS:
            out.append((node.value.lineno, f"{node.arg}="))
    return out


def spelled_in_snakemake(text: str) -> list[tuple[int, str]]:
    """The same for a Snakefile / .smk (Python's tokenizer reads them; comments are not strings)."""
    return [
        (t.start[0], t.string)
        for t in tokenize.generate_tokens(io.StringIO(text).readline)
        if t.type == tokenize.STRING and NAME.search(t.string) and not t.string.startswith(('"""', "'''"))
    ]


def _sources() -> list[Path]:
    out = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "workflow").rglob("*.py"))]
    out += [ROOT / "Snakefile", *sorted((ROOT / "workflow").rglob("*.smk"))]
    return [p for p in out if p != DECLARATION]


def test_no_metric_name_is_spelled_outside_its_declaration():
    found = []
    for path in _sources():
        text = path.read_text()
        hits = spelled_in_python(text) if path.suffix == ".py" else spelled_in_snakemake(text)
        found += [f"{path.relative_to(ROOT)}:{line}: {s[:80]!r}" for line, s in hits]
    assert not found, "metric names spelled as strings (use latentstrat.metrics.M):\n" + "\n".join(found)


def test_the_scan_catches_a_spelled_name():
    """Negative control: the scan sees a name as a dict key, inside an f-string's expression and inside
    a message, and passes over docstrings, comments and M.<name>."""
    code = '''"""router_information in a docstring is prose."""
row = {"final_answer_accuracy": 1}  # base_relative_reconstruction in a comment
x = f"{row['kl_prior_loss']:.3f}"
msg = "summary lacks active_units"
ok = row[M.final_answer_accuracy], "final_answer_accuracy_ci_low", "router_information2"
v = df.router_information.mean() + df.router_information2.sum()
w = df.assign(kl_prior_loss=1, kl_prior_loss_ci_low=2)
'''
    assert sorted(line for line, _ in spelled_in_python(code)) == [2, 3, 4, 6, 7]
    assert [line for line, _ in spelled_in_snakemake('rule a:\n    params: m="posterior_probe"\n')] == [2]


def test_every_name_is_declared_once_with_its_fields():
    declared = [n for n in vars(M) if not n.startswith("_")]
    assert declared == list(METRICS), "M and the declarations list the same names, in order"
    for name, metric in METRICS.items():
        assert getattr(M, name) == name == metric.name
        assert metric.level in LEVELS and set(metric.uses) <= set(USES)
    # the uses the design names (docs/design.md): the endpoint, the states' and the sanity check's inputs
    assert METRICS[M.router_information].uses == ("endpoint", "state")
    assert {n for n, m in METRICS.items() if "sanity" in m.uses} == {
        M.final_answer_accuracy,
        M.strategy_match_rate,
        M.base_relative_reconstruction,
    }


@pytest.mark.parametrize("term", ["raw", "dist_norm", "tokcc", "kl", "active"])
def test_every_objective_term_is_logged_as_one_declared_metric(term):
    from latentstrat.metrics import LOSS_METRIC_OF

    assert LOSS_METRIC_OF[term] in METRICS
    assert [m.name for m in METRICS.values() if m.loss_term == term] == [LOSS_METRIC_OF[term]]


def test_docs_metrics_is_the_registry():
    """docs/metrics.md is `python -m latentstrat.metrics` (regenerate it after a declaration changes)."""
    from latentstrat.metrics import reference_markdown

    text = (ROOT / "docs" / "metrics.md").read_text()
    assert text == reference_markdown(), "regenerate docs/metrics.md: python -m latentstrat.metrics > docs/metrics.md"
    assert all(f"`{name}`" in text for name in METRICS)
