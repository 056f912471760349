"""The counts and rule files the README, the docs and the configs' own comments quote are held
to the code and the configs, so that a config change cannot leave them stale: the collections
table's cells per arm, every `N cells` in the README and the docs, each config's `(N cells)`,
and every rule file named."""

import re
from collections import Counter
from pathlib import Path

import pytest

from latentstrat.cells import expand_cells
from latentstrat.config import config_for_command

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.stem for p in (ROOT / "config").glob("*.yaml"))


def arm_counts(name: str) -> list[int]:
    """Cells per arm of config `name`, primary arm first, then the comparison arms in order."""
    cells = expand_cells(config_for_command(ROOT / "config" / f"{name}.yaml"))
    per_arm = Counter(c.arm for c in cells)
    return [per_arm[a] for a in dict.fromkeys(c.arm for c in cells)]


@pytest.fixture(scope="module")
def counts() -> dict[str, list[int]]:
    return {name: arm_counts(name) for name in CONFIGS}


def test_the_collections_table_counts_each_configs_cells(counts):
    """README's table: `a + b (+ ...)` per arm, or one total."""
    rows = re.findall(r"^\| `([\w.-]+)\.yaml`[^|]*\|[^|]*\| ([\d +]+) \|$", (ROOT / "README.md").read_text(), re.M)
    assert {name for name, _ in rows} >= {"config", "aa", "quick", "quick-aa", "study001", "qwen25-05b"}
    for name, quoted in rows:
        parts = [int(x) for x in quoted.split("+")]
        want = counts[name] if len(parts) > 1 else [sum(counts[name])]
        assert parts == want, f"README collections table: {name}.yaml has {want} cells, the table says {parts}"


def test_every_cell_count_the_docs_quote_is_one_a_config_has(counts):
    """Every `N cells` in the README and docs/ is a count some shipped config expands to (in
    all, or in one arm) or the grid's settings (12): a stale count (the default collection's
    before its beta 1 replicates, 50) fails here."""
    allowed = {sum(v) for v in counts.values()} | {n for v in counts.values() for n in v} | {12}
    stale = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in re.finditer(r"(?<![\d.x])(\d+) cells\b", doc.read_text()):
            if int(m[1]) not in allowed:
                stale.append(f"{doc.relative_to(ROOT)}: {m[0]!r}")
    assert not stale, "counts no config has: " + "; ".join(stale)


def test_the_default_collections_count_is_quoted_right_everywhere(counts):
    """The default collection's total, where the README, the design and its config say it."""
    total = sum(counts["config"])
    for doc in ("README.md", "docs/design.md", "config/config.yaml"):
        text = (ROOT / doc).read_text()
        quoted = {int(n) for n in re.findall(r"\((\d+) cells\)", text)}
        assert total in quoted, f"{doc} does not quote the default collection's {total} cells"


@pytest.mark.parametrize("name", CONFIGS)
def test_a_configs_header_quotes_its_own_count(name, counts):
    """A config whose header comment quotes `(N cells)` or `N cells` for itself quotes its own
    count (the first count in the header is its own, or, for one that extends another, one of
    the two: the collection it extends, then its own)."""
    header = []
    for line in (ROOT / "config" / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    quoted = [int(n) for n in re.findall(r"(?<![\d.])(\d+) cells\b", "\n".join(header))]
    if quoted:
        assert sum(counts[name]) in quoted, f"config/{name}.yaml's header quotes {quoted}, it has {sum(counts[name])}"


def test_every_rule_file_the_docs_name_exists():
    named = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        named |= set(re.findall(r"rules/([\w]+\.smk)", doc.read_text()))
    missing = sorted(n for n in named if not (ROOT / "workflow" / "rules" / n).exists())
    assert not missing, f"docs name rule files that do not exist: {missing}"
