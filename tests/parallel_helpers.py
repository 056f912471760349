"""Worker functions for tests/test_parallel.py: data-parallel workers import them by module
name, so they live in a module of their own (the test puts tests/ on the workers' PYTHONPATH)."""

import torch

from latentstrat.runtime import parallel


def sum_ranks(rank: int, world: int) -> float:
    """Every rank contributes rank + 1; returns the all-reduced sum."""
    x = torch.tensor([float(rank + 1)])
    parallel.all_reduce_sum([x])
    return float(x)


def diverge(rank: int, world: int) -> None:
    """Each rank holds a different value: check_identical must raise on every rank."""
    parallel.check_identical([torch.tensor([float(rank)])], "test")


def crash(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("boom from rank 1")
    parallel.all_reduce_sum([torch.zeros(1)])  # rank 0 waits on a peer that has died
