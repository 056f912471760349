"""The collection's pages in `snakemake --report` (the HTML report a Snakemake user shares):

- `landing.rst`: the report's landing page (report.landing; the workflow's `report:` directive
  points to it once the report job has written it);
- `captions.rst`: one caption per figure, selected by the figure's name (a Jinja `if` over
  `snakemake.wildcards.figure`, as Snakemake renders captions): the question it answers, what is
  plotted, how to read it, and the collection's own numbers for it (figures.FIGURE_NOTES);
- `html/`: analysis.md and results.md rendered, and the tables a reader checks a verdict with
  (contrasts, cell states, cell sanity, fairness, data availability) as HTML pages;
- `figure_pages/`: each figure with its caption under it (the report's Figures section).
"""

from __future__ import annotations

import base64
import html as _html
import re
from pathlib import Path

import pandas as pd
from markdown_it import MarkdownIt

from latentstrat.io import write_text
from latentstrat.report.figures import FIGURE_NOTES, FIGURES, QUESTIONS
from latentstrat.report.forest import primary_contrast_frame
from latentstrat.report.frames import arm_numbers, heatmap_numbers, sig3
from latentstrat.report.landing import jinja_raw, landing_rst
from latentstrat.report.tables import md_table, plural

# file name in html/ -> (title, aggregate table, what it shows)
TABLE_PAGES = {
    "contrasts": ("Arm contrasts", "arm_contrasts", "every metric's arm contrast: delta, interval, verdict"),
    "contrast_by_family": (
        "Contrast by family",
        "contrast_by_family",
        "the primary endpoint per reconstruction family: the family alone and the grid without it",
    ),
    "contrast_split": (
        "Scale or weighting",
        "contrast_split",
        "the declared split of the primary contrast: each part with its interval, and their total",
    ),
    "cell_states": ("Cell states", "cell_states", "each cell's state (empty / strategy / other) and its evidence"),
    "cell_sanity": ("Cell sanity", "cell_sanity", "each cell against the entangled model: the sanity check"),
    "fairness": ("Fairness", "fairness", "what the comparison can claim: matched settings, coverage, seeds"),
    "data_availability": (
        "Data availability",
        "data_availability",
        "which diagnostics have data here, and where missing ones would come from",
    ),
}
PAGES = {"analysis": "Analysis", "results": "Results"}
FIGURE_PAGES = "figure_pages"  # beside figures/: one page per figure, its caption under it


def markdown_html(text: str) -> str:
    """Markdown (CommonMark with tables) as an HTML fragment."""
    return MarkdownIt("commonmark").enable("table").render(text)


def page(title: str, body: str) -> str:
    """A standalone HTML page (the report shows it in a frame)."""
    style = (
        "body{font-family:system-ui,sans-serif;max-width:72em;margin:1em auto;padding:0 1em;line-height:1.45}"
        "table{border-collapse:collapse;font-size:0.85em}td,th{border:1px solid #ccc;padding:2px 6px}"
        "th{background:#f3f3f3}code{background:#f6f6f6}img{max-width:100%}"
    )
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{_html.escape(title)}</title>'
        f"<style>{style}</style></head><body>\n{body}\n</body></html>\n"
    )


# ----------------------------------------------------------------------------- figure captions


def dominance_numbers(t: dict) -> str:
    """The token-count dominance figure's numbers: per aggregation, the largest loss share of one task
    against its share of examples, at the last checkpoint."""
    d = t.get("token_dominance", pd.DataFrame())
    if d.empty or not {"loss_share", "example_share", "checkpoint"} <= set(d.columns):
        return ""
    parts = []
    for agg, g in d.groupby("token_aggregation", sort=False):
        last = g[g.checkpoint == list(dict.fromkeys(g.checkpoint))[-1]]  # in training order (initialization, final)
        top = last.loc[last.loss_share.idxmax()]
        parts.append(
            f"under ``{agg}``, {top.task} takes {top.loss_share:.0%} of the loss with {top.example_share:.0%} "
            "of the examples"
        )
    return "In this collection, at the end of training: " + "; ".join(parts) + "."


def _rst_text(text: str) -> str:
    """Prose as reStructuredText: `x` as a literal, | and * not markup."""
    text = text.replace("|", "\\|").replace("*", "\\*")
    return text.replace("``", "\0").replace("`", "``").replace("\0", "``")


def forest_numbers(t: dict) -> str:
    """The forest plot's numbers, from the frame it draws (figures.primary_contrast_frame)."""
    got = primary_contrast_frame(t)
    if got is None:
        return ""
    frame, head = got
    above = int((frame.ci_low > 0).sum())
    below = int((frame.ci_high < 0).sum())
    level = f"{100 * (1 - float(head.get('alpha', 0.05))):.4g}%"
    return (
        f"In this collection: grid mean {sig3(head.mean_delta)} ({level} interval {sig3(head.ci_low)} to "
        f"{sig3(head.ci_high)}: {head.verdict}) over {plural(len(frame), 'setting')}, {above} with an interval "
        f"above 0 and {below} below; detectable difference {sig3(head.detectable_delta)}."
    )


def figure_caption(t: dict, name: str) -> str:
    """A figure's caption as Markdown: what it shows, then this collection's numbers, each computed
    from the frame the figure draws (`forest_numbers`, `dominance_numbers`, `frames.heatmap_numbers`,
    `frames.arm_numbers`)."""
    note = FIGURE_NOTES[name]
    if name == "primary_contrast":
        numbers = forest_numbers(t)
    elif name == "token_count_dominance":
        numbers = dominance_numbers(t)
    elif name == "objective_scale_heatmap":
        numbers = heatmap_numbers(t)
    else:
        numbers = arm_numbers(t, note.frame, note.metric)
    return " ".join(x for x in (note.text, numbers.replace("``", "`")) if x)


def captions_rst(made: list[tuple[str, str]], captions: dict[str, str]) -> str:
    """One caption per made figure (`captions`: figure -> its caption, figure_caption), selected
    by `snakemake.wildcards.figure`."""
    blocks = []
    for name, title in made:
        note = FIGURE_NOTES[name]
        body = f"**{title}** ({QUESTIONS[note.question]})\n\n{_rst_text(captions[name])}\n"
        blocks.append(
            "{% "
            + ("if" if not blocks else "elif")
            + f' snakemake.wildcards.figure == "{name}" %}}\n'
            + jinja_raw(body)
            + "\n"
        )
    if not blocks:
        return "No figure.\n"
    return "".join(blocks) + "{% else %}\nFigure ``{{ snakemake.wildcards.figure }}``.\n{% endif %}\n"


def figure_question(name: str) -> str:
    """The report subcategory of a figure file (its question); unknown names go last."""
    note = FIGURE_NOTES.get(name)
    return f"{note.question + 1}. {QUESTIONS[note.question]}" if note else "Other"


def figure_title(name: str) -> str:
    return FIGURES[name][0] if name in FIGURES else name


# ----------------------------------------------------------------------------- pages


def _data_uri(png: Path) -> str:
    """A PNG as a data URI (the image itself, base64); its path when the file is absent."""
    if not png.is_file():
        return f"../figures/{png.name}"
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def write_pages(t: dict, out_dir: Path) -> list[str]:
    """html/<page>.html for analysis.md, results.md and TABLE_PAGES; returns the files written."""
    html_dir = Path(out_dir) / "html"
    written = []
    for stem, title in PAGES.items():
        src = Path(out_dir) / f"{stem}.md"
        if src.exists():
            # the figures travel inside the page (Snakemake's report shows a page where no
            # relative path to figures/ resolves)
            body = re.sub(
                r'src="figures/([\w.-]+\.png)"',
                lambda m: f'src="{_data_uri(Path(out_dir) / "figures" / m[1])}"',
                markdown_html(src.read_text()),
            )
            write_text(page(title, body), html_dir / f"{stem}.html")
            written.append(f"{stem}.html")
    for stem, (title, table, what) in TABLE_PAGES.items():
        df = t.get(table, pd.DataFrame())
        body = f"<h2>{_html.escape(title)}</h2><p>{_html.escape(what)}.</p>"
        body += markdown_html(md_table(df)) if len(df) else "<p>(empty)</p>"
        write_text(page(title, body), html_dir / f"{stem}.html")
        written.append(f"{stem}.html")
    return written


def write_figure_pages(made: list[tuple[str, str]], captions: dict[str, str], out_dir: Path) -> None:
    """figure_pages/<figure>.html: each figure with its caption under it (what the report's
    Figures section shows; the PNG travels inside the page)."""
    pages_dir = Path(out_dir) / FIGURE_PAGES
    pages_dir.mkdir(parents=True, exist_ok=True)
    for name, title in made:
        note = FIGURE_NOTES[name]
        png = _data_uri(Path(out_dir) / "figures" / f"{name}.png")
        body = (
            f"<h2>{_html.escape(title)}</h2><p><em>{_html.escape(QUESTIONS[note.question])}</em></p>"
            f'<figure><img src="{png}" alt="{_html.escape(title)}">'
            f"<figcaption>{markdown_html(captions[name])}</figcaption></figure>"
        )
        write_text(page(title, body), pages_dir / f"{name}.html")


def write_html_report(t: dict, brief: dict, made, out_dir, meta: dict) -> None:
    """landing.rst, captions.rst, html/ and the figure pages into out_dir (the report folder)."""
    out_dir = Path(out_dir)
    write_pages(t, out_dir)
    captions = {name: figure_caption(t, name) for name, _ in made}
    write_figure_pages(made, captions, out_dir)
    write_text(captions_rst(made, captions), out_dir / "captions.rst")
    pages = {title: str(out_dir / "html" / f"{stem}.html") for stem, title in PAGES.items()}
    followup = (meta.get("followup") or {}).get("path")
    landing = landing_rst(brief, t, meta.get("setup") or {}, pages, followup)
    write_text(landing, out_dir / "landing.rst")
