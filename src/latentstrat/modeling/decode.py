"""Decoding: the one path from prompts to generated y, batched with a KV cache (design section
5.5, docs/design.md). Every generation of the project comes from `decode_batch`: a cell's
(`generate`: the evaluate stage, the trainer's decoded validation subset) and the entangled
model's quality samples (`generate_zfree`).

For each input x:
  1. router (a cell only): the prefix `<bos> <x> x-tokens </x> <z>` -> (mu_r, logvar_r)
     (model.router_prefix); z = mu_r + sigma_r * eps with eps drawn once for the whole list
     from a seeded generator (so z does not depend on batching), or z given by the caller;
  2. prompt `<bos> <x> .. </x> <z> [Z]*P </z> <y>` (the training record cut after `<y>`), with
     z written into the slots (model.embed_with_z) for a cell, the slots' own token embedding
     (a neutral slot, as it was trained) for the entangled model; left-padded, with an
     attention mask and position ids that count only real tokens, one forward that fills the
     KV cache;
  3. one token per step (greedy, or sampled at a temperature from a torch.Generator) until
     every row has produced `<eos>` or max_new_tokens tokens; finished rows leave the batch.
Prompts are batched by length (batching.length_batches). The generated y text is the decoded
tokens before the first `</y>` / `<eos>` (encoding.decode_y).

The model interface used for a cell (latentstrat.modeling.model.LatentStrategyModel): `router_prefix`,
`embed_with_z`, `adapter("generator")`, `z_slots`, and `lm`: the adapted causal LM (an HF
forward taking inputs_embeds / input_ids, attention_mask, position_ids, cache). The entangled
model is such a causal LM itself.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

from latentstrat import batching, encoding
from latentstrat.modeling.backbone import device_of
from latentstrat.runtime.progress import Progress


@dataclass(frozen=True)
class Decoding:
    """How generations are decoded: up to `max_new_tokens` per prompt, `batch_size` prompts at a
    time (similar lengths together), greedy (`temperature` 0) or sampled at `temperature`,
    seeded with `seed` (which also seeds the router's z)."""

    max_new_tokens: int = 128
    batch_size: int = 64
    temperature: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError(f"max_new_tokens and batch_size must be >= 1, got {self}")


@dataclass
class Generation:
    texts: list[str]  # generated y (before </y> / <eos>)
    z: torch.Tensor  # [N, D] the z each generation was conditioned on
    mu_r: torch.Tensor | None  # [N, D] router means (None when z was given)
    logvar_r: torch.Tensor | None
    n_generated: list[int]  # tokens generated, up to and including <eos> (or the cap)
    token_ids: list[list[int]]  # the generated ids, up to and including <eos>


def special_id(tokenizer, token: str) -> int:
    vocab = tokenizer.get_vocab()
    if token not in vocab:
        raise ValueError(f"tokenizer has no special token {token!r}")
    return int(vocab[token])


@dataclass
class Prompts:
    """Per x: the router prefix `<bos> <x> .. </x> <z>` and the decoding prompt
    `<bos> <x> .. </x> <z> [Z]*P </z> <y>` (the training record cut after `<y>`)."""

    router: list[list[int]]
    prompt: list[list[int]]
    slot_pos: list[list[int]]


def encode_prompts(tokenizer, x_texts: list[str], z_slots: int) -> Prompts:
    """Cut from encoding.encode's generator record, so decoding sees exactly the training layout."""
    enc = encoding.encode(pd.DataFrame({"task": "", "x": list(x_texts), "y": ""}), tokenizer, z_slots)
    router, prompt, slots = [], [], []
    for ids, zo in zip(enc.gen_ids, enc.z_open_pos):
        router.append(ids[: zo + 1])
        prompt.append(ids[: zo + z_slots + 3])  # ... <z> [Z]*P </z> <y>
        slots.append(list(range(zo + 1, zo + 1 + z_slots)))
    return Prompts(router, prompt, slots)


def _pad(seqs: list[list[int]], pad: int, left: bool):
    T = max(map(len, seqs))
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        cols = slice(T - len(s), T) if left else slice(0, len(s))
        ids[i, cols] = torch.tensor(s)
        mask[i, cols] = 1
    return ids, mask


@torch.no_grad()
def router_z(model, tokenizer, prompts: Prompts, batch_size: int = 64, seed: int = 0, sample: bool = True):
    """(z, mu_r, logvar_r) [N, D] per prompt, the router's pass batched by prompt length;
    z = mu_r + sigma_r * eps, eps drawn once for all N rows from `seed` (so z depends on the
    batching only through the last bits of the pass); sample=False: z = mu_r."""
    pad, dev = special_id(tokenizer, encoding.PAD), device_of(model)
    mu, logvar = torch.empty(len(prompts.router), model.latent_dim), torch.empty(len(prompts.router), model.latent_dim)
    for rows in batching.length_batches([len(p) for p in prompts.router], batch_size):
        ids, mask = _pad([prompts.router[i] for i in rows], pad, left=False)
        m, lv = model.router_prefix(ids.to(dev), mask.to(dev), (mask.sum(1) - 1).to(dev))
        mu[rows], logvar[rows] = m.float().cpu(), lv.float().cpu()
    if not sample:
        return mu.clone(), mu, logvar
    eps = torch.randn(mu.shape, generator=torch.Generator().manual_seed(seed))
    return mu + torch.exp(0.5 * logvar) * eps, mu, logvar


def _next_token(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> torch.Tensor:
    """Greedy (temperature 0) or sampled with `gen`, which lives on the logits' (the model's)
    device: the probabilities never leave it."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1)


@torch.no_grad()
def decode_batch(
    model,
    tokenizer,
    prompts: list[list[int]],
    slot_pos: list[list[int]],
    z: torch.Tensor | None,
    max_new_tokens: int,
    temperature: float = 0.0,
    gen: torch.Generator | None = None,
) -> list[list[int]]:
    """Generated ids per prompt (up to and including <eos>, or max_new_tokens tokens).

    `z` [B, D]: `model` is a LatentStrategyModel, z goes into the `[Z]` slots at `slot_pos`
    and its generator adapter decodes. `z` None: `model` is a plain causal LM (the entangled
    model) reading the `[Z]` slots' token embedding. Left padding; position ids count real
    tokens only, so each row sees the positions it would see alone. One forward over the
    prompts fills the KV cache, then one token per step; rows that produced <eos> leave the
    batch (and the cache).
    """
    pad, eos, dev = special_id(tokenizer, encoding.PAD), special_id(tokenizer, encoding.EOS), device_of(model)
    ids, mask = _pad(prompts, pad, left=True)
    shift = (ids.shape[1] - mask.sum(1))[:, None]
    ids, mask = ids.to(dev), mask.to(dev)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    out_ids = torch.full((len(prompts), max_new_tokens), pad, dtype=torch.long, device=dev)
    active = torch.arange(len(prompts), device=dev)  # rows still decoding
    n = 0
    with contextlib.nullcontext() if z is None else model.adapter("generator"):
        lm = model if z is None else model.lm
        if z is None:
            first = {"input_ids": ids}
        else:
            slots = (torch.tensor(slot_pos) + shift).to(dev)
            first = {"inputs_embeds": model.embed_with_z(ids, z.to(dev), slots)}
        out = lm(**first, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        while True:
            tok = _next_token(out.logits[:, -1], temperature, gen)
            out_ids[active, n] = tok
            n += 1
            finished = tok == eos
            if n == max_new_tokens or bool(finished.all()):
                break
            cache = out.cache
            if bool(finished.any()):  # drop finished rows from the batch and the cache
                keep = (~finished).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                active, tok, mask, pos = active[keep], tok[keep], mask[keep], pos[keep]
            mask = torch.cat([mask, torch.ones((len(active), 1), dtype=mask.dtype, device=dev)], 1)
            pos = pos[:, -1:] + 1
            out = lm(input_ids=tok[:, None], attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    rows = out_ids[:, :n].tolist()
    return [r[: r.index(eos) + 1] if eos in r else r for r in rows]


def decode_prompts(
    model,
    tokenizer,
    prompts: Prompts,
    z: torch.Tensor | None,
    decoding: Decoding,
    gen: torch.Generator | None = None,
    progress: str | None = None,
) -> list[list[int]]:
    """`decode_batch` over every prompt, batched by prompt length (batching.length_batches);
    generated ids in input order. `z`: [N, D] for a cell, None for the entangled model;
    `gen`: the sampling generator (temperature > 0); `progress`: a label to show progress under."""
    N = len(prompts.prompt)
    token_ids: list[list[int]] = [[] for _ in range(N)]
    # a terminal gets a bar; a log file (a job's) a line every 30 s
    tty = bool(progress) and sys.stderr.isatty()
    bar = tqdm(total=N, desc=progress, unit="ex", disable=not tty, mininterval=5)
    lines = Progress(progress, N, unit="example") if progress and not tty else None
    done = 0
    for idx in batching.length_batches([len(p) for p in prompts.prompt], decoding.batch_size):
        out = decode_batch(
            model,
            tokenizer,
            [prompts.prompt[i] for i in idx],
            [prompts.slot_pos[i] for i in idx],
            None if z is None else z[idx],
            decoding.max_new_tokens,
            decoding.temperature,
            gen,
        )
        for i, ids in zip(idx, out):
            token_ids[i] = ids
        done += len(idx)
        bar.update(len(idx))
        if lines:
            lines.update(done, tokens=sum(len(ids) for ids in out))
    bar.close()
    return token_ids


@torch.no_grad()
def generate(
    model,
    tokenizer,
    x_texts: list[str],
    z: torch.Tensor | None = None,
    sample_z_from: str = "router",
    decoding: Decoding = Decoding(),
    progress: str | None = None,
) -> Generation:
    """A cell's generations: y for every x, conditioned on z, given [N, D] or from the router.

    sample_z_from: 'router' (z ~ N(mu_r, sigma_r), seeded with `decoding.seed`) or
    'router_mean' (z = mu_r); ignored when z is given. Prompts are batched by length; outputs
    come back in input order. `progress`: a label to show progress under (None: none).
    """
    if sample_z_from not in ("router", "router_mean"):
        raise ValueError(f"sample_z_from must be 'router' or 'router_mean', got {sample_z_from!r}")
    d = decoding
    N = len(x_texts)
    prompts = encode_prompts(tokenizer, x_texts, model.z_slots)
    mu = logvar = None
    was_training = model.training
    model.eval()
    try:
        with model.adapter("generator"):
            if z is None:
                z, mu, logvar = router_z(
                    model, tokenizer, prompts, d.batch_size, d.seed, sample=sample_z_from == "router"
                )
            elif tuple(z.shape) != (N, model.latent_dim):
                raise ValueError(f"z has shape {tuple(z.shape)}, expected ({N}, {model.latent_dim})")
            gen = torch.Generator(device_of(model)).manual_seed(d.seed + 1) if d.temperature > 0 else None
            token_ids = decode_prompts(model, tokenizer, prompts, z, d, gen, progress)
    finally:
        model.train(was_training)
    texts = [encoding.decode_y(tokenizer, ids) for ids in token_ids]
    return Generation(texts, z, mu, logvar, [len(t) for t in token_ids], token_ids)


@torch.no_grad()
def generate_zfree(model, tokenizer, x_texts: list[str], z_slots: int, decoding: Decoding) -> list[str]:
    """The entangled (z-free) model's y text for every x: the cell's prompt layout with a
    neutral slot of `z_slots` `[Z]` tokens, decoded as `decoding` says (sampled from a
    generator on the model's device seeded with its seed, as the cells' decoding is: no
    vocabulary-sized copy to the host per step)."""
    prompts = encode_prompts(tokenizer, x_texts, z_slots)
    was_training = model.training
    model.eval()
    try:
        gen = torch.Generator(device_of(model)).manual_seed(decoding.seed) if decoding.temperature > 0 else None
        token_ids = decode_prompts(model, tokenizer, prompts, None, decoding, gen)
    finally:
        model.train(was_training)
    return [encoding.decode_y(tokenizer, ids) for ids in token_ids]
