"""Data stage: task examples -> parquet splits, a word-level tokenizer, a data card; and the
encoding/batching every model stage uses (docs/architecture.md, Data).

    python -m latentstrat.data --configfile config/config.yaml [--out DIR]

Records (words separated by single spaces; P = z_slots):

    <bos> <x> x </x> <z> [Z]*P </z> <y> y </y> <eos>     generator record
    <bos> <x> x </x> <y> y </y>                           posterior input

The entangled (z-free) model reads the generator record too, with a neutral slot: the `[Z]`
tokens carry no z. Its slot tokens are therefore trained, and a cell whose z projection starts
at zero computes exactly the entangled p(y|x) at step 0 (docs/design.md, "Initialization").

Supervised tokens: the y tokens, `</y>` and `<eos>` (n_supervised = n_y_tokens + 2).
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from latentstrat import config
from latentstrat.data_card import data_card, data_card_markdown
from latentstrat.io import dump_json, read_parquet, write_parquet, write_text
from latentstrat.tasks import TASKS

SPLITS = ("train", "validation", "test")
PAD, UNK, BOS, X_OPEN, X_CLOSE, Z_OPEN, Z_SLOT, Z_CLOSE, Y_OPEN, Y_CLOSE, EOS = (
    "<pad>",
    "<unk>",
    "<bos>",
    "<x>",
    "</x>",
    "<z>",
    "[Z]",
    "</z>",
    "<y>",
    "</y>",
    "<eos>",
)
SPECIAL_TOKENS = (PAD, UNK, BOS, X_OPEN, X_CLOSE, Z_OPEN, Z_SLOT, Z_CLOSE, Y_OPEN, Y_CLOSE, EOS)
COLUMNS = (
    "task",
    "example_id",
    "split",
    "strategy",
    "x",
    "y",
    "answer",
    "ambiguous",
    "matching_strategies",
    "n_y_tokens",
    "n_supervised",
)
MAX_DRAWS_PER_EXAMPLE = 200  # give up (clear error) when a task's input space is too small


# ----------------------------------------------------------------------------- records


def render_record(x: str, y: str, with_z: bool = True, z_slots: int = 1, eos: bool = True) -> str:
    """The record text; `with_z=False, eos=False` gives the posterior input."""
    parts = [BOS, X_OPEN, x, X_CLOSE]
    if with_z:
        parts += [Z_OPEN] + [Z_SLOT] * z_slots + [Z_CLOSE]
    parts += [Y_OPEN, y, Y_CLOSE]
    if eos:
        parts.append(EOS)
    return " ".join(parts)


# ----------------------------------------------------------------------------- generation


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


# ----------------------------------------------------------------------------- tokenizer


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


def added_token_ids(data_dir: str | Path) -> list[int]:
    """Ids of the tokens the data stage added to a pretrained tokenizer (tokenizer_info.json);
    [] for a word-level tokenizer, whose every token is the model's own."""
    import json

    path = Path(data_dir) / "tokenizer_info.json"
    if not path.exists():
        return []
    return [int(i) for i in json.loads(path.read_text()).get("added_token_ids", [])]


def record_tokenizer(backend) -> "PreTrainedTokenizerFast":  # noqa: F821
    """transformers' fast tokenizer over a `tokenizers.Tokenizer` (word-level, or the pretrained
    backbone's with the record markers added), with the record's pad/unk/bos/eos tokens."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(data_dir: str | Path) -> "PreTrainedTokenizerFast":  # noqa: F821
    """The data stage's tokenizer.json as transformers' `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer

    path = Path(data_dir) / "tokenizer.json"
    if not path.exists():
        raise FileNotFoundError(f"tokenizer {path} does not exist (run the data stage)")
    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - truncated or not a tokenizer file
        from latentstrat.io import unreadable_message

        raise ValueError(unreadable_message("tokenizer", path, f"{type(e).__name__}: {e}")) from None
    return record_tokenizer(backend)


def text_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text segment (x or y) alone, no special tokens added. Records are
    assembled from segments and marker ids, never by tokenizing a whole record string, so
    training, scoring and decoding prompts see the same ids."""
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"]


def decode_y(tokenizer, ids) -> str:
    """A generated y as text: the tokens before the first `</y>` / `<eos>`, decoded by the
    tokenizer, with whitespace runs folded to single spaces (the tasks' text format). The
    verifier and matcher judge this text, never token ids."""
    ids = [int(i) for i in ids]
    stops = {tokenizer.convert_tokens_to_ids(t) for t in (Y_CLOSE, EOS)}
    cut = next((k for k, t in enumerate(ids) if t in stops), len(ids))
    text = tokenizer.decode(ids[:cut], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return " ".join(text.split())


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


# ----------------------------------------------------------------------------- stage


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
    write_text(tok.to_str(pretty=True) + "\n", out_dir / "tokenizer.json")
    loaded = load_tokenizer(out_dir)
    n_y = [len(ids) for ids in text_ids(loaded, df.y.tolist())]
    df["n_y_tokens"] = n_y
    df["n_supervised"] = [n + 2 for n in n_y]
    dump_json(tokenizer_info(loaded, backbone_cfg, added), out_dir / "tokenizer_info.json")
    for split in SPLITS:
        write_parquet(df[df.split == split].reset_index(drop=True), out_dir / f"{split}.parquet")
    card = data_card(df, SPLITS)
    write_parquet(card, out_dir / "data_card.parquet")
    write_text(data_card_markdown(card, df) + "\n", out_dir / "data_card.md")
    if base_config is not None:
        dump_json(base_config, out_dir / "base_config.json")
    return card


def load_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    df = read_parquet(Path(data_dir) / f"{split}.parquet", what=f"{split} split", columns=list(COLUMNS))
    df["matching_strategies"] = df.matching_strategies.map(list)
    return df


# ----------------------------------------------------------------------------- encoding


@dataclass
class Encoded:
    """Token ids per example of one split, computed once (see `encode`)."""

    tasks: list[str]  # sorted task names; task_idx indexes this list
    z_slots: int
    gen_ids: list[list[int]]  # the record both the generator and the entangled model read
    post_ids: list[list[int]]
    sup_ids: list[list[int]]  # y tokens, </y>, <eos>
    z_open_pos: list[int]
    task_idx: list[int]
    pad_id: int
    lengths: list[int] = field(default_factory=list)  # generator record lengths

    def __len__(self) -> int:
        return len(self.gen_ids)


def encode(df: pd.DataFrame, tokenizer, z_slots: int = 1) -> Encoded:
    """Encode every row of a split (row i of df -> example i)."""
    if z_slots < 1:
        raise ValueError(f"z_slots must be >= 1, got {z_slots}")
    vocab = tokenizer.get_vocab()
    s = {t: vocab[t] for t in SPECIAL_TOKENS}
    tasks = sorted(df.task.unique())
    tindex = {t: i for i, t in enumerate(tasks)}
    enc = Encoded(tasks, z_slots, [], [], [], [], [], s[PAD])
    x_ids, y_ids = text_ids(tokenizer, df.x.tolist()), text_ids(tokenizer, df.y.tolist())
    for task, xi, yi in zip(df.task, x_ids, y_ids):
        head = [s[BOS], s[X_OPEN], *xi, s[X_CLOSE]]
        body = [s[Y_OPEN], *yi, s[Y_CLOSE]]
        zblock = [s[Z_OPEN]] + [s[Z_SLOT]] * z_slots + [s[Z_CLOSE]]
        enc.gen_ids.append(head + zblock + body + [s[EOS]])
        enc.post_ids.append(head + body)
        enc.sup_ids.append(yi + [s[Y_CLOSE], s[EOS]])
        enc.z_open_pos.append(len(head))
        enc.task_idx.append(tindex[task])
    enc.lengths = [len(g) for g in enc.gen_ids]
    return enc


def strategy_free_lengths(df: pd.DataFrame) -> list[float]:
    """Per row, the length to group batches by: x's words plus the mean y length over its
    task's strategies for that x. It depends on the input, never on the strategy the row
    follows. Grouped by a row's own length, strategies whose traces differ in length (base
    conversion, sorting, reversal) land in separate batches, and single-strategy batches tilt
    the strategy prior (docs/entangle.md)."""
    cache: dict[tuple[str, str], float] = {}
    out = []
    for task, x in zip(df.task, df.x):
        key = (task, x)
        if key not in cache:
            t = TASKS[task]
            cache[key] = len(x.split()) + float(np.mean([len(t.render(x, s).split()) for s in t.strategies]))
        out.append(cache[key])
    return out


def length_grouped_batches(lengths, batch_size: int, rng):
    """Yield index lists of similar lengths: shuffle, stable-sort by length, chunk, shuffle
    the chunks. `rng`: numpy Generator, random.Random or an int seed."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(rng, (int, np.integer)):
        rng = np.random.default_rng(int(rng))
    order = list(range(len(lengths)))
    _shuffle(order, rng)
    order.sort(key=lambda i: lengths[i])
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    _shuffle(batches, rng)
    yield from batches


def epoch_batches(lengths: list, batch_size: int, rng, alternatives: list[list[int]] | None = None):
    """One epoch of the entangle stage's length-grouped batches (lists of encoded row numbers).
    With `alternatives` (strategy resampling: per train example, the rows of its alternative
    traces), each train example contributes one of its alternative rows, drawn uniformly afresh
    every epoch; else every row once."""
    if alternatives is None:
        return length_grouped_batches(lengths, batch_size, rng)
    picks = [alt[int(rng.integers(len(alt)))] for alt in alternatives]
    batches = length_grouped_batches([lengths[r] for r in picks], batch_size, rng)
    return ([picks[i] for i in b] for b in batches)


def length_batches(lengths, batch_size: int):
    """Yield index lists of consecutive rows in length order (a stable sort: equal lengths keep
    their row order), `batch_size` at a time: the no-grad passes over a whole split and the
    decoding batches, where similar lengths together waste the least padding."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    for s in range(0, len(order), batch_size):
        yield order[s : s + batch_size]


def task_mixed_batches(task_idx, batch_size: int, rng) -> list[list[int]]:
    """One epoch of batches whose task mix follows the data's mixture: each task's rows are
    shuffled, the k-th of n_t rows of task t gets the key (k + u) / n_t (u uniform), and the
    rows sorted by key are cut into batches, so every batch holds about batch_size x n_t / n
    rows of task t (systematic sampling: the count differs from that by less than 1 on
    average, never by the whole batch). Under `sum` the per-example weighting by token count,
    which the ablation studies, then acts within each batch, not as a per-step loss scale.
    `rng`: a numpy Generator."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    task_idx = np.asarray(task_idx)
    keys = np.empty(len(task_idx))
    for t in np.unique(task_idx):
        rows = np.flatnonzero(task_idx == t)
        rows = rows[rng.permutation(len(rows))]
        keys[rows] = (np.arange(len(rows)) + rng.random(len(rows))) / len(rows)
    order = np.argsort(keys, kind="stable").tolist()
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _shuffle(items: list, rng) -> None:
    if isinstance(rng, random.Random):
        rng.shuffle(items)
    else:
        perm = rng.permutation(len(items))
        items[:] = [items[i] for i in perm]


@dataclass
class Batch:
    """Right-padded tensors for one batch (fields: docs/architecture.md, Batching)."""

    gen_ids: torch.Tensor
    gen_mask: torch.Tensor
    z_open_pos: torch.Tensor
    z_slot_pos: torch.Tensor
    gen_sup_pos: torch.Tensor
    sup_ids: torch.Tensor
    sup_mask: torch.Tensor
    post_ids: torch.Tensor
    post_mask: torch.Tensor
    b: torch.Tensor | None
    task_idx: torch.Tensor
    row_idx: torch.Tensor

    def to(self, device) -> "Batch":
        return Batch(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()})

    def __len__(self) -> int:
        return self.gen_ids.shape[0]


def _pad(seqs: list[list], value, dtype=torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=dtype)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=dtype)
        mask[i, : len(s)] = 1
    return out, mask


def collate(encoded: Encoded, idx, b=None) -> Batch:
    """Batch of rows `idx`. `b`: per-row reference NLLs for the whole split (b[i] aligned
    with sup_ids of row i), or None."""
    idx = [int(i) for i in idx]
    if not idx:
        raise ValueError("collate: empty index list")
    P = encoded.z_slots
    gen_ids, gen_mask = _pad([encoded.gen_ids[i] for i in idx], encoded.pad_id)
    post_ids, post_mask = _pad([encoded.post_ids[i] for i in idx], encoded.pad_id)
    sup_ids, sup_mask = _pad([encoded.sup_ids[i] for i in idx], encoded.pad_id)
    z_open = torch.tensor([encoded.z_open_pos[i] for i in idx])
    # next-token positions: the <y> token predicts the first y token, ...
    gen_sup = [
        list(range(encoded.z_open_pos[i] + P + 2, encoded.z_open_pos[i] + P + 2 + len(encoded.sup_ids[i]))) for i in idx
    ]
    b_t = None
    if b is not None:
        rows = [list(map(float, b[i])) for i in idx]
        for i, r in zip(idx, rows):
            if len(r) != len(encoded.sup_ids[i]):
                raise ValueError(
                    f"collate: b for row {i} has {len(r)} values, expected {len(encoded.sup_ids[i])} (n_supervised)"
                )
        b_t, _ = _pad(rows, 0.0, dtype=torch.float32)
    return Batch(
        gen_ids=gen_ids,
        gen_mask=gen_mask,
        z_open_pos=z_open,
        z_slot_pos=z_open[:, None] + torch.arange(1, P + 1)[None, :],
        gen_sup_pos=_pad(gen_sup, 0)[0],
        sup_ids=sup_ids,
        sup_mask=sup_mask,
        post_ids=post_ids,
        post_mask=post_mask,
        b=b_t,
        task_idx=torch.tensor([encoded.task_idx[i] for i in idx]),
        row_idx=torch.tensor(idx),
    )


def split_batches(encoded: Encoded, batch_size: int, device, b=None):
    """The no-grad walk over a whole split: (rows, batch) for each batch of rows in length order
    (`length_batches`), collated (with the reference NLLs `b` when given) and on `device`. The
    caller puts each batch's results back at `rows`."""
    for rows in length_batches(encoded.lengths, batch_size):
        yield rows, collate(encoded, rows, b).to(device)


# ----------------------------------------------------------------------------- CLI


def main(argv=None) -> None:
    from latentstrat.config import base_settings, config_for_command
    from latentstrat.paths import Paths

    ap = argparse.ArgumentParser(
        prog="python -m latentstrat.data", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    ap.add_argument("--configfile", required=True, help="collection config YAML")
    ap.add_argument("--out", help="output folder (default: the config's data dir)")
    args = ap.parse_args(argv)
    cfg = config_for_command(args.configfile)
    out = Path(args.out) if args.out else Paths.from_config(cfg).data_dir
    card = build_dataset(cfg["data"], out, base_config=base_settings(cfg), backbone_cfg=cfg["backbone"])
    cols = ["task", "n_train", "n_validation", "n_test", "ambiguity_rate", "y_tokens_mean", "y_tokens_max"]
    print(card[cols].to_string(index=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
