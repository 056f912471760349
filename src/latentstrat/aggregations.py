"""Token aggregations, each declared once (design section 4, docs/design.md): how a trace's
per-token values v_it become one number per example, the setting the default collection ablates.

Every aggregation is A_i(v) = sum_t v_it / d_i, with its divisor d_i a function of the example's
supervised tokens n_i and the train split's mean n_bar. Its declaration holds that divisor and
whether long traces weigh more (`length_weighted`: every token counts alike, so an example
counts in proportion to its tokens). The objective
(`modeling.objective.aggregate_tokens`), the reference stage's scales (one S_ref and T_ref per
declared aggregation), the summed NLL the metrics undo it to and the config schema's accepted
names all read the declarations here.

Adding an aggregation: one `declare(Aggregation(...))` below and a test with its hand-computed
value (tests/test_aggregations.py trains a cell on a toy one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from latentstrat.named_kinds import Kinds


@dataclass(frozen=True)
class Aggregation:
    """The declaration of one token aggregation (a kind of the shared `named_kinds.Kinds` whose
    name is its only spelling).

    name            the setting's value (`sum`)
    divisor         (n_i, n_bar) -> d_i, so that A_i(v) = sum_t v_it / d_i (n_i a tensor or array
                    of supervised-token counts, at least 1; n_bar the train split's mean n_i)
    length_weighted every token counts alike across examples: a long trace weighs in
                    proportion to its tokens (`sum`), not as one example (`mean`)
    """

    name: str
    divisor: Callable[[Any, float | None], Any]
    length_weighted: bool

    @property
    def syntax(self) -> str:
        return self.name

    @property
    def pattern(self) -> str:
        return re.escape(self.name)


AGGREGATIONS = Kinds("token aggregation")
declare = AGGREGATIONS.declare  # add a token aggregation (its name unique)


def aggregation(name: str) -> Aggregation:
    """The declaration of `name`; an unknown name is a ValueError listing the declared ones."""
    if name not in AGGREGATIONS:
        raise ValueError(f"unknown token aggregation {name!r} (expected one of {tuple(AGGREGATIONS)})")
    return AGGREGATIONS[name]


def _n_bar(n, n_bar: float | None) -> float:
    if not n_bar or n_bar <= 0:
        raise ValueError(f"token aggregation sum_scaled needs n_bar > 0 (got {n_bar!r})")
    return n_bar


# ----------------------------------------------------------------------------- the aggregations

declare(
    Aggregation(
        name="mean",
        divisor=lambda n, n_bar: n,
        length_weighted=False,
    )
)
declare(
    Aggregation(
        name="sum",
        divisor=lambda n, n_bar: 1.0,
        length_weighted=True,
    )
)
declare(
    Aggregation(
        name="sum_scaled",
        divisor=_n_bar,
        length_weighted=True,
    )
)
