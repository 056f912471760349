"""Synthetic multi-strategy tasks and their registry (filled by the task modules)."""
TASKS: dict = {}
