"""Reference stage: b against a hand-computed per-token NLL, scales against closed forms,
token counts, helpers for the trainer, and input errors that name the path."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from latentstrat import batching, encoding
from latentstrat.base import data
from latentstrat.base.reference import (
    TOKENS_COLUMNS,
    compute_scales,
    load_b,
    load_scales,
    run_reference,
    token_counts,
)
from latentstrat.cells import config_alphas
from latentstrat.config import load_config
from latentstrat.modeling.objective import select_scales

ROOT = Path(__file__).resolve().parents[1]


def smoke_cfg(**over):
    base = {"data": {"train_per_task": 5, "validation_per_task": 3, "test_per_task": 2}}
    base.update(over)
    return load_config(ROOT / "config" / "smoke.yaml", overrides=base)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny dataset, a random-init entangled model saved with save_pretrained, and the
    reference stage run on them."""
    from latentstrat.modeling.backbone import build_backbone

    root = tmp_path_factory.mktemp("ref")
    cfg = smoke_cfg()
    data.build_dataset(cfg["data"], root / "data")
    torch.manual_seed(0)
    model = build_backbone(cfg["backbone"], encoding.load_tokenizer(root / "data"))
    model.save_pretrained(root / "entangle" / "model")
    scales = run_reference(cfg, root / "data", root / "entangle", root / "reference", threads=1, log=lambda m: None)
    return root, cfg, scales


def test_b_equals_hand_computed_token_nll(dirs):
    from latentstrat.modeling.backbone import load_entangled

    root, cfg, _ = dirs
    tokens = pd.read_parquet(root / "reference" / "tokens.parquet")
    assert list(tokens.columns) == TOKENS_COLUMNS
    tok = encoding.load_tokenizer(root / "data")
    model = load_entangled(root / "entangle").eval()
    for split in encoding.SPLITS:
        df = encoding.load_split(root / "data", split)
        ex = df.iloc[-1]  # one example per split, by hand: full record (neutral slot), full softmax
        ids = encoding.text_ids(tok, [encoding.render_record(ex.x, ex.y, with_z=True)])[0]
        y_open = ids.index(tok.convert_tokens_to_ids("<y>"))
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
        want = [-logp[t - 1, ids[t]].item() for t in range(y_open + 1, len(ids))]  # y, </y>, <eos>
        row = tokens[(tokens.split == split) & (tokens.example_id == ex.example_id)].iloc[0]
        assert row.n_supervised == ex.n_supervised == len(want)
        np.testing.assert_allclose(np.asarray(row.b), want, rtol=1e-4, atol=1e-5)
    assert len(tokens) == sum(len(encoding.load_split(root / "data", s)) for s in encoding.SPLITS)
    assert all(len(b) == n for b, n in zip(tokens.b, tokens.n_supervised))


def test_scales_json_matches_tokens(dirs):
    root, cfg, scales = dirs
    saved = json.loads((root / "reference" / "scales.json").read_text())
    tokens = pd.read_parquet(root / "reference" / "tokens.parquet")
    val = tokens[tokens.split == "validation"]
    assert saved["n_bar"] == pytest.approx(tokens[tokens.split == "train"].n_supervised.mean())
    assert saved["S_ref"]["mean"] == pytest.approx(np.mean([np.mean(b) for b in val.b]), rel=1e-6)
    assert saved["S_ref"]["sum"] == pytest.approx(np.mean([np.sum(b) for b in val.b]), rel=1e-6)
    assert set(saved["T_ref"]) == {"0.25"} and set(saved["S_ref"]) == {"mean", "sum", "sum_scaled"}
    s = select_scales(load_scales(root / "reference"), "sum", 0.25)
    assert s == {"S_ref": saved["S_ref"]["sum"], "T_ref": saved["T_ref"]["0.25"]["sum"], "n_bar": saved["n_bar"]}
    with pytest.raises(ValueError, match="a=0.5"):
        select_scales(saved, "mean", 0.5)
    with pytest.raises(FileNotFoundError, match="scales.json"):
        load_scales(root / "nowhere")


def _const_tokens(c, n_train, n_val):
    rows = [
        dict(task="t", example_id=f"tr{i}", split="train", n_supervised=n, b=[c] * n) for i, n in enumerate(n_train)
    ]
    rows += [
        dict(task="t", example_id=f"va{i}", split="validation", n_supervised=n, b=[c] * n) for i, n in enumerate(n_val)
    ]
    return pd.DataFrame(rows)


def test_constant_b_scales_closed_form():
    c, n_train, n_val = 0.7, [4, 6, 8], [3, 5, 10]
    s = compute_scales(_const_tokens(c, n_train, n_val), [0.25, 0.5])
    n_val_mean = np.mean(n_val)
    assert s["n_bar"] == pytest.approx(6.0)
    assert s["S_ref"]["mean"] == pytest.approx(c)
    assert s["S_ref"]["sum"] / s["S_ref"]["mean"] == pytest.approx(n_val_mean)  # = mean n over validation
    assert s["S_ref"]["sum_scaled"] == pytest.approx(c * n_val_mean / 6.0)
    for a in (0.25, 0.5):
        w = (c + 1e-3) ** a
        assert s["T_ref"][str(a)]["mean"] == pytest.approx(w * c)
        assert s["T_ref"][str(a)]["sum"] == pytest.approx(w * c * n_val_mean)
    # negative control: non-constant b breaks the ratio identity
    t = _const_tokens(c, n_train, n_val)
    t.loc[t.example_id == "va2", "b"] = pd.Series([[c] * 9 + [5.0]], index=t.index[t.example_id == "va2"])
    s2 = compute_scales(t, [0.25])
    assert s2["S_ref"]["sum"] / s2["S_ref"]["mean"] != pytest.approx(n_val_mean)


def test_token_counts_by_hand():
    t = pd.DataFrame(
        [
            dict(task="a", example_id="1", split="train", n_supervised=2, b=[1.0, 3.0]),
            dict(task="a", example_id="2", split="train", n_supervised=3, b=[1.0, 1.0, 1.0]),
            dict(task="b", example_id="3", split="test", n_supervised=1, b=[0.5]),
        ]
    )
    c = token_counts(t).set_index(["task", "split"])
    r = c.loc[("a", "train")]
    assert r.examples == 2 and r.supervised_tokens_sum == 5 and r.supervised_tokens_mean == 2.5
    assert r.b_mean == pytest.approx(7 / 5) and r.b_per_example_mean == pytest.approx(3.5)
    assert c.loc[("b", "test")].b_mean == 0.5


def test_token_counts_file_covers_tasks_and_splits(dirs):
    root, cfg, _ = dirs
    tc = pd.read_parquet(root / "reference" / "token_counts.parquet")
    assert len(tc) == len(cfg["data"]["tasks"]) * 3
    assert tc[tc.split == "validation"].examples.eq(3).all()


def test_load_b_aligns_and_checks(dirs, tmp_path):
    root, _, _ = dirs
    df = encoding.load_split(root / "data", "validation").iloc[::-1].reset_index(drop=True)
    b = load_b(root / "reference", df)
    assert [len(v) for v in b] == df.n_supervised.tolist()
    enc = encoding.encode(df, encoding.load_tokenizer(root / "data"))
    batch = batching.collate(enc, [0, 1], b=b)
    assert torch.allclose(batch.b[0, : len(b[0])], torch.tensor(b[0]))
    bad = df.copy()
    bad.loc[0, "n_supervised"] += 1
    with pytest.raises(ValueError, match=bad.example_id[0]):
        load_b(root / "reference", bad)
    with pytest.raises(FileNotFoundError, match="tokens.parquet"):
        load_b(tmp_path, df)


def test_config_alphas_collects_family_exponents():
    cfg = smoke_cfg(grid={"reconstruction_family": ["raw", "tokcc_a0.5", "dist_tokcc_0.05_0.95_a1"], "beta": [0.1]})
    assert config_alphas(cfg) == [0.25, 0.5, 1.0]


def test_missing_inputs_name_the_path(dirs, tmp_path):
    root, cfg, _ = dirs
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "empty" / "model")):
        run_reference(cfg, root / "data", tmp_path / "empty", tmp_path / "out", threads=1)
    partial = tmp_path / "data"
    partial.mkdir()
    (partial / "tokenizer.json").write_text((root / "data" / "tokenizer.json").read_text())
    for s in ("train", "test"):
        (partial / f"{s}.parquet").write_bytes((root / "data" / f"{s}.parquet").read_bytes())
    with pytest.raises(FileNotFoundError, match="validation.parquet"):
        run_reference(cfg, partial, root / "entangle", tmp_path / "out", threads=1)
    (partial / "validation.parquet").write_bytes((root / "data" / "validation.parquet").read_bytes())
    (partial / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        run_reference(cfg, partial, root / "entangle", tmp_path / "out", threads=1)
    assert not (tmp_path / "out").exists()  # nothing written before the inputs are checked
