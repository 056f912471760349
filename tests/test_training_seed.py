"""Each cell's training seed (cells.training_seed): drawn from its replicate seed and every setting
but token_aggregation, so cells of different settings are independent while the two cells of a
pair (differing in token aggregation alone) share their luck: the same model at step 0, the same
batches, the same z noise. The step-0 validation is keyed by it (cells.init_id)."""

import json
from pathlib import Path

import pytest
import torch

from base_helpers import TINY
from latentstrat import cells as K
from latentstrat import encoding
from latentstrat.config import load_config
from latentstrat.modeling.model import build_model

ROOT = Path(__file__).resolve().parents[1]


def default_cells():
    return K.expand_cells(load_config(ROOT / "config" / "config.yaml"))


def pairs(cells):
    """(primary cell, comparison cell) with the same settings but token_aggregation."""
    key = lambda c: tuple(K.format_value(c.settings[k]) for k in K.CELL_KEYS if k != "token_aggregation")  # noqa: E731
    prim = {key(c): c for c in cells if c.role == "primary"}
    return [(prim[key(c)], c) for c in cells if c.role == "comparison" and key(c) in prim]


def test_both_cells_of_a_pair_share_a_training_seed_and_every_setting_has_its_own():
    cells = default_cells()
    pp = pairs(cells)
    assert len(pp) == 37  # every cell of the matched and the sum_scaled arm has its pair in the sum arm
    for a, b in pp:
        assert a.settings["token_aggregation"] != b.settings["token_aggregation"]
        assert K.training_seed(a.settings) == K.training_seed(b.settings)
        assert K.init_id(a.settings) == K.init_id(b.settings)
    # 66 cells, 29 settings-and-replicate-seeds: 29 training seeds, none shared across them (a raw
    # setting's sum_scaled cell shares its pair's)
    assert len({K.training_seed(c.settings) for c in cells}) == 29
    assert len({K.init_id(c.settings) for c in cells}) == 29
    # non-negative 31-bit ints (torch / numpy seeds)
    assert all(0 <= K.training_seed(c.settings) < 2**31 for c in cells)


@pytest.mark.parametrize(
    "change",
    [
        {"reconstruction_family": "dist_norm"},
        {"beta": 0.1},
        {"beta_schedule": "lin100"},
        {"seed": 314160},
        {"latent_dim": 32},
        {"adaptation": "full"},
    ],
)
def test_cells_that_differ_in_anything_but_token_aggregation_get_other_training_seeds(change):
    cell = next(c for c in default_cells() if c.cell_id == "agg-sum_fam-raw_beta-0.01_sched-lin300_seed-314159")
    other = {**cell.settings, **change}
    assert K.training_seed(other) != K.training_seed(cell.settings)
    assert K.init_id(other) != K.init_id(cell.settings)
    # token aggregation alone never changes it
    assert K.training_seed({**other, "token_aggregation": "mean"}) == K.training_seed(other)


def test_training_seed_is_canonical_and_pinned():
    """Deterministic across processes and versions (a changed derivation would silently retrain
    every cell with other luck): pinned for the default collection's first cell; `1` and `1.0`
    are one beta; the replicate seed names the cell, the training seed does not."""
    cell = next(c for c in default_cells() if c.cell_id == "agg-sum_fam-raw_beta-0.01_sched-lin300_seed-314159")
    assert K.training_seed(cell.settings) == 458033943
    s = {**cell.settings, "beta": 1}
    assert K.training_seed(s) == K.training_seed({**s, "beta": 1.0})
    assert K.cell_id(cell.settings).endswith("_seed-314159")
    assert K.init_id(cell.settings) == "init-entangled_adapt-lora_zdim-64_slots-1_tseed-458033943"
    assert K.init_settings(cell.settings) == {
        "init": "entangled",
        "adaptation": "lora",
        "latent_dim": 64,
        "z_slots": 1,
        "training_seed": 458033943,
    }
    # a step-0 init names its training seed; a cell dict may carry it (the train job's params)
    assert K.cell_training_seed(K.init_settings(cell.settings)) == 458033943
    assert K.cell_training_seed({**cell.settings, "training_seed": 458033943}) == 458033943
    with pytest.raises(KeyError, match="beta_schedule"):
        K.training_seed({k: v for k, v in cell.settings.items() if k != "beta_schedule"})


def test_step0_keying_default_and_smoke_collections():
    """One step-0 validation per pair: the default collection's 66 cells start from 29 models, the
    smoke collection's 24 from 12, the quick collection's 2 from 1."""
    for name, n_cells, n_inits in (("config", 66, 29), ("smoke", 24, 12), ("quick", 2, 1), ("aa", 42, 42)):
        cells = K.expand_cells(load_config(ROOT / "config" / f"{name}.yaml"))
        assert (len(cells), len({K.init_id(c.settings) for c in cells})) == (n_cells, n_inits), name


def test_a_pair_starts_from_bit_identical_heads_and_two_settings_from_different_ones(tiny_base):
    """Build the models: the two arms of a pair (sum / mean) start from the same weights, bit for
    bit (heads and adapters); another beta or another replicate seed starts from other heads."""
    cfg = json.loads(json.dumps(TINY))
    cfg["grid"] = {"beta": [0.01, 0.1]}
    cfg["comparison_arms"] = [{"name": "matched_mean", "settings": {"token_aggregation": "mean"}}]
    cfg["replicates"] = {"extra_seeds": 1, "grid": {"beta": [0.01]}}
    cfg = load_config(cfg=cfg)
    cells = {c.cell_id: c.settings for c in K.expand_cells(cfg)}
    tok = encoding.load_tokenizer(tiny_base["data_dir"])

    def built(cid):
        torch.manual_seed(12345)  # the global RNG state before the build must not matter
        model = build_model(cfg["backbone"], cfg["lora"], cells[cid], tok, tiny_base["entangle_dir"])
        return model.heads_state_dict(), model.trainable_state_dict()

    seed = cells["agg-sum_fam-tokcc_a0.25_beta-0.01_zdim-4_seed-314159"]["seed"]
    heads, trainable = built("agg-sum_fam-tokcc_a0.25_beta-0.01_zdim-4_seed-314159")
    pair_heads, pair_trainable = built("agg-mean_fam-tokcc_a0.25_beta-0.01_zdim-4_seed-314159")
    assert heads and set(heads) == set(pair_heads) and set(trainable) == set(pair_trainable)
    assert all(torch.equal(heads[k], pair_heads[k]) for k in heads)
    assert all(torch.equal(trainable[k], pair_trainable[k]) for k in trainable)
    # the control: another beta, another replicate seed (the same init settings otherwise)
    random = [k for k in heads if heads[k].abs().sum() > 0]  # zero-initialized heads are alike anyway
    assert random
    for other in (
        "agg-sum_fam-tokcc_a0.25_beta-0.1_zdim-4_seed-314159",
        f"agg-sum_fam-tokcc_a0.25_beta-0.01_zdim-4_seed-{seed + 1}",
    ):
        other_heads, _ = built(other)
        assert set(other_heads) == set(heads)
        assert not any(torch.equal(heads[k], other_heads[k]) for k in random), other
