"""The calibration's targets (docs/design.md, "The error rate is measured"): how a rate is
measured (`rate`, with its Monte Carlo SE) and what a look must reach to pass: its false signs
(either sign) at most its own level over enough draws to tell (`look_checks`), its coverage at
least 1 - alpha, its power at the printed detectable difference 75-85% (`checks`)."""

from __future__ import annotations

import math

import numpy as np


def rate(x) -> tuple[float, float]:
    """(share, its Monte Carlo SE) of a boolean array."""
    x = np.asarray(x, dtype=float)
    p = float(x.mean()) if len(x) else math.nan
    return p, math.sqrt(p * (1 - p) / len(x)) if len(x) else math.nan


def draws_for(alpha: float) -> int:
    """The fewest draws at which a false-sign rate at `alpha` is measured to a Monte Carlo SE of
    a quarter of alpha: 16 (1 - alpha) / alpha (384 at 0.04, 1,584 at 0.01)."""
    return math.ceil(16 * (1 - alpha) / alpha)


def look_checks(rate_se: tuple[float, float], draws: int, alpha: float, what: str = "false-sign rate") -> list[str]:
    """What a look misses of its own level: its rate of false signs (a sign of either direction
    where the arms do not differ) at most alpha, measured over enough draws (draws_for)."""
    fs, _ = rate_se
    if fs > alpha:
        return [f"{what} {fs:.3f} > its level {alpha:g}"]
    if draws < draws_for(alpha):
        return [
            f"{what}: {draws} draws measure it to a Monte Carlo SE above {alpha / 4:g} ({draws_for(alpha):,} needed)"
        ]
    return []


def checks(row: dict) -> list[str]:
    """The targets a scenario's row misses (empty when it passes): the first look's false signs
    (either sign) at most its level `alpha`, over enough draws to measure that (look_checks);
    coverage at least 1 - alpha and power at the detectable difference 75-85%, each within 2
    Monte Carlo SEs."""
    alpha = row.get("alpha", 0.05)
    out = look_checks(row["false_sign"], row["draws"], alpha)
    cov, cov_se = row["coverage"]
    if cov + 2 * cov_se < 1 - alpha:
        out.append(f"coverage {cov:.3f} < {1 - alpha:g}")
    if "power" in row:
        pw, pw_se = row["power"]
        if not (0.75 - 2 * pw_se <= pw <= 0.85 + 2 * pw_se):
            out.append(f"power {pw:.3f} outside 0.75-0.85")
    return out


def _pm(v: tuple[float, float]) -> str:
    return f"{v[0]:.3f} ± {v[1]:.3f}"
