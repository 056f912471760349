"""Reconstruction families, each declared once (design section 4, docs/design.md).

Every cell computes and logs the same three reconstruction terms per example (`TERMS`): `raw`,
mean_i A_i(l); `dist_norm`, raw over the entangled model's S_ref; `tokcc`, the token-weighted
A_i(w * l) over T_ref with w = (b + 1e-3)^alpha. A family is the formula a cell optimizes over
those terms (its `active` objective). Its declaration (`Kind`) holds everything else that depends
on it: the name pattern and parameters, the label tables and figures print, the per-example
formula, the value the z-free model scores (the objective's unit, which the gradient clip is
measured in), and, through its tokcc exponent `alpha`, the scales the reference stage measures.

A name is parsed once, at the edge (`parse_family`), into a `Family`; the config schema's
pattern and the config's error text are generated from the declarations here.

Adding a family: one `declare(Kind(...))` below and a test with its hand-computed value (the
recipe is in docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from latentstrat import named_kinds
from latentstrat.metrics import LOSS_METRIC_OF
from latentstrat.named_kinds import Kinds

DEFAULT_ALPHA = 0.25  # the tokcc exponent of a family that names none

# reconstruction term -> the metric it is logged as (history, evaluation records, metrics row):
# the metrics declared with that `loss_term` (latentstrat.metrics), the KL and the family's own
# objective (`active`) aside
TERMS = {t: m for t, m in LOSS_METRIC_OF.items() if t not in ("kl", "active")}


@dataclass(frozen=True)
class Kind(named_kinds.Kind):
    """The declaration of one family of reconstruction objectives: its name, syntax and pattern
    (named_kinds.Kind; parameters are numbers), and

    label    Family -> the label tables and figures print (`tokcc a.25`)
    active   (Family, terms) -> the per-example objective from the per-example TERMS
    zfree    (Family, scales) -> its value for the z-free model on the validation split, where
             S_ref and T_ref are measured (`scales`: {"S_ref", "T_ref", "n_bar"})
    normalized  its objective is measured against the entangled model's (a scale of order 1 under
             every aggregation), not in nats: the report reads the normalized families' aggregation
             effect apart from raw's, whose scale the aggregation sets
    """

    label: Callable[["Family"], str]
    active: Callable[["Family", dict], Any]
    zfree: Callable[["Family", dict], float]
    normalized: bool


@dataclass(frozen=True)
class Family(named_kinds.Named):
    """A parsed family name: its kind and parameters (`alpha` always set: the tokcc term and its
    T_ref use it in every cell)."""

    @property
    def alpha(self) -> float:
        return dict(self.params).get("alpha", DEFAULT_ALPHA)

    @property
    def normalized(self) -> bool:
        return self.declaration.normalized

    @property
    def label(self) -> str:
        return self.declaration.label(self)

    def active(self, terms: dict):
        """The objective per example from the per-example reconstruction terms."""
        return self.declaration.active(self, terms)

    def zfree(self, scales: dict) -> float:
        """What the z-free model scores on this objective: its natural unit."""
        return float(self.declaration.zfree(self, scales))


KINDS = Family.kinds = Kinds("reconstruction family")
declare = KINDS.declare  # add a family kind (its name unique)
accepted_names = KINDS.accepted_names  # the names every declared family accepts
# one regular expression accepting every declared family's names (the config schema's
# `$defs.family.pattern`; latentstrat.schema sets it from here)
name_pattern = KINDS.name_pattern


def parse_family(name: str) -> Family:
    """The Family a name denotes; ValueError naming it and the accepted names otherwise."""
    return Family(*KINDS.parse(name, float))


def family_label(name: str) -> str:
    """The label tables and figures print for a family name: `tokcc a.25`, `dist+tokcc 0.05/0.95`."""
    return parse_family(name).label


def short_number(x: float) -> str:
    """0.25 -> '.25', 1 -> '1' (the original study's labels)."""
    s = f"{x:g}"
    return s[1:] if s.startswith("0.") else s


# ----------------------------------------------------------------------------- the families

declare(
    Kind(
        name="raw",
        syntax="raw",
        pattern=r"raw",
        label=lambda f: "raw",
        active=lambda f, t: t["raw"],
        zfree=lambda f, s: s["S_ref"],
        normalized=False,
    )
)
declare(
    Kind(
        name="dist_norm",
        syntax="dist_norm",
        pattern=r"dist_norm",
        label=lambda f: "dist norm",
        active=lambda f, t: t["dist_norm"],
        zfree=lambda f, s: 1.0,
        normalized=True,
    )
)
declare(
    Kind(
        name="tokcc",
        syntax="tokcc_a<alpha>",
        pattern=r"tokcc_a(?P<alpha>[0-9.]+)",
        label=lambda f: f"tokcc a{short_number(f.alpha)}",
        active=lambda f, t: t["tokcc"],
        zfree=lambda f, s: 1.0,
        normalized=True,
    )
)
declare(
    Kind(
        name="dist_tokcc",
        syntax="dist_tokcc_<p>_<q>[_a<alpha>]",
        pattern=r"dist_tokcc_(?P<p>[0-9.]+)_(?P<q>[0-9.]+)(?:_a(?P<alpha>[0-9.]+))?",
        label=lambda f: (
            f"dist+tokcc {f['p']:g}/{f['q']:g}" + ("" if f.alpha == DEFAULT_ALPHA else f" a{short_number(f.alpha)}")
        ),
        active=lambda f, t: f["p"] * t["dist_norm"] + f["q"] * t["tokcc"],
        zfree=lambda f, s: f["p"] + f["q"],
        normalized=True,
    )
)
