"""router_information taken apart per arm (tabulate.endpoint_decomposition): which part moved.

Per task the primary endpoint is a product, I_t = s_t * r_t * h_t / H_t:
- s_t, `single_strategy_share`: the share of generations that follow exactly one strategy;
- h_t, `followed_strategy_entropy`: the entropy (bits) of the strategies they follow;
- r_t, `router_information_of_followed`: what z tells about the followed strategy relative to h_t;
- H_t: the entropy of the data's strategy mix on the test inputs (the same in every cell).

An arm's router information can fall because fewer generations follow one strategy, because the
followed mix narrows (a collapse: less to tell), or because z tells less about the mix it follows.
The table shows the mean of each part over the arm's settings next to its router information. The
means do not multiply back exactly (a mean of products over tasks and settings is not the product
of the means): they show the direction and size of each part's move.
"""

from __future__ import annotations

import math

import pandas as pd

from latentstrat.metrics import M, label
from latentstrat.report.tables import md_table, primary_arms

PARTS = (M.single_strategy_share, M.followed_strategy_entropy, M.router_information_of_followed)
DECOMPOSITION_METRICS = (*PARTS, M.router_information)


def _mean(values: pd.Series) -> float | None:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return float(v.mean()) if len(v) else None


def decomposition(t: dict) -> dict:
    """arm -> {metric: mean over the arm's setting rows (summary_by_setting), for the three parts
    and router_information; `settings`: how many rows}. A metric no row has (an external arm, an
    aggregate written before the parts) is None. {} without setting rows."""
    s = t.get("summary_by_setting", pd.DataFrame())
    if s is None or s.empty or "arm" not in s.columns:
        return {}
    out = {}
    for arm, g in s.groupby("arm", sort=False):
        out[str(arm)] = {
            **{m: (_mean(g[m]) if m in g.columns else None) for m in DECOMPOSITION_METRICS},
            "settings": int(len(g)),
        }
    return out


def decomposition_md(t: dict) -> list[str]:
    """analysis.md's section: per arm, the means over its settings of the three parts and of
    router_information, and per comparison arm the primary arm's difference in each (a row
    `primary - comparison`). [] without setting rows."""
    d = decomposition(t)
    if not d:
        return []
    cols = ["arm", "settings", *DECOMPOSITION_METRICS]
    nan = lambda v: math.nan if v is None else v  # noqa: E731
    rows = [{"arm": arm, **{k: nan(x) for k, x in v.items()}} for arm, v in d.items()]
    primary = [a for a in primary_arms(t) if a in d]
    for p in primary[:1]:
        for arm in d:
            if arm == p:
                continue
            diff = {
                m: (d[p][m] - d[arm][m] if d[p][m] is not None and d[arm][m] is not None else math.nan)
                for m in DECOMPOSITION_METRICS
            }
            rows.append({"arm": f"{p} - {arm}", "settings": "", **diff})
    table = pd.DataFrame(rows, columns=cols).rename(columns={m: label(m) for m in DECOMPOSITION_METRICS})
    return [
        "## Router Information Decomposed\n",
        "Per task, router information = single-strategy share x information of the followed mix x "
        "followed-strategy entropy / the data's strategy entropy (the same in every cell). Means over each "
        "arm's settings; they show which part moved, and do not multiply back exactly (a mean of products).\n",
        md_table(table, ["arm", "settings", *map(label, DECOMPOSITION_METRICS)]),
    ]
