"""The record format and how every stage reads a base's data: the special tokens, the record
text, the tokenizer the data stage wrote, the splits and their token ids (`encode`). The data stage
that writes them is latentstrat.base.data; batches are latentstrat.batching.

Records (words separated by single spaces; P = z_slots):

    <bos> <x> x </x> <z> [Z]*P </z> <y> y </y> <eos>     generator record
    <bos> <x> x </x> <y> y </y>                           posterior input

The entangled (z-free) model reads the generator record too, with a neutral slot: the `[Z]`
tokens carry no z. Its slot tokens are therefore trained, and a cell whose z projection starts
at zero computes exactly the entangled p(y|x) at step 0 (docs/design.md, "Initialization").

Supervised tokens: the y tokens, `</y>` and `<eos>` (n_supervised = n_y_tokens + 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from latentstrat.io import read_parquet
from latentstrat.paths import DATA_FILES
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


def render_record(x: str, y: str, with_z: bool = True, z_slots: int = 1, eos: bool = True) -> str:
    """The record text; `with_z=False, eos=False` gives the posterior input."""
    parts = [BOS, X_OPEN, x, X_CLOSE]
    if with_z:
        parts += [Z_OPEN] + [Z_SLOT] * z_slots + [Z_CLOSE]
    parts += [Y_OPEN, y, Y_CLOSE]
    if eos:
        parts.append(EOS)
    return " ".join(parts)


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

    path = Path(data_dir) / DATA_FILES["tokenizer"]
    if not path.exists():
        raise FileNotFoundError(f"tokenizer {path} does not exist (run the data stage)")
    try:
        backend = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - truncated or not a tokenizer file
        from latentstrat.io import unreadable_message

        raise ValueError(unreadable_message("tokenizer", path, f"{type(e).__name__}: {e}")) from None
    return record_tokenizer(backend)


def added_token_ids(data_dir: str | Path) -> list[int]:
    """Ids of the tokens the data stage added to a pretrained tokenizer (tokenizer_info.json);
    [] for a word-level tokenizer, whose every token is the model's own."""
    import json

    path = Path(data_dir) / DATA_FILES["tokenizer_info"]
    if not path.exists():
        return []
    return [int(i) for i in json.loads(path.read_text()).get("added_token_ids", [])]


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


def load_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    df = read_parquet(Path(data_dir) / DATA_FILES[split], what=f"{split} split", columns=list(COLUMNS))
    df["matching_strategies"] = df.matching_strategies.map(list)
    return df


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
