"""The primary contrast split into declared parts (report.contrast_split, docs/design.md "Scale or
weighting").

`sum` differs from `mean` in two ways at once: the objective's scale (a trace's reconstruction is
about n_bar times larger under `sum`, so the KL weighs about n_bar times less) and the weighting of
its tokens (long traces count more). `sum_scaled` (sum / n_bar) has the weighting of `sum` at the
scale of `mean`, so on the settings all three arms share

    sum - mean = (sum - sum_scaled) + (sum_scaled - mean) = scale + weighting,

exactly, setting by setting: each part is a difference of the same seed means. Each part is read
like the headline (contrasts.contrast_row: test-input and training noise in its interval, its own
replicates' paired deltas), at the look's level divided by the number of parts (Bonferroni over
the declared family of parts); the `total` row is the primary contrast on the same settings, at
the same level, and equals the sum of the parts.
"""

from __future__ import annotations

import pandas as pd

from latentstrat.aggregate.columns import FAMILY_COL
from latentstrat.aggregate.contrasts import CONTRAST_COLUMNS, common_cells, contrast_row

# a part's row: which arms, on which settings, then the headline's own columns (contrasts.CONTRAST_COLUMNS)
SPLIT_READS = (
    "mean_delta",
    "ci_low",
    "ci_high",
    "verdict",
    "why",
    "alpha",
    "training_noise_in_interval",
    "se",
    "detectable_delta",
)
SPLIT_COLUMNS = ["part", "minuend", "subtrahend", "metric", "n_cells", "settings"] + [
    c for c in CONTRAST_COLUMNS if c in SPLIT_READS
]


def _setting_keys(c: pd.DataFrame) -> set:
    return set(zip(c[FAMILY_COL], c["beta_label"])) if len(c) else set()


def split_contrasts(
    split: list[dict],
    rows: dict[str, pd.DataFrame],
    grid_axes,
    bootstrap: dict | None,
    cells: dict,
    states: dict | None,
    metric: str,
    alpha: float,
) -> pd.DataFrame:
    """One row per declared part (arms[0] minus arms[1]) and a `total` row (the first part's
    minuend minus the last part's subtrahend), each over the settings every arm of the split has,
    at level alpha / len(split). `rows`: arm name -> its setting rows (the primary arm's too)."""
    if not split:
        return pd.DataFrame(columns=SPLIT_COLUMNS)
    total = {"name": "total", "arms": [split[0]["arms"][0], split[-1]["arms"][1]]}
    level = alpha / len(split)
    commons = {}
    for part in [*split, total]:
        a, b = part["arms"]
        if a not in rows or b not in rows or rows[a].empty or rows[b].empty:
            commons[part["name"]] = pd.DataFrame()
            continue
        commons[part["name"]], _ = common_cells(
            rows[a], rows[b], grid_axes, f"{a} - {b}", [metric], bootstrap=bootstrap, cells=cells, states=states
        )
    shared = None
    for c in commons.values():
        shared = _setting_keys(c) if shared is None else shared & _setting_keys(c)
    out = []
    for part in [*split, total]:
        c = commons[part["name"]]
        if len(c):
            c = c[[k in shared for k in zip(c[FAMILY_COL], c["beta_label"])]]
        r = contrast_row(part["name"], c, metric, bootstrap, level)
        settings = ", ".join(f"{f} {b}" for f, b in sorted(_setting_keys(c)))
        out.append(
            {
                "part": part["name"],
                "minuend": part["arms"][0],
                "subtrahend": part["arms"][1],
                "settings": settings,
                **{k: r[k] for k in SPLIT_COLUMNS if k in r},
            }
        )
    return pd.DataFrame(out, columns=SPLIT_COLUMNS)
