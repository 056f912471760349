"""Batches of encoded rows (latentstrat.encoding): which rows go together (length-grouped for
the entangle stage, task-mixed for a cell's training, length-sorted for the no-grad passes) and
the right-padded tensors a batch is (`collate`; fields: docs/architecture.md, Batching)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from latentstrat.encoding import Encoded


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


def host_array(t) -> np.ndarray:
    """A small integer tensor (lengths, positions) as a host array: a read from the device, for
    the callers that have no host copy (decoding, tests); a training step's batch carries its own."""
    return np.asarray(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t, dtype=np.int64)


def to_device(a, device) -> torch.Tensor:
    """A host array or tensor on `device` without blocking the host: through pinned memory on
    an accelerator (a pageable copy would wait for the stream), as it is on the CPU."""
    t = torch.as_tensor(a)
    dev = torch.device(device)
    if dev.type == "cpu" or t.device == dev:
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


@dataclass(frozen=True)
class HostRows:
    """A right-padded generator batch's positions on the host: row lengths [B], `<z>` positions
    [B] and the supervised positions [B, L] (None without them). `collate` writes them beside
    the tensors, so a training step reads nothing back from the device to lay out its passes."""

    lengths: np.ndarray
    z_open: np.ndarray
    sup_pos: np.ndarray | None

    @classmethod
    def of(cls, mask, z_open_pos, sup_pos=None) -> "HostRows":
        """From the tensors themselves (a read from the device: callers outside the step)."""
        return cls(host_array(mask.sum(1)), host_array(z_open_pos), None if sup_pos is None else host_array(sup_pos))


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
    # on the host: the generator record's positions, the posterior inputs' lengths, the rows' tasks
    host: HostRows | None = None
    post_lengths: np.ndarray | None = None
    task_rows: np.ndarray | None = None

    def to(self, device) -> "Batch":
        """On `device`, without blocking the host (pinned memory, non-blocking copies on an
        accelerator); the host fields stay."""
        return Batch(
            **{k: (to_device(v, device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        )

    def tokens(self) -> int:
        """Real tokens of the two trained passes (generator record + posterior input), counted on the host."""
        return int(self.host.lengths.sum() + self.post_lengths.sum())

    def __len__(self) -> int:
        return self.gen_ids.shape[0]


def _pad(seqs: list[list], value, dtype=torch.long, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    width = -(-max(len(s) for s in seqs) // multiple) * multiple
    out = torch.full((len(seqs), width), value, dtype=dtype)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=dtype)
        mask[i, : len(s)] = 1
    return out, mask


def collate(encoded: Encoded, idx, b=None, multiple: int = 1) -> Batch:
    """Batch of rows `idx`. `b`: per-row reference NLLs for the whole split (b[i] aligned
    with sup_ids of row i), or None. `multiple`: widths padded up to a multiple of it (a few
    static shapes for a compiled step; the pads are never read)."""
    idx = [int(i) for i in idx]
    if not idx:
        raise ValueError("collate: empty index list")
    P = encoded.z_slots
    gen_ids, gen_mask = _pad([encoded.gen_ids[i] for i in idx], encoded.pad_id, multiple=multiple)
    post_ids, post_mask = _pad([encoded.post_ids[i] for i in idx], encoded.pad_id, multiple=multiple)
    sup_ids, sup_mask = _pad([encoded.sup_ids[i] for i in idx], encoded.pad_id, multiple=multiple)
    z_open_host = np.asarray([encoded.z_open_pos[i] for i in idx], dtype=np.int64)
    z_open = torch.from_numpy(z_open_host)
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
        b_t, _ = _pad(rows, 0.0, dtype=torch.float32, multiple=multiple)
    sup_host = np.zeros((len(idx), sup_ids.shape[1]), dtype=np.int64)  # the supervised width
    for r, pos in enumerate(gen_sup):
        sup_host[r, : len(pos)] = pos
    task_rows = np.asarray([encoded.task_idx[i] for i in idx], dtype=np.int64)
    return Batch(
        gen_ids=gen_ids,
        gen_mask=gen_mask,
        z_open_pos=z_open,
        z_slot_pos=z_open[:, None] + torch.arange(1, P + 1)[None, :],
        gen_sup_pos=torch.from_numpy(sup_host.copy()),
        sup_ids=sup_ids,
        sup_mask=sup_mask,
        post_ids=post_ids,
        post_mask=post_mask,
        b=b_t,
        task_idx=torch.from_numpy(task_rows),
        row_idx=torch.tensor(idx),
        host=HostRows(np.asarray(encoded.lengths, dtype=np.int64)[idx], z_open_host, sup_host),
        post_lengths=np.asarray([len(encoded.post_ids[i]) for i in idx], dtype=np.int64),
        task_rows=task_rows,
    )


def split_batches(encoded: Encoded, batch_size: int, device, b=None):
    """The no-grad walk over a whole split: (rows, batch) for each batch of rows in length order
    (`length_batches`), collated (with the reference NLLs `b` when given) and on `device`. The
    caller puts each batch's results back at `rows`."""
    for rows in length_batches(encoded.lengths, batch_size):
        yield rows, collate(encoded, rows, b).to(device)
