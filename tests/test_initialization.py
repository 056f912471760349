"""The initialization invariant (docs/design.md, "Initialization"): at step 0 a cell computes
the entangled model's p(y|x) exactly, on real records of a really trained entangled model,
for every adaptation and reconstruction family; and the controls that would have caught the
bug where it did not (untrained slot tokens, a random z projection)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from latentstrat import batching, encoding
from latentstrat.base import data
from latentstrat.base.entangle import run_entangle
from latentstrat.base.reference import load_b, load_scales, run_reference
from latentstrat.cell.train import train_cell
from latentstrat.cells import expand_cells
from latentstrat.config import load_config
from latentstrat.modeling import objective as obj
from latentstrat.modeling.model import build_model
from latentstrat.modeling.objective import Objective, forward_losses
from latentstrat.paths import BaseFolders

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["raw", "dist_norm", "tokcc_a0.25", "dist_tokcc_0.05_0.95"]


def cfg_for(**cell):
    over = {
        "data": {
            "tasks": ["sorting_algorithms", "multidigit_addition"],
            "train_per_task": 24,
            "validation_per_task": 8,
            "test_per_task": 4,
        },
        "entangle": {"steps": 40, "batch_size": 16, "warmup_steps": 2, "quality_samples_per_task": 2},
        "train": {"steps": 1, "batch_size": 8, "eval_every": 1, "val_probe_per_task": 4, "val_decode_per_task": 1},
        "cell": {"latent_dim": 4, **cell},
        "grid": {"reconstruction_family": FAMILIES, "beta": [0.1]},
        "comparison_arms": [],
    }
    return load_config(ROOT / "config" / "smoke.yaml", overrides=over)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A really trained (40-step) entangled model on real task records, and its reference."""
    root = tmp_path_factory.mktemp("init-base")
    cfg = cfg_for()
    data.build_dataset(cfg["data"], root / "data")
    run_entangle(cfg, root / "data", root / "entangle", threads=1, log=lambda m: None)
    run_reference(cfg, root / "data", root / "entangle", root / "reference", threads=1, log=lambda m: None)
    return root


def step0_token_nll(cfg, cell, root, model=None):
    """Per supervised token NLL of the cell's generator at step 0 on the validation split
    (z ~ posterior), and the reference b for the same tokens, as [B, L] with a mask."""
    tok = encoding.load_tokenizer(root / "data")
    val = encoding.load_split(root / "data", "validation")
    model = model or build_model(cfg["backbone"], cfg["lora"], cell, tok, root / "entangle")
    model.eval()
    enc = encoding.encode(val, tok, int(cell["z_slots"]))
    batch = batching.collate(enc, range(len(val)), load_b(root / "reference", val))
    torch.manual_seed(0)
    with torch.no_grad():
        mu_q, logvar_q = model.posterior(batch.post_ids, batch.post_mask)
        z = mu_q + torch.randn_like(mu_q) * (0.5 * logvar_q).exp() * 3.0  # any z: it must not matter yet
        logits, _, _ = model.generator(
            batch.gen_ids, batch.gen_mask, z, batch.z_open_pos, batch.z_slot_pos, sup_pos=batch.gen_sup_pos
        )
        l = obj.token_nll(logits, batch.sup_ids)
    return l, batch.b, batch.sup_mask.bool(), batch


@pytest.mark.parametrize("adaptation", ["lora", "full", "frozen"])
def test_step0_generator_is_the_entangled_model_on_real_records(base, adaptation):
    cfg = cfg_for(adaptation=adaptation)
    cell = expand_cells(cfg)[0].to_json()
    l, b, m, _ = step0_token_nll(cfg, cell, base)
    assert float(b[m].mean()) < 2.5, "the entangled model should have learned something in 40 steps"
    assert torch.allclose(l[m], b[m], atol=2e-5, rtol=1e-5), float((l[m] - b[m]).abs().max())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("aggregation", ["mean", "sum", "sum_scaled"])
def test_step0_base_relative_losses_are_one_for_every_family(base, family, aggregation):
    cfg = cfg_for(token_aggregation=aggregation)
    cell = next(c.to_json() for c in expand_cells(cfg) if c.settings["reconstruction_family"] == family)
    _, _, _, batch = step0_token_nll(cfg, cell, base)
    objective = Objective.for_cell(cell, load_scales(base / "reference"))
    model = build_model(
        cfg["backbone"], cfg["lora"], cell, encoding.load_tokenizer(base / "data"), base / "entangle"
    ).eval()
    with torch.no_grad():
        out = forward_losses(model, batch, objective, 0, torch.randn(len(batch), 4))
    # S_ref and T_ref are the entangled model's values on exactly these (validation) rows
    assert out["dist_norm"].mean().item() == pytest.approx(1.0, abs=1e-5)
    assert out["tokcc"].mean().item() == pytest.approx(1.0, abs=1e-5)
    if family == "dist_tokcc_0.05_0.95":
        assert out["active"].mean().item() == pytest.approx(1.0, abs=1e-5)


def test_step0_history_row_is_one_and_matches_entangled_accuracy(base, tmp_path):
    """Through the trainer: history step 0 has base-relative reconstruction 1 (whole validation
    split), and a 1-step run of every family still sits near 1."""
    cfg = cfg_for()
    for c in expand_cells(cfg):
        cell = c.to_json()
        train_cell(
            cfg,
            cell,
            BaseFolders(base / "data", base / "entangle", base / "reference"),
            tmp_path / c.cell_id,
            threads=1,
        )
        h = pd.read_parquet(tmp_path / c.cell_id / "history.parquet")
        a = h[h.task == "all"].pivot(index="step", columns="metric", values="value")
        assert a.loc[0, "base_relative_reconstruction"] == pytest.approx(1.0, abs=1e-5), c.cell_id
        assert a.loc[0, "tokcc_reconstruction_loss"] == pytest.approx(1.0, abs=1e-5), c.cell_id


def test_controls_a_random_z_projection_or_untrained_slot_tokens_break_the_invariant(base):
    """Negative controls: the two ways the invariant was broken before."""
    cfg = cfg_for()
    cell = expand_cells(cfg)[0].to_json()
    tok = encoding.load_tokenizer(base / "data")
    # 1. a randomly initialized z projection: z leaks into the generator at step 0
    model = build_model(cfg["backbone"], cfg["lora"], cell, tok, base / "entangle")
    torch.nn.init.normal_(model.z_proj.weight, std=0.02)
    l, b, m, _ = step0_token_nll(cfg, cell, base, model)
    assert (l[m] - b[m]).abs().max() > 1e-3
    # 2. slot tokens the entangled model never saw (their embeddings at random init, drawn from a
    # generator of their own: over draws the mean NLL rises by 3.5-5%, single tokens' by ~1 nat)
    model = build_model(cfg["backbone"], cfg["lora"], cell, tok, base / "entangle")
    emb = model.lm.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for t in (encoding.Z_OPEN, encoding.Z_SLOT, encoding.Z_CLOSE):
            emb[tok.convert_tokens_to_ids(t)] = torch.randn(emb.shape[1], generator=gen) * 0.02
    l, b, m, _ = step0_token_nll(cfg, cell, base, model)
    assert float(l[m].mean()) > float(b[m].mean()) * 1.02
    np.testing.assert_array_less(0.1, float((l[m] - b[m]).abs().max()))
