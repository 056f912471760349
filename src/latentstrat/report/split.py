"""The declared split of the primary contrast (aggregate.split) as the report says it: brief.yaml's
`contrast_split`, the line under the landing page's verdict and the Analysis page's section."""

from __future__ import annotations

import pandas as pd

from latentstrat.metrics import label
from latentstrat.report.frames import sig3
from latentstrat.report.tables import md_table


def split_parts(t: dict) -> list[dict]:
    """brief.yaml's `contrast_split`: per part (and the total) its arms, settings, delta,
    interval, level and verdict; [] where the collection declares none or has no rows for it."""
    s = t.get("contrast_split", pd.DataFrame())
    if s is None or s.empty:
        return []
    return [
        {
            "part": str(r.part),
            "arms": [str(r.minuend), str(r.subtrahend)],
            "settings": str(r.settings),
            "delta": None if pd.isna(r.mean_delta) else float(r.mean_delta),
            "ci_low": None if pd.isna(r.ci_low) else float(r.ci_low),
            "ci_high": None if pd.isna(r.ci_high) else float(r.ci_high),
            "level": float(1 - r.alpha),
            "verdict": str(r.verdict),
            "why": str(r.why or ""),
        }
        for r in s.itertuples()
    ]


def _part_text(p: dict) -> str:
    if p["delta"] is None:
        return f"{p['part']} ({p['arms'][0]} - {p['arms'][1]}): no cells"
    return (
        f"{p['part']} ({p['arms'][0]} - {p['arms'][1]}) {sig3(p['delta'])} "
        f"[{sig3(p['ci_low'])}, {sig3(p['ci_high'])}]: {p['verdict']}"
    )


def split_sentence(parts: list[dict], metric: str) -> str:
    """One line: on the split's settings, the total = part + part, each with its interval."""
    if not parts:
        return ""
    total = next((p for p in parts if p["part"] == "total"), None)
    pieces = [p for p in parts if p["part"] != "total"]
    if total is None or total["delta"] is None:
        return "The declared split of the contrast has no cells yet."
    level = f"{100 * pieces[0]['level']:.4g}%"
    return (
        f"Split, declared before the data, on {total['settings']}: {total['arms'][0]} - {total['arms'][1]} "
        f"= {sig3(total['delta'])} in {label(metric)} = "
        + " + ".join(_part_text(p) for p in pieces)
        + f" ({level} intervals: the look's level over {len(pieces)} parts)."
    )


def split_md(t: dict, metric: str) -> list[str]:
    """analysis.md's section: the sentence and the table of parts."""
    parts = split_parts(t)
    if not parts:
        return []
    s = t["contrast_split"]
    cols = [
        "part",
        "minuend",
        "subtrahend",
        "settings",
        "n_cells",
        "mean_delta",
        "ci_low",
        "ci_high",
        "alpha",
        "verdict",
    ]
    return [
        "## Scale Or Weighting\n",
        split_sentence(parts, metric) + " Each part is a difference of the same seed means, so the parts add up "
        "to the total setting by setting; each carries its own test-input and training noise. Declared before the "
        "data and Bonferroni-adjusted within the split, but secondary to the headline: outside the looks' error "
        "budget.\n",
        md_table(s, cols),
    ]
