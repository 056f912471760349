"""Shared pytest fixtures: a small dataset over every task, built once per session."""

from __future__ import annotations

import pytest
import torch

from latentstrat.tasks import TASKS

torch.set_num_threads(1)

SMALL_DATA_CFG = {
    "seed": 11,
    "tasks": sorted(TASKS),
    "train_per_task": 24,
    "validation_per_task": 8,
    "test_per_task": 8,
}


@pytest.fixture(scope="session")
def small_data_cfg() -> dict:
    """A data config section with every task and a few examples per split."""
    return dict(SMALL_DATA_CFG)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, small_data_cfg):
    """A built data stage folder (splits, tokenizer.json, data card) for `small_data_cfg`."""
    from latentstrat.base.data import build_dataset

    out = tmp_path_factory.mktemp("data")
    build_dataset(small_data_cfg, out)
    return out


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> dict:
    """data/, entangle/model (a random tiny Qwen2) and reference/ of base_helpers.TINY, built once
    per pytest run: {data_dir, entangle_dir, reference_dir}."""
    from base_helpers import TINY, make_base
    from latentstrat.config import load_config

    return make_base(tmp_path_factory.mktemp("tiny_base"), load_config(cfg=TINY))
