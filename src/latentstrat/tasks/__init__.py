"""Synthetic multi-strategy tasks and their registry: `TASKS[name] -> Task`.

Every task follows latentstrat.tasks.base.Task (docs/architecture.md, Data).
"""

from latentstrat.tasks.addition import MultidigitAddition
from latentstrat.tasks.base import Task
from latentstrat.tasks.base_conversion import BaseConversion
from latentstrat.tasks.equations import LinearEquations
from latentstrat.tasks.gcd import GcdComputation
from latentstrat.tasks.grid import GridPathfinding
from latentstrat.tasks.reversal import ListReversal
from latentstrat.tasks.sorting import SortingAlgorithms

TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        SortingAlgorithms(),
        GridPathfinding(),
        MultidigitAddition(),
        LinearEquations(),
        BaseConversion(),
        ListReversal(),
        GcdComputation(),
    )
}
