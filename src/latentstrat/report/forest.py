"""The primary contrast as one picture: a forest plot of each common setting's paired delta with
its interval, the grid mean with the headline's interval, zero and the detectable difference as
a band (the landing page's figure; its caption's numbers come from the same frame)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from latentstrat.aggregate.columns import FAMILY_COL  # noqa: E402
from latentstrat.metrics import label  # noqa: E402


def primary_contrast_frame(t) -> tuple[pd.DataFrame, pd.Series] | None:
    """The primary contrast's per-setting paired deltas (label, delta, ci_low, ci_high) and its
    grid-mean row (arm_contrasts: mean_delta, ci_low, ci_high, detectable_delta, verdict), from
    the declared primary contrast (`primary_contrast`: its comparison arm and metric); None
    without them. The forest plot draws this frame and its caption quotes it."""
    pc = t.get("primary_contrast", pd.DataFrame())
    c, a = t.get("common_cells", pd.DataFrame()), t.get("arm_contrasts", pd.DataFrame())
    if pc.empty or c.empty or a.empty:
        return None
    arm, metric = pc.comparison_arm.iloc[0], pc.metric.iloc[0]
    col = f"delta_{metric}"
    rows = c[c.comparison_arm == arm]
    head = a[(a.comparison_arm == arm) & (a.metric == metric)]
    if rows.empty or head.empty or col not in rows.columns:
        return None
    frame = pd.DataFrame(
        {
            "setting": rows[FAMILY_COL] + " " + rows["beta_label"],
            "delta": rows[col],
            "ci_low": rows[f"{col}_ci_low"],
            "ci_high": rows[f"{col}_ci_high"],
        }
    ).reset_index(drop=True)
    return frame, head.iloc[0]


def primary_contrast_forest(t):
    """A forest plot of the primary contrast: each common setting's paired delta with its interval,
    the grid mean with the headline's interval, zero, and the detectable difference as a band."""
    got = primary_contrast_frame(t)
    if got is None:
        return None
    frame, head = got
    pc = t["primary_contrast"].iloc[0]
    n = len(frame)
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * (n + 2) + 1.6))
    det = float(head.detectable_delta) if pd.notna(head.detectable_delta) else math.nan
    if math.isfinite(det):
        ax.axvspan(-det, det, color="0.9", label=f"detectable difference (±{det:.3g})")
    ax.axvline(0.0, color="0.3", lw=0.8)
    y = np.arange(n)[::-1] + 2
    ax.errorbar(
        frame.delta,
        y,
        xerr=[frame.delta - frame.ci_low, frame.ci_high - frame.delta],
        fmt="o",
        color="C0",
        ms=4,
        capsize=2,
        label="a setting's paired delta (95% interval)",
    )
    ax.errorbar(
        [head.mean_delta],
        [0],
        xerr=[[head.mean_delta - head.ci_low], [head.ci_high - head.mean_delta]],
        fmt="D",
        color="C3",
        ms=7,
        capsize=3,
        label=f"grid mean ({100 * (1 - float(head.get('alpha', 0.05))):.4g}% interval): {head.verdict}",
    )
    ax.set_yticks([0, *y], ["grid mean", *frame.setting])
    ax.set(
        xlabel=f"{pc.get('primary_arm', 'primary')} minus {pc.comparison_arm}: {label(pc.metric)}",
        title=f"The primary contrast per setting: {label(pc.metric)}",
    )
    ax.legend(loc="best", fontsize=8, framealpha=0.9)
    fig.tight_layout()
    return fig
