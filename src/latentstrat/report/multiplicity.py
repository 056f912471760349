"""Which of a report's verdicts are confirmatory and which exploratory (docs/design.md,
Multiplicity). The headline is the one confirmatory verdict: one endpoint on one contrast, both
declared before the data, at the look's level, inside the looks' error budget. The declared split
of that contrast (`report.contrast_split`) is declared too and adjusted within itself (each part at
the level over the number of parts: Bonferroni), but outside the budget: secondary. Every other
verdict in the report is at its own level with no adjustment for the others, so it is labelled
exploratory: a lead for the next declared collection, not a finding. This module counts them and
says so in one place."""

from __future__ import annotations

import pandas as pd

from latentstrat.report.tables import plural

EXPLORATORY = "exploratory (unadjusted)"


def exploratory_verdicts(t: dict, head: dict) -> dict[str, int]:
    """How many verdicts beside the headline and the split each table of the report carries: the
    other metrics and arms, the per-family contrasts, the per-setting verdicts, the normalized
    families' secondary and, in a follow-up, the verdict over every seed."""

    def n(name: str) -> int:
        df = t.get(name, pd.DataFrame())
        return 0 if df is None else len(df)

    counts = {
        "other metrics and arms": max(n("arm_contrasts") - (1 if head.get("delta") is not None else 0), 0),
        "per-family contrasts": n("contrast_by_family"),
        "per-setting verdicts": n("common_cells")
        * max(len(set(t.get("arm_contrasts", pd.DataFrame()).get("metric", []))), 1)
        if n("common_cells")
        else 0,
        "normalized families' secondary": 1 if head.get("normalized_families") else 0,
        "follow-up verdict over every seed": 1 if head.get("pooled") else 0,
    }
    return {k: v for k, v in counts.items() if v}


def multiplicity(t: dict, head: dict, split: list[dict]) -> dict:
    """brief.yaml's `multiplicity`: the confirmatory verdict, the declared secondary ones and the
    count of exploratory ones."""
    counts = exploratory_verdicts(t, head)
    return {
        "confirmatory": ["headline"],
        "declared_secondary": [f"contrast split ({len(split)} parts, Bonferroni within)"] if split else [],
        "exploratory": sum(counts.values()),
        "exploratory_by_kind": counts,
    }


def multiplicity_md(m: dict) -> list[str]:
    """analysis.md's Multiplicity section."""
    kinds = ", ".join(f"{k} {v}" for k, v in m["exploratory_by_kind"].items()) or "none"
    split = (
        " Declared too, and adjusted within itself but outside that budget: the split of its contrast (each part "
        "at the look's level over the number of parts, Bonferroni), secondary to the headline."
        if m.get("declared_secondary")
        else ""
    )
    return [
        "## Multiplicity\n",
        "Confirmatory: the headline verdict alone (one endpoint on one contrast, both declared before the data, at "
        f"the look's level, inside the looks' error budget).{split} Every other verdict in this report is "
        f"**{EXPLORATORY}**: each at its own level, with no adjustment for the "
        f"{plural(m['exploratory'], 'other verdict')} beside it ({kinds}). Among that "
        "many, some read a sign by chance; take them as leads for a next collection that declares them.\n",
    ]


def multiplicity_line(brief: dict) -> str:
    """The landing page's one line: how many verdicts decide and how many are exploratory."""
    m = brief.get("multiplicity") or {}
    if not m:
        return ""
    split = f"; declared secondary: {', '.join(m['declared_secondary'])}" if m.get("declared_secondary") else ""
    return (
        f"Confirmatory: the {' and '.join(m['confirmatory'])}{split}; {plural(m['exploratory'], 'other verdict')} "
        f"in the report are {EXPLORATORY} (Analysis: Multiplicity)."
    )
