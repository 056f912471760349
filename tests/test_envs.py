"""envs/*.yaml (the environment as a conda file) pin exactly what pyproject.toml pins."""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pins(reqs):
    out = {}
    for r in reqs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)\s*", r)
        if m:
            out[m[1].lower().replace("_", "-")] = m[2]
    return out


def pyproject_pins():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return _pins(tomllib.load(f)["project"]["dependencies"])


def env_pins(path):
    env = yaml.safe_load(Path(path).read_text())
    pip = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    return _pins([r for group in pip for r in group])


def test_pins_parser_controls():
    assert _pins(["torch==2.13.0", "PyYAML == 6.0.4", "-e ../", "numpy>=2"]) == {"torch": "2.13.0", "pyyaml": "6.0.4"}


def test_every_env_pins_match_pyproject():
    want = pyproject_pins()
    assert len(want) >= 10
    envs = sorted((ROOT / "envs").glob("*.yaml"))
    assert envs, "no conda env files under envs/"
    for path in envs:
        got = env_pins(path)
        assert got == want, f"{path.name}: differs from pyproject.toml: " + ", ".join(
            f"{k}: env {got.get(k)} vs pyproject {want.get(k)}"
            for k in sorted(set(got) | set(want))
            if got.get(k) != want.get(k)
        )


def test_every_rule_names_the_one_environment():
    """Every rule that runs a script names envs/latentstrat.yaml as its conda environment (what
    `--sdm conda` deploys; without it the jobs inherit the environment snakemake runs in), so
    `snakemake --lint` finds no rule without a software definition."""
    rules = 0
    for r in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        text = r.read_text()
        n_rules = len(re.findall(r"^(?:rule|checkpoint) \w+:", text, re.M))
        envs = re.findall(r"^    conda:\n\s+\"([^\"]+)\"", text, re.M)
        assert len(envs) == n_rules, f"{r.name}: {n_rules} rules, {len(envs)} conda directives"
        for env in envs:
            assert (r.parent / env).resolve() == ROOT / "envs" / "latentstrat.yaml", (r.name, env)
        rules += n_rules
    assert rules >= 10


def test_mismatch_is_detected(tmp_path):
    env = tmp_path / "e.yaml"
    env.write_text("dependencies:\n  - pip:\n      - torch==2.12.0\n")
    assert env_pins(env) == {"torch": "2.12.0"} != {"torch": pyproject_pins()["torch"]}


# ----------------------------------------------------------------------------- runtime imports

STDLIB = set(sys.stdlib_module_names)


def imported_top_modules(root: Path) -> dict[str, set[str]]:
    """Top-level module -> the package files that import it (module-level and inside functions)."""
    out: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in names:
                out.setdefault(n.split(".")[0], set()).add(str(path.relative_to(root)))
    return out


def undeclared_runtime_imports(root: Path, declared: set[str]) -> dict[str, set[str]]:
    """Third-party modules imported under root whose distribution is not a runtime dependency."""
    dists = importlib.metadata.packages_distributions()
    missing = {}
    for mod, files in imported_top_modules(root).items():
        if mod in STDLIB or mod in ("latentstrat", "__future__"):
            continue
        names = {d.lower().replace("_", "-") for d in dists.get(mod, [mod])}
        if not names & declared:
            missing[mod] = files
    return missing


def test_every_third_party_import_of_the_package_is_a_runtime_dependency():
    """`pip install .` without extras must run every stage: the probes' scikit-learn included."""
    declared = set(pyproject_pins())
    assert "scikit-learn" in declared
    missing = undeclared_runtime_imports(ROOT / "src" / "latentstrat", declared)
    assert not missing, "imported but not in [project] dependencies: " + ", ".join(
        f"{m} ({', '.join(sorted(f))})" for m, f in sorted(missing.items())
    )


def test_an_undeclared_import_is_caught(tmp_path):
    lazy = "import math\n\ndef f():\n    from sklearn.linear_model import LogisticRegression\n"
    (tmp_path / "stage.py").write_text(lazy)
    declared = set(pyproject_pins()) - {"scikit-learn"}
    assert set(undeclared_runtime_imports(tmp_path, declared)) == {"sklearn"}
    assert undeclared_runtime_imports(tmp_path, declared | {"scikit-learn"}) == {}
