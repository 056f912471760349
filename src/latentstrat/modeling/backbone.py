"""Backbones: the causal LMs every model of latentstrat runs on (transformers' own).

- `build_backbone`: the embedded small Qwen2 (from a `Qwen2Config`, tied embeddings), any
  hub/local model via `from_pretrained`, or random init from a config JSON;
- `load_entangled`: the entangle stage's model (`AutoModelForCausalLM.from_pretrained`, with
  the config's `backbone.attn_implementation`); `write_model_extras` puts its tokenizer and a
  model card beside it, so the folder opens with AutoTokenizer / AutoModelForCausalLM alone;
- `hidden_at`: a Qwen2 decoder's pass over a right-padded batch at the positions its caller
  reads (`fast_hidden`: packed over the real tokens on a CPU, padded without an attention mask
  elsewhere, nothing read back to the host; tested equal to transformers' pass);
- where a model's weights are and where a config's model jobs run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from latentstrat.batching import to_device
from latentstrat.config import Base, pretrained_source

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _special_ids(tokenizer) -> dict:
    ids = {}
    for key, tok in (("pad_token_id", "<pad>"), ("bos_token_id", "<bos>"), ("eos_token_id", "<eos>")):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if tid is None or tid == getattr(tokenizer, "unk_token_id", None):
            tid = getattr(tokenizer, key)
        ids[key] = tid
    return ids


def embedded_config(embedded_cfg: dict, tokenizer):
    """The embedded default: a small Qwen2 with tied embeddings, vocab from the tokenizer."""
    from transformers import Qwen2Config

    e = embedded_cfg
    if e["hidden_size"] % e["num_attention_heads"]:
        raise ValueError(
            f"config key backbone.embedded.hidden_size ({e['hidden_size']}) must be divisible by num_attention_heads "
            f"({e['num_attention_heads']})"
        )
    if e["num_attention_heads"] % e["num_key_value_heads"]:
        raise ValueError(
            f"config key backbone.embedded.num_attention_heads ({e['num_attention_heads']}) must be divisible by "
            f"num_key_value_heads ({e['num_key_value_heads']})"
        )
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=e["hidden_size"],
        intermediate_size=e["intermediate_size"],
        num_hidden_layers=e["num_hidden_layers"],
        num_attention_heads=e["num_attention_heads"],
        num_key_value_heads=e["num_key_value_heads"],
        max_position_embeddings=e.get("max_position_embeddings", 256),
        tie_word_embeddings=True,
        use_cache=False,
        **_special_ids(tokenizer),
    )


def init_new_token_rows(model, ids: list[int]) -> list[int]:
    """The rows of tokens the data stage added to a pretrained tokenizer (the record markers;
    new rows, or existing rows the pretrained model never trained, e.g. Qwen2.5's padding rows
    beyond its tokenizer) start at the mean of the pretrained rows below them: a neutral token
    the model can read, not a random vector. Input and (if untied) output embeddings alike."""
    ids = sorted(int(i) for i in ids)
    if not ids:
        return ids
    first = ids[0]
    if first == 0:
        raise ValueError("init_new_token_rows: the added tokens must come after the pretrained vocabulary")
    with torch.no_grad():
        mats = [model.get_input_embeddings().weight]
        out = model.get_output_embeddings()
        if out is not None and out.weight.data_ptr() != mats[0].data_ptr():
            mats.append(out.weight)
        for w in mats:
            w[ids] = w[:first].float().mean(0).to(w.dtype)
    return ids


def _from_pretrained(backbone_cfg: dict, dtype, attn: dict):
    """`AutoModelForCausalLM.from_pretrained` of the config's name_or_path and revision; a model
    that cannot be loaded is named with how to go on offline."""
    from transformers import AutoModelForCausalLM

    path, revision = pretrained_source(backbone_cfg)
    try:
        return AutoModelForCausalLM.from_pretrained(path, revision=revision, dtype=dtype, **attn)
    except OSError as e:
        raise OSError(
            f"config key backbone.name_or_path: cannot load the model {path!r} (revision "
            f"{revision or 'default'}): {e}. Offline: point name_or_path at a local directory, or "
            f"fill the hub cache and set HF_HUB_OFFLINE=1"
        ) from None


def build_backbone(backbone_cfg: dict, tokenizer=None, new_token_ids: list[int] | None = None):
    """A causal LM per `backbone_cfg` (the config's `backbone` section), in its dtype.

    embedded: random init from `embedded_config` (seed the global torch RNG before calling);
    pretrained: `AutoModelForCausalLM.from_pretrained(name_or_path)`;
    config_json: random init from a config JSON file (or a directory holding config.json).
    If the tokenizer has more tokens than the model's vocabulary, embeddings are resized;
    `new_token_ids` (data.added_token_ids: the tokens the data stage added to a pretrained
    tokenizer) start at the mean pretrained embedding (`init_new_token_rows`).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    source = backbone_cfg.get("source", "embedded")
    dtype = DTYPES[backbone_cfg.get("dtype", "float32")]
    attn = {"attn_implementation": backbone_cfg.get("attn_implementation", "sdpa")}
    if source == "embedded":
        if tokenizer is None:
            raise ValueError("build_backbone: backbone.source 'embedded' needs the dataset tokenizer")
        model = AutoModelForCausalLM.from_config(embedded_config(backbone_cfg["embedded"], tokenizer), **attn)
    elif source == "pretrained":
        model = _from_pretrained(backbone_cfg, dtype, attn)
    elif source == "config_json":
        path = backbone_cfg.get("name_or_path")
        if not path or not Path(path).exists():
            raise FileNotFoundError(f"config key backbone.name_or_path: config JSON {path!r} does not exist")
        config = AutoConfig.from_pretrained(path)
        config.use_cache = False
        model = AutoModelForCausalLM.from_config(config, **attn)
    else:
        raise ValueError(f"config key backbone.source: unknown source {source!r}")
    if tokenizer is not None and len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    if tokenizer is not None:
        for key, tid in _special_ids(tokenizer).items():
            setattr(model.config, key, tid)
        if source == "pretrained" and new_token_ids:
            init_new_token_rows(model, new_token_ids)
    return model.to(dtype)


def load_entangled(entangle_dir: str | Path, dtype: str | None = None, attn_implementation: str | None = None):
    """The entangled (z-free) model saved by the entangle stage (`<entangle_dir>/model/`, or that
    folder itself) with `AutoModelForCausalLM.from_pretrained`, in `dtype` (default: as saved)
    and with `attn_implementation` (sdpa, flash_attention_2, eager; default: transformers')."""
    from transformers import AutoModelForCausalLM

    d = Path(entangle_dir)
    if (d / "model" / "config.json").exists():
        d = d / "model"
    if not (d / "config.json").exists():
        raise FileNotFoundError(f"entangled model {d} has no config.json (run the entangle stage first)")
    kw = {"dtype": DTYPES[dtype]} if dtype else {}
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    from safetensors import SafetensorError

    try:
        return AutoModelForCausalLM.from_pretrained(d, **kw)
    except (OSError, SafetensorError) as e:  # a truncated or overwritten weights file
        from latentstrat.io import unreadable_message

        raise ValueError(unreadable_message("entangled model", d, f"{type(e).__name__}: {e}")) from None


MODEL_CARD = """\
# {base}: the entangled model of a latentstrat base

A causal LM (transformers `{arch}`, {params:,} parameters) trained on the z-free records of the
base's tasks ({tasks}): p(y | x) over every strategy of each task, the model every cell of a
collection on this base starts from. The tokenizer is the data stage's ({tokenizer}), with the
record markers as single tokens.

    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained("<this folder>")
    model = AutoModelForCausalLM.from_pretrained("<this folder>")

A record reads `<bos> <x> {{x}} </x> <z> [Z] </z> <y> {{y}} </y> <eos>`; the entangled model sees a
neutral `[Z]` slot (no strategy code) and samples a strategy itself. A trained cell's adapters
(`train/adapters/generator`, `train/adapters/posterior`) open on this model with
`peft.PeftModel.from_pretrained` (the project's README, "Open a trained cell").
"""


def write_model_extras(folder: Path, tokenizer, base: Base) -> None:
    """Beside a saved entangled model of `base`: its tokenizer (transformers' files) and a short
    model card (the base's name, its tasks and where its backbone came from), so the folder opens
    with AutoTokenizer and AutoModelForCausalLM alone."""
    import math

    from safetensors import safe_open

    tokenizer.save_pretrained(str(folder))
    if type(tokenizer.backend_tokenizer.model).__name__ == "WordLevel":
        # transformers maps model_type qwen2 to its BPE tokenizer class, which would rebuild this
        # word-level vocabulary as byte-level BPE; naming the generic class in auto_map makes
        # AutoTokenizer load tokenizer.json as it is (tests/test_peft_format.py)
        path = folder / "tokenizer_config.json"
        tc = json.loads(path.read_text())
        tc.update(
            tokenizer_class="PreTrainedTokenizerFast", auto_map={"AutoTokenizer": [None, "PreTrainedTokenizerFast"]}
        )
        path.write_text(json.dumps(tc, indent=2) + "\n")
    c = json.loads((folder / "config.json").read_text())
    n = 0
    for f in sorted(folder.glob("*.safetensors")):  # the header's shapes: no tensor is read
        with safe_open(str(f), framework="pt") as st:
            n += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    card = MODEL_CARD.format(
        base=base.name,
        arch=(c.get("architectures") or ["?"])[0],
        params=n,
        tasks=", ".join(base.data["tasks"]),
        tokenizer="word-level"
        if base.backbone["source"] != "pretrained"
        else f"{base.backbone['name_or_path']}'s, extended",
    )
    (folder / "README.md").write_text(card)


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ----------------------------------------------------------------------------- the fast pass

# how a Qwen2 backbone's trained and no-grad passes run (`hidden_at`): "auto" packs the real
# tokens on a CPU and runs the padded, maskless layout elsewhere; "packed" / "padded" force one;
# "transformers" always runs transformers' own pass with its attention mask (the baseline the
# fast pass is tested equal to, and the benchmarks' "current step")
LAYOUT = "auto"
ATTENTION_GROUPS = 4
# groups are used when they cut the padded attention work (rows x width^2) below this share
GROUPS_WORTH = 0.7


def fast_pass_ok(lm) -> bool:
    """Whether `fast_hidden` computes exactly `lm`'s function on right-padded batches: a Qwen2
    decoder with full causal attention, no attention dropout while training, and no activation
    checkpointing (transformers' own layers recompute; the fast pass does not)."""
    c = lm.config
    if c.model_type != "qwen2" or getattr(c, "use_sliding_window", False):
        return False
    if any(t != "full_attention" for t in getattr(c, "layer_types", None) or []):
        return False
    if lm.training and float(getattr(c, "attention_dropout", 0.0)) > 0:
        return False
    return not getattr(lm, "is_activation_checkpointing", False)


@dataclass
class Layout:
    """How a right-padded batch [B, T] runs through `fast_hidden`, built on the host from its
    row lengths and the positions its caller reads, so the pass itself reads nothing back:

    - `packed`: the N real tokens packed into [N, H] for every per-token layer (norms,
      projections, MLP); attention alone sees a padded layout, one per group of rows of similar
      length (`groups`: indices into the packed tokens, their places in the group's
      [rows, width] layout, rows, width; `order` puts the groups' tokens back);
    - `padded`: every position of [B, T] (static shapes), no attention mask: in a right-padded
      row each real token attends causally to real tokens only, so plain causal attention is
      exact at the real positions; the pads' rows are computed and never read.

    `keep`: the rows (of the N or B x T) the caller reads, in its order; after the last layer's
    attention only they go on through its output projection and MLP."""

    B: int
    T: int
    tokens: torch.Tensor | None  # packed: flat index (row x T + t) of each real token
    positions: torch.Tensor  # the position of each row of x in its sequence
    groups: list | None
    order: torch.Tensor | None
    keep: torch.Tensor | None

    @classmethod
    def build(cls, kind: str, lengths, T: int, read, device, n_groups: int | None = None) -> "Layout":
        """`lengths` [B] (host), `read` = (rows, cols) host arrays of the positions to read, or None."""
        lengths = np.asarray(lengths, dtype=np.int64)
        B = len(lengths)
        if kind == "padded":
            keep = None if read is None else read[0] * T + read[1]
            positions = torch.arange(T, device=device).repeat(B)
            return cls(B, T, None, positions, None, None, None if keep is None else to_device(keep, device))
        starts = np.cumsum(lengths) - lengths
        pos = np.concatenate([np.arange(n) for n in lengths])
        row = np.repeat(np.arange(B), lengths)
        groups, order = _length_groups(lengths, starts, B, T, ATTENTION_GROUPS if n_groups is None else n_groups)
        keep = None if read is None else starts[read[0]] + read[1]
        dev = [to_device(a, device) for a in (row * T + pos, pos)]
        groups = [(None if s is None else to_device(s, device), to_device(d, device), r, w) for s, d, r, w in groups]
        return cls(
            B,
            T,
            dev[0],
            dev[1],
            groups,
            None if order is None else to_device(order, device),
            None if keep is None else to_device(keep, device),
        )


def _length_groups(lengths: np.ndarray, starts: np.ndarray, B: int, T: int, n_groups: int):
    """The rows in up to `n_groups` groups of similar length (sorted by length, equal counts),
    so that attention pads each group to its own longest row instead of the batch's. When
    grouping would leave more than `GROUPS_WORTH` of the padded attention work (similar
    lengths, a small batch): one group, the batch's own [B, T] layout, `order` None."""
    parts = [p for p in np.array_split(np.argsort(lengths, kind="stable"), min(n_groups, B)) if len(p)]
    widths = [int(lengths[p].max()) for p in parts]
    dst_all = np.concatenate([r * T + np.arange(n) for r, n in enumerate(lengths)])
    if len(parts) < 2 or sum(len(p) * w * w for p, w in zip(parts, widths)) > GROUPS_WORTH * B * T * T:
        return [(None, dst_all, B, T)], None
    groups = []
    for part, width in zip(parts, widths):
        sel = np.concatenate([starts[r] + np.arange(lengths[r]) for r in part])
        dst = np.concatenate([k * width + np.arange(lengths[r]) for k, r in enumerate(part)])
        groups.append((sel, dst, len(part), width))
    sels = np.concatenate([g[0] for g in groups])
    order = np.empty_like(sels)
    order[sels] = np.arange(len(sels))
    return groups, order


def _attention(layout: Layout, heads: int, kv_heads: int, head_dim: int, q, k, v, scale):
    """Causal attention of each row's tokens over its own row: [n, h, d] each -> [n, h x d]."""
    if layout.tokens is None:  # padded: the batch's own [B, T]

        def rows(t):
            return t.view(layout.B, layout.T, t.shape[1], head_dim).transpose(1, 2)

        o = nn.functional.scaled_dot_product_attention(
            rows(q), rows(k), rows(v), is_causal=True, scale=scale, enable_gqa=heads != kv_heads
        )
        return o.transpose(1, 2).reshape(layout.B * layout.T, heads * head_dim)
    out = []
    for sel, dst, rows_g, width in layout.groups:

        def padded(t):  # the group's rows, [n_g, h, width, d], zeros at the pads
            return (
                t.new_zeros(rows_g * width, *t.shape[1:])
                .index_copy(0, dst, t if sel is None else t.index_select(0, sel))
                .view(rows_g, width, *t.shape[1:])
                .transpose(1, 2)
            )

        o = nn.functional.scaled_dot_product_attention(
            padded(q), padded(k), padded(v), is_causal=True, scale=scale, enable_gqa=heads != kv_heads
        )
        out.append(o.transpose(1, 2).reshape(rows_g * width, heads * head_dim).index_select(0, dst))
    return out[0] if layout.order is None else torch.cat(out).index_select(0, layout.order)


def _rms_norm(norm, x):
    """A Qwen2 RMSNorm as torch's op (its statistics in float32 under a lower precision, as
    transformers computes them)."""
    return nn.functional.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)


# `train.compile`: each decoder layer of the trained passes in the padded layout runs compiled
# (torch.compile; graphs per adapter and width, reused across layers); the packed layout and the
# no-grad passes run eagerly
COMPILE = False
_COMPILED: list = []


def _compiled_layer():
    if not _COMPILED:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        _COMPILED.append(torch.compile(decoder_layer))
    return _COMPILED[0]


def decoder_layer(layer, x, cos, sin, layout: Layout, dims: tuple, keep=None) -> torch.Tensor:
    """One Qwen2 decoder layer over the rows of x [n, H] (rotary `cos`, `sin` [n, 1, d]); after
    its attention only the rows `keep` go on, when given."""
    from transformers.models.qwen2.modeling_qwen2 import rotate_half

    heads, kv_heads, head_dim = dims
    n, a = x.shape[0], layer.self_attn
    h = _rms_norm(layer.input_layernorm, x)
    qk = torch.cat([a.q_proj(h).view(n, heads, head_dim), a.k_proj(h).view(n, kv_heads, head_dim)], 1)
    q, k = (qk * cos + rotate_half(qk) * sin).split([heads, kv_heads], 1)  # rotary, both at once
    v = a.v_proj(h).view(n, kv_heads, head_dim)
    o = _attention(layout, heads, kv_heads, head_dim, q, k, v, a.scaling)
    if keep is not None:
        x, o = x.index_select(0, keep), o.index_select(0, keep)
    x = x + a.o_proj(o)
    mlp, h = layer.mlp, _rms_norm(layer.post_attention_layernorm, x)
    return x + mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))


def fast_hidden(lm, layout: Layout, input_ids=None, inputs_embeds=None) -> torch.Tensor:
    """A Qwen2 decoder's last hidden states over a right-padded batch laid out by `layout`: at
    the rows `layout.keep` ([K, H], in that order) when it has them, else [B, T, H] (zeros at
    the pads when packed). Every linear layer is called as a module, so a LoRA layer runs the
    adapter its switch names (model.AdapterSwitch). The same function as transformers' padded
    pass up to float rounding at the real positions (tests/test_model.py), without reading
    anything back to the host and, packed, without work on the pads."""
    m = lm.model
    B, T = layout.B, layout.T
    x = m.embed_tokens(input_ids.reshape(-1)) if inputs_embeds is None else inputs_embeds.reshape(B * T, -1)
    if layout.tokens is not None:
        x = x.index_select(0, layout.tokens)
    cos, sin = m.rotary_emb(x, layout.positions[None])
    cos, sin = cos[0, :, None], sin[0, :, None]  # [n, 1, head_dim]
    c = m.config
    dims = (
        c.num_attention_heads,
        c.num_key_value_heads,
        getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
    )
    compiled = COMPILE and layout.tokens is None and torch.is_grad_enabled()  # the trained passes
    run = _compiled_layer() if compiled else decoder_layer
    for i, layer in enumerate(m.layers):
        x = run(layer, x, cos, sin, layout, dims, layout.keep if i == len(m.layers) - 1 else None)
    x = _rms_norm(m.norm, x)
    if layout.keep is not None:
        return x
    if layout.tokens is None:
        return x.view(B, T, -1)
    return x.new_zeros(B * T, x.shape[-1]).index_copy(0, layout.tokens, x).view(B, T, -1)


def hidden_at(lm, mask, lengths, read, input_ids=None, inputs_embeds=None) -> torch.Tensor:
    """Last hidden states of a right-padded batch (`mask` [B, T]; `lengths` its row lengths on
    the host) at the positions `read` = (rows, cols) host arrays, [K, H] in that order; `read`
    None: every position, [B, T, H] (the pads' rows not to be read). The fast pass
    (`fast_hidden`: packed on a CPU, padded and maskless elsewhere; `LAYOUT`) where it is exact
    (`fast_pass_ok`), transformers' own pass with the mask otherwise."""
    kind = LAYOUT if LAYOUT != "auto" else ("packed" if mask.device.type == "cpu" else "padded")
    if kind != "transformers" and fast_pass_ok(lm):
        layout = Layout.build(kind, lengths, mask.shape[1], read, mask.device)
        return fast_hidden(lm, layout, input_ids=input_ids, inputs_embeds=inputs_embeds)
    h = lm.model(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=mask, use_cache=False)
    h = h.last_hidden_state
    if read is None:
        return h
    return h[to_device(read[0], h.device), to_device(read[1], h.device)]


def device_of(model) -> torch.device:
    """Where a model's weights are."""
    return next(model.parameters()).device


def device_for(resources: dict) -> torch.device:
    """The device of a model job given `resources` (the job's: jobs.given_resources): CUDA when
    its `gpu` > 0 and one is present."""
    return torch.device("cuda") if resources["gpu"] > 0 and torch.cuda.is_available() else torch.device("cpu")
