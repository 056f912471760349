"""The cluster path without the hub: a local "pretrained" directory (a tiny Qwen2-architecture
model and a byte-level BPE tokenizer trained on the task texts, both written with
save_pretrained) read with `backbone.source: pretrained`, through the whole workflow; and the
original study's `direct` mode (no entangle stage, cells start from the pretrained backbone)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from latentstrat import encoding
from latentstrat.base import data
from latentstrat.config import load_config
from latentstrat.modeling.backbone import build_backbone
from latentstrat.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
TASK_NAMES = ["multidigit_addition", "grid_pathfinding"]
MARKERS = [
    encoding.X_OPEN,
    encoding.X_CLOSE,
    encoding.Z_OPEN,
    encoding.Z_SLOT,
    encoding.Z_CLOSE,
    encoding.Y_OPEN,
    encoding.Y_CLOSE,
]


def make_pretrained_dir(root: Path) -> Path:
    """A tiny Qwen2 checkpoint + its own byte-level BPE tokenizer, as a hub model would ship."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    df = data.generate(
        {"seed": 5, "tasks": TASK_NAMES, "train_per_task": 50, "validation_per_task": 5, "test_per_task": 5}
    )
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(list(df.x) + list(df.y), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    d = root / "tiny-pretrained"
    tok.save_pretrained(d)
    # like Qwen2.5, the embedding has more rows than the tokenizer has tokens
    cfg = Qwen2Config(
        vocab_size=len(tok) + 64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def pretrained_dir(tmp_path_factory):
    return make_pretrained_dir(tmp_path_factory.mktemp("hub"))


def backbone(path) -> dict:
    return {"source": "pretrained", "name_or_path": str(path), "dtype": "float32"}


def test_data_stage_uses_the_backbones_tokenizer_with_single_token_markers(pretrained_dir, tmp_path):
    from transformers import AutoTokenizer

    cfg = load_config(
        ROOT / "config" / "smoke.yaml", overrides={"backbone": backbone(pretrained_dir), "data": {"tasks": TASK_NAMES}}
    )
    data.build_dataset(cfg["data"], tmp_path, backbone_cfg=cfg["backbone"])
    info = json.loads((tmp_path / "tokenizer_info.json").read_text())
    own = AutoTokenizer.from_pretrained(pretrained_dir)
    assert info["identity"] == f"pretrained:{pretrained_dir}@default"
    tok = encoding.load_tokenizer(tmp_path)
    assert len(tok) == len(own) + len(encoding.SPECIAL_TOKENS)  # its own vocabulary + the record tokens
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert sorted(info["added_token_ids"]) == list(range(len(own), len(own) + len(encoding.SPECIAL_TOKENS)))
    for m in MARKERS:  # each marker is one token, in the record too
        ids = encoding.text_ids(tok, [f"3 {m} 4"])[0]
        assert tok.convert_tokens_to_ids(m) in ids and len(encoding.text_ids(tok, [m])[0]) == 1
    df = pd.concat([encoding.load_split(tmp_path, s) for s in encoding.SPLITS])
    # token counts are the backbone's, not words
    bpe_counts = [len(own(y, add_special_tokens=False)["input_ids"]) for y in df.y]
    assert df.n_y_tokens.tolist() == bpe_counts and df.n_supervised.tolist() == [n + 2 for n in bpe_counts]
    assert (df.n_y_tokens != df.y.str.split().str.len()).any()
    # a trace encoded as the model sees it and decoded back is the same text, and it verifies
    enc = encoding.encode(df, tok)
    for i in range(len(df)):
        text = encoding.decode_y(tok, enc.sup_ids[i])
        assert text == df.y.iloc[i]
        assert TASKS[df.task.iloc[i]].final_answer_correct(df.x.iloc[i], text)
    # the markers' embedding rows start at the mean pretrained row (rows the model never trained)
    model = build_backbone(cfg["backbone"], tok, encoding.added_token_ids(tmp_path))
    emb = model.get_input_embeddings().weight
    mean = emb[: len(own)].mean(0)
    for t in encoding.SPECIAL_TOKENS:
        assert torch.allclose(emb[tok.convert_tokens_to_ids(t)], mean, atol=1e-6)


def test_missing_local_model_is_named_before_any_work(tmp_path):
    cfg = load_config(ROOT / "config" / "smoke.yaml", overrides={"backbone": backbone(tmp_path / "no-such-model")})
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        data.build_dataset(cfg["data"], tmp_path / "data", backbone_cfg=cfg["backbone"])
    assert not (tmp_path / "data" / "train.parquet").exists()


def run_workflow(tmp_path: Path, overrides: dict) -> Path:
    """The smoke collection (2 tasks, 2 sum cells, no comparison arm) end to end, locally."""
    over = {
        "extends": str(ROOT / "config" / "smoke.yaml"),
        "collection": "smoke-pretrained",
        "base": "smoke-pretrained",
        "results_dir": str(tmp_path / "results"),
        "data": {"tasks": TASK_NAMES, "train_per_task": 24, "validation_per_task": 8, "test_per_task": 6},
        "grid": {"reconstruction_family": ["raw", "dist_norm"], "beta": [0.1]},
        "comparison_arms": [],
        "resources": {"threads": 1, "threads_base": 1},
        **overrides,
    }
    wd = tmp_path / "wd"  # a copy of the workflow: its own .snakemake/, nothing shared with the checkout
    wd.mkdir()
    shutil.copy(ROOT / "Snakefile", wd / "Snakefile")
    for d in ("workflow", "config", "envs", "src"):
        shutil.copytree(ROOT / d, wd / d, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    cfg_path = tmp_path / "collection.yaml"
    cfg_path.write_text(yaml.safe_dump(over))
    r = subprocess.run(
        [SNAKEMAKE, "--configfile", str(cfg_path), "--cores", "2"], cwd=wd, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return tmp_path / "results"


@pytest.mark.slow
def test_local_pretrained_collection_end_to_end(pretrained_dir, tmp_path):
    res = run_workflow(tmp_path, {"backbone": backbone(pretrained_dir)})
    base = res / "base" / "smoke-pretrained"
    info = json.loads((base / "data" / "tokenizer_info.json").read_text())
    assert info["identity"] == f"pretrained:{pretrained_dir}@default"
    # the entangled model's quality samples are judged on decoded text
    samples = pd.read_parquet(base / "entangle" / "quality_samples.parquet")
    assert samples.y_generated.map(lambda s: isinstance(s, str)).all()
    brief = yaml.safe_load((res / "smoke-pretrained" / "report" / "brief.yaml").read_text())
    assert brief["cells"]["complete"] == 2 and brief["cells"]["incomplete"] == []
    rec = pd.concat(pd.read_parquet(p) for p in base.glob("cells/*/*/evaluate/records.parquet"))
    tok = encoding.load_tokenizer(base / "data")
    # generated traces are text; re-encoding one and decoding it again gives the same text
    for y in rec.y_generated.head(20):
        assert encoding.decode_y(tok, encoding.text_ids(tok, [y])[0]) == " ".join(y.split())


@pytest.mark.slow
def test_direct_mode_without_entangle_stage(pretrained_dir, tmp_path):
    res = run_workflow(
        tmp_path, {"backbone": backbone(pretrained_dir), "entangle": {"mode": "skip"}, "cell": {"init": "direct"}}
    )
    base = res / "base" / "smoke-pretrained"
    assert not (base / "entangle" / "model").exists()
    assert json.loads((base / "entangle" / "quality.json").read_text())["mode"] == "skip"
    brief = yaml.safe_load((res / "smoke-pretrained" / "report" / "brief.yaml").read_text())
    assert brief["cells"]["complete"] == 2
