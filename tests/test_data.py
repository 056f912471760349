"""Data stage: splits, determinism, tokenizer round trip, config errors, encode/collate."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch

from latentstrat import batching, encoding
from latentstrat.base import data as D
from latentstrat.base.data_card import data_card
from latentstrat.config import ConfigError, load_config
from latentstrat.tasks import TASKS

BASE_CFG = {"collection": "t", "base": "t", "grid": {"beta": [0.1]}}


def test_render_record_forms():
    assert encoding.render_record("sort 2 1", "1 2 ; answer 1 2", with_z=True, z_slots=2) == (
        "<bos> <x> sort 2 1 </x> <z> [Z] [Z] </z> <y> 1 2 ; answer 1 2 </y> <eos>"
    )
    assert encoding.render_record("a", "b", with_z=False) == "<bos> <x> a </x> <y> b </y> <eos>"
    assert encoding.render_record("a", "b", with_z=False, eos=False) == "<bos> <x> a </x> <y> b </y>"


def test_splits_columns_sizes_and_disjoint_inputs(data_dir, small_data_cfg):
    splits = {s: encoding.load_split(data_dir, s) for s in encoding.SPLITS}
    for s, df in splits.items():
        assert list(df.columns) == list(encoding.COLUMNS)
        assert (df.split == s).all()
        n = small_data_cfg[f"{s}_per_task"]
        assert df.groupby("task").size().to_dict() == {t: n for t in small_data_cfg["tasks"]}
        assert df.example_id.is_unique
        assert (df.n_supervised == df.n_y_tokens + 2).all()
        assert (df.n_y_tokens == df.y.str.split().str.len()).all()
        assert all(isinstance(m, list) and r.strategy in m for m, r in zip(df.matching_strategies, df.itertuples()))
        assert (df.ambiguous == (df.matching_strategies.str.len() > 1)).all()
        for r in df.itertuples():
            assert TASKS[r.task].final_answer_correct(r.x, r.y) and r.answer == TASKS[r.task].answer(r.x)
    for t in small_data_cfg["tasks"]:
        xs = [set(df.x[df.task == t]) for df in splits.values()]
        assert not (xs[0] & xs[1]) and not (xs[0] & xs[2]) and not (xs[1] & xs[2])
        assert sum(map(len, xs)) == sum(small_data_cfg[f"{s}_per_task"] for s in encoding.SPLITS), (
            "x unique within splits"
        )


def test_strategy_labels_are_roughly_uniform():
    df = D.generate_task("sorting_algorithms", {"train": 900, "validation": 1, "test": 1}, seed=3)
    counts = df[df.split == "train"].strategy.value_counts()
    assert set(counts.index) == set(TASKS["sorting_algorithms"].strategies)
    assert counts.min() > 250  # 300 expected each; 250 is > 5 sd below


def test_same_config_gives_byte_identical_files(tmp_path, small_data_cfg):
    cfg = dict(small_data_cfg, train_per_task=10, validation_per_task=3, test_per_task=3)
    D.build_dataset(cfg, tmp_path / "a")
    D.build_dataset(cfg, tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {
        "train.parquet",
        "validation.parquet",
        "test.parquet",
        "tokenizer.json",
        "data_card.md",
        "data_card.parquet",
    } <= set(names)
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n
    D.build_dataset(dict(cfg, seed=cfg["seed"] + 1), tmp_path / "c")  # negative control
    assert (tmp_path / "a" / "train.parquet").read_bytes() != (tmp_path / "c" / "train.parquet").read_bytes()


def test_tokenizer_round_trips_every_record(data_dir):
    tok = encoding.load_tokenizer(data_dir)
    assert len(tok) < 200
    vocab = tok.get_vocab()
    assert [vocab[t] for t in encoding.SPECIAL_TOKENS] == list(range(len(encoding.SPECIAL_TOKENS)))
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (vocab["<pad>"], vocab["<bos>"], vocab["<eos>"])
    unk = vocab["<unk>"]
    for s in encoding.SPLITS:
        df = encoding.load_split(data_dir, s)
        for x, y in zip(df.x, df.y):
            for text in (
                encoding.render_record(x, y, True, 2),
                encoding.render_record(x, y, False),
                encoding.render_record(x, y, False, eos=False),
            ):
                ids = encoding.text_ids(tok, [text])[0]
                assert unk not in ids and len(ids) == len(text.split())
                assert tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text
    # unknown words map to <unk> (negative control)
    assert encoding.text_ids(tok, ["answer zebra"])[0][1] == unk


def test_data_card(data_dir, small_data_cfg):
    card = pd.read_parquet(data_dir / "data_card.parquet")
    assert sorted(card.task) == sorted(small_data_cfg["tasks"])
    df = pd.concat([encoding.load_split(data_dir, s) for s in encoding.SPLITS])
    for r in card.itertuples():
        g = df[df.task == r.task]
        assert r.n_train == small_data_cfg["train_per_task"]
        assert r.y_tokens_mean == pytest.approx(g.n_y_tokens.mean())
        assert r.ambiguity_rate == pytest.approx(g.ambiguous.mean())
        assert r.y_tokens_max == g.n_y_tokens.max()
    md = (data_dir / "data_card.md").read_text()
    assert all(t in md for t in small_data_cfg["tasks"]) and "ambiguity rate" in md


def test_trace_lengths_differ_across_tasks():
    df = D.generate(
        {"seed": 5, "tasks": sorted(TASKS), "train_per_task": 300, "validation_per_task": 1, "test_per_task": 1}
    )
    means = df.groupby("task").n_y_tokens.mean()
    assert means.max() >= 3 * means.min()
    assert means.min() >= 7 and means.max() <= 60
    rec = df.x.str.split().str.len() + df.n_y_tokens + 10
    assert rec.max() <= 100


@pytest.mark.parametrize(
    "data,key",
    [
        ({"tasks": ["sorting_algorithms", "juggling"]}, "data.tasks[1]"),
        ({"train_per_task": 0}, "data.train_per_task"),
        ({"validation_per_task": -3}, "data.validation_per_task"),
        ({"test_per_task": 2.5}, "data.test_per_task"),
        ({"tasks": []}, "data.tasks"),
        ({"sizes": 3}, "data.sizes"),
    ],
)
def test_bad_data_config_names_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_config(cfg={**BASE_CFG, "data": data})


def test_generate_rejects_bad_sections_directly(monkeypatch):
    good = {"seed": 1, "tasks": ["grid_pathfinding"], "train_per_task": 2, "validation_per_task": 1, "test_per_task": 1}
    with pytest.raises(ValueError, match="data.tasks"):
        D.generate({**good, "tasks": ["nope"]})
    with pytest.raises(ValueError, match="data.test_per_task"):
        D.generate({**good, "test_per_task": 0})
    monkeypatch.setattr(D, "MAX_DRAWS_PER_EXAMPLE", 5)  # give up sooner
    with pytest.raises(ValueError, match="distinct inputs"):  # the 9x9 grid has 6480 inputs
        D.generate({**good, "train_per_task": 7000})


def test_cli_writes_data_and_base_config(tmp_path):
    import json

    import yaml

    cfg = {
        **BASE_CFG,
        "results_dir": str(tmp_path / "results"),
        "data": {
            "seed": 2,
            "tasks": ["grid_pathfinding", "sorting_algorithms"],
            "train_per_task": 5,
            "validation_per_task": 2,
            "test_per_task": 2,
        },
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    D.main(["--configfile", str(path)])
    out = tmp_path / "results" / "base" / "t" / "data"
    assert len(encoding.load_split(out, "test")) == 4
    base = json.loads((out / "base_config.json").read_text())
    assert base["data"]["tasks"] == ["grid_pathfinding", "sorting_algorithms"] and "backbone" in base
    with pytest.raises(SystemExit, match=r"data\.train_per_task"):
        path.write_text(yaml.safe_dump({**cfg, "data": {**cfg["data"], "train_per_task": 0}}))
        D.main(["--configfile", str(path)])


# ----------------------------------------------------------------------------- encode / collate


@pytest.fixture(scope="module")
def encoded(data_dir):
    df = encoding.load_split(data_dir, "train")
    return df, encoding.load_tokenizer(data_dir), encoding.encode(df, encoding.load_tokenizer(data_dir), z_slots=2)


def test_collate_fields(encoded):
    df, tok, enc = encoded
    v = tok.get_vocab()
    idx = [0, 5, 40, len(df) - 1]
    b = batching.collate(enc, idx)
    B, P = len(idx), 2
    L = int(df.n_supervised.iloc[idx].max())
    assert b.gen_ids.shape == b.gen_mask.shape and b.gen_ids.shape[0] == B
    assert b.z_slot_pos.shape == (B, P) and b.z_open_pos.shape == (B,)
    assert b.sup_ids.shape == b.sup_mask.shape == b.gen_sup_pos.shape == (B, L)
    assert b.sup_mask.sum(1).tolist() == df.n_supervised.iloc[idx].tolist()
    m = b.sup_mask.bool()
    assert torch.equal(b.gen_ids.gather(1, b.gen_sup_pos + 1)[m], b.sup_ids[m])
    assert (b.gen_ids.gather(1, b.z_open_pos[:, None]) == v["<z>"]).all()
    assert (b.gen_ids.gather(1, b.z_slot_pos) == v["[Z]"]).all()
    assert ((b.gen_ids == v["[Z]"]).sum(1) == P).all()
    assert (b.gen_ids.gather(1, b.gen_sup_pos[:, :1]) == v["<y>"]).all()  # <y> predicts the first y token
    last = b.post_mask.sum(1) - 1  # posterior pooling position holds </y>
    assert (b.post_ids.gather(1, last[:, None]) == v["</y>"]).all()
    assert b.gen_mask.sum(1).tolist() == [len(enc.gen_ids[i]) for i in idx]
    assert b.post_mask.sum(1).tolist() == [len(enc.gen_ids[i]) - P - 3 for i in idx]  # no <z> [Z]*P </z>, no <eos>
    assert (b.gen_ids[b.gen_mask == 0] == v["<pad>"]).all()
    tasks = sorted(df.task.unique())
    assert [tasks[i] for i in b.task_idx.tolist()] == df.task.iloc[idx].tolist()
    assert b.row_idx.tolist() == idx and b.b is None
    # hand check of one record: text at the sup positions + 1 is the y text + </y> <eos>
    i = idx[1]
    words = tok.convert_ids_to_tokens(b.sup_ids[1][: int(df.n_supervised.iloc[i])].tolist())
    assert " ".join(words) == df.y.iloc[i] + " </y> <eos>"


def test_collate_reference_b_alignment(encoded):
    df, _, enc = encoded
    b_all = [np.arange(n, dtype=float) for n in df.n_supervised]
    b = batching.collate(enc, [2, 3], b=b_all)
    assert b.b.shape == b.sup_ids.shape and b.b.dtype == torch.float32
    n2 = int(df.n_supervised.iloc[2])
    assert b.b[0, :n2].tolist() == list(range(n2)) and (b.b[0, n2:] == 0).all()
    bad = list(b_all)
    bad[3] = bad[3][:-1]
    with pytest.raises(ValueError, match="row 3"):
        batching.collate(enc, [2, 3], b=bad)


def test_length_grouped_batches(encoded):
    _, _, enc = encoded
    lengths = enc.lengths
    batches = list(batching.length_grouped_batches(lengths, 16, np.random.default_rng(0)))
    flat = sorted(i for bt in batches for i in bt)
    assert flat == list(range(len(lengths)))
    assert all(len(bt) <= 16 for bt in batches)
    spread = np.mean([max(lengths[i] for i in bt) - min(lengths[i] for i in bt) for bt in batches])
    rnd = random.Random(1)
    shuffled = list(range(len(lengths)))
    rnd.shuffle(shuffled)
    rand_spread = np.mean(
        [
            max(lengths[i] for i in shuffled[k : k + 16]) - min(lengths[i] for i in shuffled[k : k + 16])
            for k in range(0, len(shuffled), 16)
        ]
    )
    assert spread < rand_spread / 2  # grouping by length cuts padding (control: random batches)
    again = list(batching.length_grouped_batches(lengths, 16, np.random.default_rng(0)))
    assert again == batches
    assert list(batching.length_grouped_batches(lengths, 16, random.Random(0)))  # random.Random works too
    assert list(batching.length_grouped_batches(lengths, 16, 0)) == list(
        batching.length_grouped_batches(lengths, 16, 0)
    )
    with pytest.raises(ValueError, match="batch_size"):
        list(batching.length_grouped_batches(lengths, 0, 0))


def test_length_batches_are_the_stable_length_order_in_chunks():
    lengths = [5, 3, 5, 1, 3, 9, 5]
    # stable: equal lengths keep their row order; the last batch holds the rest
    assert list(batching.length_batches(lengths, 3)) == [[3, 1, 4], [0, 2, 6], [5]]
    assert [i for b in batching.length_batches(lengths, 1) for i in b] == [3, 1, 4, 0, 2, 6, 5]
    assert list(batching.length_batches([], 4)) == []
    with pytest.raises(ValueError, match="batch_size"):
        list(batching.length_batches(lengths, 0))


def test_strategy_free_lengths_by_hand():
    x = "convert 1 0 1 1 0 1 1 to base 8"  # 11 words
    # group_from_right `0 1 1 = 3 ; 0 1 1 = 3 ; 1 = 1 ; answer 1 3 3`: 20 words;
    # pad_left `= 0 0 1 0 1 1 0 1 1 ; 0 0 1 = 1 ; 0 1 1 = 3 ; 0 1 1 = 3 ; answer 1 3 3`: 33 words
    t = TASKS["base_conversion"]
    assert [len(t.render(x, s).split()) for s in t.strategies] == [20, 33]
    df = pd.DataFrame({"task": ["base_conversion"] * 2, "x": [x, x]})
    assert encoding.strategy_free_lengths(df) == [11 + 26.5, 11 + 26.5]  # either strategy: the same length


def test_batches_grouped_by_strategy_free_length_mix_the_strategies():
    # base conversion's pad_left traces are 14 tokens longer on average than group_from_right's: grouped by
    # a row's own length, a batch holds one strategy and the strategy-choice gradient flips from
    # batch to batch (the entangled model's prior ended 73/27 that way)
    df = D.generate_task("base_conversion", {"train": 1024, "validation": 1, "test": 1}, seed=3)
    df = df[df.split == "train"].reset_index(drop=True)
    enc = encoding.encode(df, encoding.record_tokenizer(D.build_tokenizer(list(df.x) + list(df.y))))

    def majority_share(lengths):
        batches = list(batching.length_grouped_batches(lengths, 32, np.random.default_rng(0)))
        assert sorted(i for b in batches for i in b) == list(range(len(df)))
        return np.mean([df.strategy[b].value_counts().iloc[0] / len(b) for b in batches])

    assert majority_share(enc.lengths) > 0.9  # control: own lengths sort the strategies apart
    # strategy-free: each batch holds the data's ~50/50 draws (binomial majority of 32: ~0.57)
    assert majority_share(encoding.strategy_free_lengths(df)) < 0.65


def test_ambiguous_examples_are_kept_and_flagged():
    df = D.generate_task("grid_pathfinding", {"train": 600, "validation": 1, "test": 1}, seed=4)
    straight = df.x.map(lambda x: x.split()[1] == x.split()[4] or x.split()[2] == x.split()[5])
    assert straight.sum() >= 3 and (df.ambiguous == straight).all()
    assert all(m == ["horizontal_first", "vertical_first"] for m in df.matching_strategies[df.ambiguous])
    assert all(len(m) == 1 for m in df.matching_strategies[~df.ambiguous])
    card = data_card(df, encoding.SPLITS)
    assert card.n_ambiguous.iloc[0] == straight.sum()
    assert card.ambiguity_rate.iloc[0] == pytest.approx(straight.mean())


def test_task_mixed_batches_follow_the_mixture_and_length_batches_do_not():
    """Shares 0.5 / 0.3 / 0.2, batch 20: every batch holds 10 / 6 / 4 rows give or take 2, and
    every row comes once per epoch. Control: batches grouped by length (tasks of different
    lengths) are nearly single-task, the failure the mixed sampler fixes."""
    task_idx = [0] * 500 + [1] * 300 + [2] * 200
    lengths = [40] * 500 + [10] * 300 + [25] * 200
    rng = np.random.default_rng(0)
    batches = batching.task_mixed_batches(task_idx, 20, rng)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    for b in batches:
        counts = np.bincount([task_idx[i] for i in b], minlength=3)
        assert np.abs(counts - np.array([10, 6, 4])).max() <= 2, counts
    grouped = list(batching.length_grouped_batches(lengths, 20, np.random.default_rng(0)))
    pure = [b for b in grouped if len({task_idx[i] for i in b}) == 1]
    assert len(pure) / len(grouped) > 0.9
    # a different epoch seed gives a different order, the same mixture
    other = batching.task_mixed_batches(task_idx, 20, np.random.default_rng(1))
    assert other != batches
