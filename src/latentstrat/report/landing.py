"""The landing page of `snakemake --report report.html`: a researcher's first screen.

Snakemake draws the landing page beside the workflow's rule graph in a box centred in the
window, so text taller than the window is pushed above its top where no scrolling reaches it.
The page therefore holds only what decides: the title, the verdict with the per-arm values, the
delta, its interval and the detectable difference, the setup, the next step and links to the
sections. The headline's qualifiers live on the Analysis page (analysis.md), one link away.
"""

from __future__ import annotations

import html as _html

import pandas as pd

from latentstrat.metrics import label, unit
from latentstrat.report.frames import sig3
from latentstrat.report.multiplicity import multiplicity_line
from latentstrat.report.split import split_sentence
from latentstrat.report.tables import plural

# the report's menu sections: report.smk's categories, the landing page's links
FINDING, FIGURES, TABLES = "1. Finding", "2. Figures", "3. Tables"


def _code(text) -> str:
    """A name or command in a monospace font (not <code>: the report's stylesheet draws literal
    backticks around it)."""
    return f'<span style="font-family:monospace">{_html.escape(str(text))}</span>'


# compact tables: the report's stylesheet pads table cells for prose
_TABLE = ' style="margin:0.4em 0;font-size:0.85em;line-height:1.3"'
_CELL = ' style="padding:1px 8px 1px 0"'


def _inline(text: str) -> str:
    """Prose with `name` spans (the headline's reasons) as HTML: escaped, names in monospace."""
    return "".join(_code(p) if i % 2 else _html.escape(p) for i, p in enumerate(text.split("`")))


def verdict_html(brief: dict) -> str:
    """The verdict, first on the page: the primary minus the comparison arm on the endpoint, with
    its interval and the smallest difference the collection could detect."""
    verdict = _html.escape(str(brief.get("verdict", "cannot tell")))
    if brief.get("delta") is None:
        return f"<p><strong>Verdict: {verdict}</strong> ({_inline(brief.get('why') or 'no contrast')}).</p>"
    arms = brief.get("primary_contrast") or {}
    metric = brief.get("primary_endpoint") or ""
    level = f"{100 * (1 - float(brief.get('alpha') or 0.05)):.4g}%"
    why = f" Why: {_inline(brief['why'])}." if brief.get("why") else ""
    if brief.get("unchecked"):
        why += f" <strong>Unchecked</strong>: {_inline('; '.join(brief['unchecked']))}."
    return (
        f"<p><strong>Verdict: {verdict}</strong>. {_code(arms.get('primary_arm'))} minus "
        f"{_code(arms.get('comparison_arm'))} in {_html.escape(label(metric))}{_unit(metric)}: "
        f"<strong>{sig3(brief['delta'])}</strong>, {level} interval {sig3(brief['ci_low'])} to "
        f"{sig3(brief['ci_high'])}; the smallest difference this collection could detect: "
        f"{sig3(brief.get('detectable_delta'))}.{why}</p>"
    )


def _p(line: str) -> str:
    return f"<p>{_html.escape(line)}</p>" if line else ""


def split_html(brief: dict) -> str:
    """The declared split of the contrast (scale / weighting) in one line under the verdict."""
    line = split_sentence(brief.get("contrast_split") or [], brief.get("primary_endpoint") or "")
    return f"<p>{_html.escape(line)}</p>" if line else ""


def _unit(metric: str) -> str:
    u = unit(metric)
    return f" ({u})" if u else ""


def arm_rows(summary: pd.DataFrame, brief: dict) -> list[tuple[str, str, str, str]]:
    """Per arm of the primary contrast: its cells, the endpoint's mean over them (with the
    range) and their states."""
    arms = brief.get("primary_contrast") or {}
    metric = brief.get("primary_endpoint") or ""
    states = brief.get("cell_states") or {}
    rows = []
    for arm in (arms.get("primary_arm"), arms.get("comparison_arm")):
        if arm is None or summary.empty or metric not in summary.columns:
            continue
        v = pd.to_numeric(summary.loc[summary.arm == arm, metric], errors="coerce").dropna()
        value = f"{sig3(v.mean())} ({sig3(v.min())} to {sig3(v.max())})" if len(v) else "NA"
        state = ", ".join(f"{n} {s}" for s, n in (states.get(arm) or {}).items())
        rows.append((str(arm), str(len(v)), value, state))
    return rows


def _table(head: list[str] | None, rows, first_code: bool = False, caption: str = "") -> str:
    th = "<thead><tr>" + "".join(f"<th{_CELL}>{_html.escape(h)}</th>" for h in head) + "</tr></thead>" if head else ""
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{_CELL}>{_code(c) if (first_code and i == 0) else _html.escape(str(c))}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    cap = f'<caption style="text-align:left;font-weight:600">{_html.escape(caption)}</caption>' if caption else ""
    return f"<table{_TABLE}>{cap}{th}<tbody>{body}</tbody></table>"


def setup_rows(settings: pd.DataFrame, metadata: pd.DataFrame, setup: dict) -> list[tuple[str, str]]:
    """What the cells ran on: model, training, tasks, data (aggregate meta `setup`), the seeds per
    setting (summary_by_setting's `n_seeds`), and the code, dates and hardware the cells recorded
    (the Collection Metadata table, aggregate.fairness.collection_metadata)."""
    rows = [(k, str(setup.get(k) or "not recorded")) for k in ("model", "training", "tasks", "data per task")]
    seeds = "not recorded"
    if not settings.empty and "n_seeds" in settings.columns:
        n = settings.n_seeds
        seeds = f"{n.min()}-{n.max()} per setting" if n.min() != n.max() else f"{n.min()} per setting"
    field = dict(zip(metadata.field, metadata.value)) if {"field", "value"} <= set(metadata.columns) else {}

    def said(name: str) -> str:
        return field.get(name) or "not recorded"

    return [
        *rows,
        ("seeds", seeds),
        ("code", said("code versions")),
        ("trained", f"{said('first cell started')} to {said('last cell finished')}"),
        ("hardware", f"{said('devices')}; {said('CPUs (capability)')}"),
        ("machines", said("machines (pairs)")),
    ]


def _link(text: str, onclick: str) -> str:
    return f'<a href="#" onclick="{_html.escape(onclick)}; return false;">{_html.escape(text)}</a>'


def links(pages: dict[str, str]) -> str:
    """Links to the report's sections: a page opens in the report (Snakemake's `app.setView` on
    the page's entry in `results`), a section opens its menu."""
    out = [
        _link(title, f"app.setView({{content: 'html', contentPath: results['{path}'].data_uri, resultPath: '{path}'}})")
        for title, path in pages.items()
    ]
    out += [_link(s[3:], f"app.showCategory('{s}')") for s in (FIGURES, TABLES)]
    return "<p>Read on: " + " · ".join(out) + ".</p>"


def next_step(brief: dict, followup_path: str | None) -> str:
    """The next step in one line: the follow-up's command, or why there is none."""
    if brief.get("followup") and followup_path:
        cmd = f"snakemake --configfile {followup_path} --cores 2"
        return (
            f"<p><strong>Next:</strong> {_code(cmd)} here, or with {_code('--profile slurm')} in place of "
            f"{_code('--cores 2')} on the cluster (its first lines say which seeds it adds and why).</p>"
        )
    if brief.get("verdict") == "cannot tell":
        return "<p><strong>Next:</strong> no follow-up planned; the Analysis page says what limits the verdict.</p>"
    return "<p><strong>Next:</strong> none needed: the interval decides.</p>"


def sanity_line(brief: dict) -> str:
    """The cell sanity check in one line."""
    complete = (brief.get("cells") or {}).get("complete", 0)
    expected = (brief.get("cells") or {}).get("expected", 0)
    done = f"{complete} of {expected} cells complete" + ("" if complete == expected else " (partial)")
    failing, unchecked = brief.get("failing_cells") or [], brief.get("unchecked_cells") or []
    passed = brief.get("cell_checks_passed")
    if passed:
        check = "every complete cell passes the sanity check"
    elif failing:
        check = f"<strong>{len(failing)} failing the sanity check</strong> (Tables: Cell sanity)"
    elif unchecked:
        check = f"<strong>{len(unchecked)} not fully checked</strong> (Tables: Cell sanity)"
    else:
        check = "nothing checked yet"
    mixed, unknown = brief.get("pairs_mixing_hosts") or [], brief.get("pairs_with_unknown_hosts") or []
    hosts = "".join(
        f"; <strong>{plural(len(rows), 'setting')} {what}</strong>"
        for rows, what in ((mixed, "with pairs that mix hosts"), (unknown, "with pairs whose host is not recorded"))
        if rows
    )
    return f"<p>{done}; {check}{hosts}.</p>"


def landing_html(brief: dict, t: dict, setup: dict, pages: dict, followup_path: str | None) -> str:
    """The landing page's body (HTML) from brief.yaml's keys and the aggregate tables `t`:
    verdict, arms, next step, setup, links."""
    summary, metadata = t.get("summary", pd.DataFrame()), t.get("collection_metadata", pd.DataFrame())
    metric = brief.get("primary_endpoint") or ""
    head = ["arm", "cells", f"{label(metric)}{_unit(metric)}: mean (range)", "cell states"]
    arms = _table(head, arm_rows(summary, brief), True)
    return "\n".join(
        [
            verdict_html(brief),
            split_html(brief),
            _p(multiplicity_line(brief)),
            arms,
            next_step(brief, followup_path),
            sanity_line(brief),
            _table(None, setup_rows(t.get("summary_by_setting", pd.DataFrame()), metadata, setup), caption="Setup"),
            links(pages),
        ]
    )


def landing_rst(brief: dict, t: dict, setup: dict, pages: dict, followup_path: str | None) -> str:
    """The landing page as Snakemake reads it: reStructuredText (a title, then the body as a raw
    HTML block), wrapped so its Jinja pass leaves it alone."""
    title = f"latentstrat: {brief.get('collection') or 'collection'}"
    body = landing_html(brief, t, setup, pages, followup_path)
    raw = ".. raw:: html\n\n" + "\n".join("   " + line for line in body.splitlines()) + "\n"
    return jinja_raw(f"{title}\n{'=' * len(title)}\n\n" + raw)


def jinja_raw(text: str) -> str:
    """Text Snakemake's Jinja pass leaves alone."""
    return "{% raw %}" + text + "{% endraw %}"
