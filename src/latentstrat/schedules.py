"""KL weight schedules, each declared once (design section 4, docs/design.md): how the KL weight
beta of J reaches its value over the optimizer steps, the setting `beta_schedule`.

A schedule's declaration (`Kind`) holds its name pattern and parameters, the factor f(step) in
[0, 1] the objective multiplies beta by, and the step from which f is 1 (its warm-up). A name is
parsed once, at the edge (`parse_schedule`), into a `Schedule`; the config schema's pattern and
the config's error text are generated from the declarations here.

Adding a schedule: one `declare(Kind(...))` below and a test with its hand-computed factors
(tests/test_schedules.py trains a cell on a toy one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from latentstrat import named_kinds
from latentstrat.named_kinds import Kinds


@dataclass(frozen=True)
class Kind(named_kinds.Kind):
    """The declaration of one kind of KL weight schedule: its name, syntax and pattern
    (named_kinds.Kind; parameters are integers), and

    factor   (Schedule, step) -> the fraction of beta in J after `step` optimizer steps, in [0, 1]
    warmup   Schedule -> the first step from which the factor is 1 (0: beta from the start)
    """

    factor: Callable[["Schedule", int], float]
    warmup: Callable[["Schedule"], int]


@dataclass(frozen=True)
class Schedule(named_kinds.Named):
    """A parsed schedule name: its kind and parameters."""

    def factor(self, step: int) -> float:
        return float(self.declaration.factor(self, int(step)))

    @property
    def warmup(self) -> int:
        return int(self.declaration.warmup(self))


KINDS = Schedule.kinds = Kinds("beta schedule", joiner=" or ")
declare = KINDS.declare  # add a schedule kind (its name unique)
accepted_names = KINDS.accepted_names  # the names every declared schedule accepts
# one regular expression accepting every declared schedule's names (the config schema's
# `$defs.schedule.pattern`; latentstrat.schema sets it from here)
name_pattern = KINDS.name_pattern


def parse_schedule(name: str) -> Schedule:
    """The Schedule a name denotes; ValueError naming it and the accepted names otherwise."""
    return Schedule(*KINDS.parse(name, int))


# ----------------------------------------------------------------------------- the schedules

declare(
    Kind(
        name="constant",
        syntax="constant",
        pattern=r"constant",
        factor=lambda s, step: 1.0,
        warmup=lambda s: 0,
    )
)
declare(
    Kind(
        name="linear",
        syntax="lin<N>",
        pattern=r"lin(?P<steps>[1-9][0-9]*)",
        factor=lambda s, step: min(1.0, step / s["steps"]),
        warmup=lambda s: s["steps"],
    )
)
