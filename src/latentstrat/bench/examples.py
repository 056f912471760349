"""Per-example test outcomes for the calibration harness (a `Scenario` with `per_example`): each
simulated cell gets the bits its information probe would assign to every test example, and the
project's own bootstrap (cell.tabulate.information_replicates over metrics.resample_counts, the
same draws for every cell, as in the pipeline) estimates the cell's interval from them. The
harness then holds no true covariance of its own: a bootstrap that misjudges the test inputs'
SE, or stops pairing the cells, shows up in the calibration's false signs and variance ratio.

The model of one example's bits, per cell: the cell's true value plus test-input noise, split
like the cell-level model's (a part shared by every cell on that example, a part shared by one
arm's cells, one by a pair's, the rest the cell's own), scaled so that the mean over N examples
has SE `sd_test`. The strategy entropy of every task is 1 bit, so a task's router information is
its examples' mean bits."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

N_TASKS = 6


def example_bits(
    sc, rng: np.random.Generator, truth: np.ndarray, arm: np.ndarray, pair: np.ndarray, per_task: int
) -> np.ndarray:
    """[cells, tasks, examples] bits with cell means `truth` and the scenario's test-input noise."""
    n, shape = len(truth), (N_TASKS, per_task)
    sd = sc.sd_test * math.sqrt(N_TASKS * per_task)  # the mean over every example has SE sd_test
    shared, by_arm, by_pair, own = sc.test_weights()
    noise = (
        shared * rng.standard_normal(shape)[None]
        + by_arm * rng.standard_normal((arm.max() + 1, *shape))[arm]
        + by_pair * rng.standard_normal((pair.max() + 1, *shape))[pair]
        + own * rng.standard_normal((n, *shape))
    )
    return truth[:, None, None] + sd * noise


def replicates(bits: np.ndarray, name: str, n_boot: int) -> tuple[np.ndarray, np.ndarray]:
    """(each cell's value: the mean over tasks of its examples' mean bits, as a cell's row reads
    it; [cells, n_boot] replicates from the project's bootstrap over the examples)."""
    from latentstrat.cell.tabulate import information_replicates
    from latentstrat.metrics import resample_counts

    n_cells, n_tasks, per_task = bits.shape
    tasks = [f"task{t}" for t in range(n_tasks)]
    ids = [str(i) for i in range(per_task)]
    by_task = {t: pd.DataFrame({"example_id": ids}) for t in tasks}
    counts = resample_counts({t: per_task for t in tasks}, n_boot)
    reps = np.empty((n_cells, n_boot))
    for c in range(n_cells):
        probes = pd.DataFrame(
            {
                "probe": name,
                "status": "ok",
                "task": tasks,
                "example_ids": [ids] * n_tasks,
                "oof_bits": list(bits[c]),
                "strategy_entropy": 1.0,
            }
        )
        reps[c] = information_replicates(probes, by_task, counts, n_boot, name)
    return bits.mean(axis=2).mean(axis=1), reps
