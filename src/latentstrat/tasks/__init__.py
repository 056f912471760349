"""Synthetic multi-strategy tasks and their registry: `TASKS[name] -> Task`.

Every task follows latentstrat.tasks.base.Task (docs/architecture.md, Data).
"""
from latentstrat.tasks.base import Task
from latentstrat.tasks.sorting import SortingAlgorithms

TASKS: dict[str, Task] = {t.name: t for t in (
    SortingAlgorithms(),
)}
