"""The tiny base shared by the cell-stage tests (built once per pytest run by the `tiny_base`
fixture in conftest.py): two tasks, a random tiny Qwen2 saved as the entangled model, and the
reference stage run on it."""

from pathlib import Path

import torch

from latentstrat import encoding
from latentstrat.base import data
from latentstrat.base.reference import run_reference
from latentstrat.config import Base
from latentstrat.modeling.backbone import build_backbone, write_model_extras
from latentstrat.paths import BaseFolders

TINY = {
    "collection": "t",
    "base": "t",
    "data": {
        "seed": 3,
        "tasks": ["sorting_algorithms", "multidigit_addition"],
        "train_per_task": 24,
        "validation_per_task": 8,
        "test_per_task": 10,
    },
    "backbone": {
        "embedded": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        }
    },
    "cell": {"latent_dim": 4, "token_aggregation": "sum", "reconstruction_family": "tokcc_a0.25"},
    "lora": {"r": 4},
    "train": {
        "steps": 6,
        "batch_size": 8,
        "eval_every": 3,
        "checkpoint_every": 2,
        "val_probe_per_task": 8,
        "val_decode_per_task": 1,
    },
    "evaluate": {"max_new_tokens": 8},
    "probes": {"folds": 2},
    "resources": {"threads": 1},
    "grid": {"beta": [0.1]},
}


def make_base(root: Path, cfg: dict) -> dict:
    """data/ + entangle/model (a tiny random Qwen2) + reference/tokens.parquet (b from it)."""
    dd, ed, rd = root / "data", root / "entangle", root / "reference"
    data.build_dataset(cfg["data"], dd)
    tok = encoding.load_tokenizer(dd)
    torch.manual_seed(0)
    build_backbone(cfg["backbone"], tok).save_pretrained(ed / "model")
    write_model_extras(ed / "model", tok, Base.of(cfg))  # as the entangle stage does: tokenizer and card
    run_reference(cfg, dd, ed, rd, threads=1, log=lambda *_: None)
    return {"data_dir": dd, "entangle_dir": ed, "reference_dir": rd}


def base_folders(base: dict) -> BaseFolders:
    """The folders of a tiny base (the `tiny_base` fixture's dict) as a model job reads them."""
    return BaseFolders(base["data_dir"], base["entangle_dir"], base.get("reference_dir"))


def tiny_cfg(**train):
    """The TINY config with `train` settings overridden, validated, and its first cell."""
    import json

    from latentstrat.cells import expand_cells
    from latentstrat.config import load_config

    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update(train)
    cfg = load_config(cfg=cfg)
    return cfg, expand_cells(cfg)[0].to_json()
