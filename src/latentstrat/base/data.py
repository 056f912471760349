"""Data stage: task examples -> parquet splits, a tokenizer (word-level, or a pretrained
backbone's with the record tokens added), a data card (docs/architecture.md, Data). The record
format and the readers every other stage uses are latentstrat.encoding.

    python -m latentstrat.base.data --configfile config/config.yaml [--out DIR]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from latentstrat import config
from latentstrat.base.data_card import data_card, data_card_markdown
from latentstrat.encoding import (
    COLUMNS,
    SPECIAL_TOKENS,
    SPLITS,
    UNK,
    load_tokenizer,
    render_record,
    text_ids,
)
from latentstrat.io import dump_json, write_parquet, write_text
from latentstrat.paths import DATA_FILES
from latentstrat.tasks import TASKS

if TYPE_CHECKING:
    from latentstrat.jobs import Job

MAX_DRAWS_PER_EXAMPLE = 200  # give up (clear error) when a task's input space is too small


def task_rng(seed: int, task: str) -> random.Random:
    """One independent, reproducible stream per (data seed, task)."""
    return random.Random(f"{seed}:{task}")


def generate_task(name: str, sizes: dict[str, int], seed: int) -> pd.DataFrame:
    """Examples of one task for every split: unique inputs (so splits are disjoint by x),
    strategy labels uniform per example, ambiguity flags from the matcher."""
    task = TASKS[name]
    rng = task_rng(seed, name)
    total = sum(sizes.values())
    xs, seen, draws = [], set(), 0
    while len(xs) < total:
        draws += 1
        if draws > MAX_DRAWS_PER_EXAMPLE * total:
            raise ValueError(
                f"task {name}: found only {len(xs)} distinct inputs for {total} requested "
                f"examples (data.*_per_task too large for this task's input space)"
            )
        x = task.sample_input(rng)
        if x not in seen:
            seen.add(x)
            xs.append(x)
    rows, start = [], 0
    for split in SPLITS:
        for i, x in enumerate(xs[start : start + sizes[split]]):
            strategy = rng.choice(task.strategies)
            y = task.render(x, strategy)
            matches = sorted(task.matching_strategies(x, y))
            if strategy not in matches or not task.final_answer_correct(x, y):
                raise AssertionError(f"task {name}: the {strategy} trace of {x!r} fails its own verifier/matcher")
            n_y = len(y.split())
            rows.append(
                dict(
                    task=name,
                    example_id=f"{name}-{split}-{i:05d}",
                    split=split,
                    strategy=strategy,
                    x=x,
                    y=y,
                    answer=task.answer(x),
                    ambiguous=len(matches) > 1,
                    matching_strategies=matches,
                    n_y_tokens=n_y,
                    n_supervised=n_y + 2,
                )
            )
        start += sizes[split]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def generate(data_cfg: dict) -> pd.DataFrame:
    """All tasks of a (validated) data config, sorted by (split, task, example_id)."""
    sizes = {s: int(data_cfg[f"{s}_per_task"]) for s in SPLITS}
    for key, n in sizes.items():
        if n < 1:
            raise ValueError(f"config key data.{key}_per_task: must be positive, got {n}")
    unknown = [t for t in data_cfg["tasks"] if t not in TASKS]
    if unknown:
        raise ValueError(f"config key data.tasks: unknown task {unknown[0]!r} (known: {', '.join(sorted(TASKS))})")
    df = pd.concat([generate_task(t, sizes, int(data_cfg["seed"])) for t in data_cfg["tasks"]], ignore_index=True)
    df["_s"] = df.split.map(SPLITS.index)
    return df.sort_values(["_s", "task", "example_id"]).drop(columns="_s").reset_index(drop=True)


def build_tokenizer(texts) -> "tokenizers.Tokenizer":  # noqa: F821
    """Word-level tokenizer: special tokens first (fixed ids), then the sorted vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = set("0123456789")
    for t in texts:
        words.update(t.split())
    vocab = list(SPECIAL_TOKENS) + sorted(words - set(SPECIAL_TOKENS))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def pretrained_tokenizer(backbone_cfg: dict):
    """The pretrained backbone's own tokenizer (`AutoTokenizer.from_pretrained(name_or_path,
    revision)`) with the record's special tokens added, each a single token. Returns the
    backend `tokenizers.Tokenizer` (what the data stage saves as tokenizer.json) and the tokens
    it did not know before."""
    from transformers import AutoTokenizer

    path, revision = config.pretrained_source(backbone_cfg)
    try:
        tok = AutoTokenizer.from_pretrained(path, revision=revision, use_fast=True)
    except (OSError, ValueError) as e:
        raise OSError(
            f"config key backbone.name_or_path: cannot load the tokenizer of {path!r} "
            f"(revision {revision or 'default'}): {e}. Offline: point name_or_path at a local "
            f"directory holding the model and its tokenizer, or fill the hub cache and set "
            f"HF_HUB_OFFLINE=1"
        ) from None
    if not tok.is_fast:
        raise ValueError(f"backbone {path!r}: its tokenizer has no fast (tokenizers) version; latentstrat needs one")
    backend = tok.backend_tokenizer
    known = backend.get_vocab(with_added_tokens=True)
    added = [t for t in SPECIAL_TOKENS if t not in known]
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return backend, added


def tokenizer_info(tokenizer, backbone_cfg: dict, added: list[str]) -> dict:
    """What the data stage records about its tokenizer (tokenizer_info.json): its identity, its
    size, the record tokens' ids, and which of them it added to a pretrained tokenizer."""
    vocab = tokenizer.get_vocab()
    return {
        "identity": config.tokenizer_identity(backbone_cfg),
        "size": len(tokenizer),
        "special_token_ids": {t: int(vocab[t]) for t in SPECIAL_TOKENS},
        "added_token_ids": sorted(int(vocab[t]) for t in added),
    }


def build_dataset(
    data_cfg: dict, out_dir: str | Path, base_config: dict | None = None, backbone_cfg: dict | None = None
) -> pd.DataFrame:
    """The data stage: {train,validation,test}.parquet, tokenizer.json (+ tokenizer_info.json),
    data_card.{md,parquet} (and base_config.json when given). The tokenizer is word-level, or
    the pretrained backbone's own when `backbone_cfg` has source pretrained; token counts
    (n_y_tokens, n_supervised) are counted with it. Returns the data card."""
    out_dir = Path(out_dir)
    backbone_cfg = backbone_cfg or {"source": "embedded"}
    added: list[str] = []
    if backbone_cfg.get("source") == "pretrained":
        tok, added = pretrained_tokenizer(backbone_cfg)  # first: a missing model fails before any work
    df = generate(data_cfg)
    if backbone_cfg.get("source") != "pretrained":
        tok = build_tokenizer(render_record(x, y) for x, y in zip(df.x, df.y))
    write_text(tok.to_str(pretty=True) + "\n", out_dir / DATA_FILES["tokenizer"])
    loaded = load_tokenizer(out_dir)
    n_y = [len(ids) for ids in text_ids(loaded, df.y.tolist())]
    df["n_y_tokens"] = n_y
    df["n_supervised"] = [n + 2 for n in n_y]
    dump_json(tokenizer_info(loaded, backbone_cfg, added), out_dir / DATA_FILES["tokenizer_info"])
    for split in SPLITS:
        write_parquet(df[df.split == split].reset_index(drop=True), out_dir / DATA_FILES[split])
    card = data_card(df, SPLITS)
    write_parquet(card, out_dir / DATA_FILES["card"])
    write_text(data_card_markdown(card, df) + "\n", out_dir / "data_card.md")
    if base_config is not None:
        dump_json(base_config, out_dir / DATA_FILES["base_config"])
    return card


def run(job: Job) -> None:
    """The data rule's job: the splits, tokenizer and data card into the folder of its outputs."""
    base = config.Base.of(job.config)
    build_dataset(base.data, job.folder("base_config"), base_config=base.settings(), backbone_cfg=base.backbone)


def main(argv=None) -> None:
    from latentstrat.config import Base, config_for_command
    from latentstrat.paths import Paths

    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.base.data", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", required=True, help="collection config YAML")
    ap.add_argument("--out", help="output folder (default: the config's data dir)")
    args = ap.parse_args(argv)
    cfg = config_for_command(args.configfile)
    out = Path(args.out) if args.out else Paths.from_config(cfg).data_dir
    base = Base.of(cfg)
    card = build_dataset(base.data, out, base_config=base.settings(), backbone_cfg=base.backbone)
    cols = ["task", "n_train", "n_validation", "n_test", "ambiguity_rate", "y_tokens_mean", "y_tokens_max"]
    print(card[cols].to_string(index=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
