"""Backbones: the causal LMs every model of latentstrat runs on (transformers' own).

- `build_backbone`: the embedded small Qwen2 (from a `Qwen2Config`, tied embeddings), any
  hub/local model via `from_pretrained`, or random init from a config JSON;
- `load_entangled`: the entangle stage's model (`AutoModelForCausalLM.from_pretrained`, with
  the config's `backbone.attn_implementation`); `write_model_extras` puts its tokenizer and a
  model card beside it, so the folder opens with AutoTokenizer / AutoModelForCausalLM alone;
- `packed_hidden`: the CPU fast path of a Qwen2 decoder's pass over a right-padded batch
  (every per-token layer over the real tokens only; tested equal to transformers' pass);
- where a model's weights are and where a config's model jobs run.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn

from latentstrat.config import pretrained_source

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


def write_model_extras(folder: Path, tokenizer, cfg: dict) -> None:
    """Beside a saved entangled model: its tokenizer (transformers' files) and a short model
    card, so the folder opens with AutoTokenizer and AutoModelForCausalLM alone."""
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
        base=cfg["base"],
        arch=(c.get("architectures") or ["?"])[0],
        params=n,
        tasks=", ".join(cfg["data"]["tasks"]),
        tokenizer="word-level"
        if cfg["backbone"]["source"] != "pretrained"
        else f"{cfg['backbone']['name_or_path']}'s, extended",
    )
    (folder / "README.md").write_text(card)


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def packable(lm, mask) -> bool:
    """Whether `packed_hidden` computes exactly `lm`'s function on this batch: a CPU batch (on a
    GPU transformers' own attention path runs), a Qwen2 decoder (full causal attention, no
    attention dropout while training) and a right-padded mask."""
    if mask.device.type != "cpu":
        return False
    c = lm.config
    if c.model_type != "qwen2" or getattr(c, "use_sliding_window", False):
        return False
    if any(t != "full_attention" for t in getattr(c, "layer_types", None) or []):
        return False
    if lm.training and float(getattr(c, "attention_dropout", 0.0)) > 0:
        return False
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


# the packed pass's fused LoRA linear (FUSED_LORA False: peft's own forward, the benchmark's
# baseline)
FUSED_LORA = True


def _plain_lora(module):
    """(base weight, bias, A, s B) of a peft LoRA Linear with one vanilla adapter active, or None
    when peft's own forward must run (no LoRA, merged, disabled, dropout, a variant such as DoRA,
    several active adapters)."""
    if not FUSED_LORA or not hasattr(module, "lora_A") or module.disable_adapters or module.merged:
        return None
    active = [n for n in module.active_adapters if n in module.lora_A]
    if len(active) != 1 or active[0] in getattr(module, "lora_variant", {}):
        return None
    name = active[0]
    if not isinstance(module.lora_dropout[name], nn.Identity):
        return None
    base = module.base_layer
    if not isinstance(base, nn.Linear) or base.weight.dtype != module.lora_A[name].weight.dtype:
        return None  # peft casts between a lower-precision backbone and float32 adapters
    return base.weight, base.bias, module.lora_A[name].weight, module.lora_B[name].weight, module.scaling[name]


def linear(module, x):
    """`module(x)` for a linear layer; for a peft LoRA layer with one plain adapter active,
    W x + b + s B A x as one matmul plus one accumulating matmul (torch.addmm), without peft's
    three full-width temporaries (B A x, its scaled copy, the sum)."""
    lora = _plain_lora(module)
    if lora is None:
        return module(x)
    w, bias, a, b, s = lora
    base = nn.functional.linear(x, w, bias)
    return torch.addmm(base, nn.functional.linear(x, a), b.t(), alpha=s)


def mlp(module, x):
    """A Qwen2 MLP (down(act(gate x) * up x)) through `linear`."""
    return linear(module.down_proj, module.act_fn(linear(module.gate_proj, x)) * linear(module.up_proj, x))


ATTENTION_GROUPS = 4
# groups are used when they cut the padded attention work (rows x width^2) below this share
GROUPS_WORTH = 0.7


def length_groups(mask, n_groups: int | None = None):
    """The rows of a right-padded batch in up to `n_groups` groups of similar length (sorted by
    length, equal counts), so that attention pads each group to its own longest row instead of
    the batch's. Per group: (its tokens' indices in the packed order, their places in the group's
    [rows, width] layout, rows, width); and `order`, which maps the groups' concatenated tokens
    back to the packed order. When grouping would leave more than `GROUPS_WORTH` of the padded
    attention work (similar lengths, a small batch): one group, the batch's own [B, T] layout
    (indices None: the packed order itself), `order` None."""
    n_groups = ATTENTION_GROUPS if n_groups is None else n_groups
    lengths = mask.sum(1)
    B, T = mask.shape
    parts = [p for p in torch.tensor_split(torch.argsort(lengths, stable=True), min(n_groups, B)) if p.numel()]
    widths = [int(lengths[p].max()) for p in parts]
    if len(parts) < 2 or sum(p.numel() * w * w for p, w in zip(parts, widths)) > GROUPS_WORTH * B * T * T:
        return [(None, mask.reshape(-1).nonzero().squeeze(1), B, T)], None
    starts = torch.cumsum(lengths, 0) - lengths
    groups = []
    for part, width in zip(parts, widths):
        t = torch.arange(width, device=mask.device)
        inside = t[None, :] < lengths[part][:, None]  # [n_g, width]
        sel = (starts[part][:, None] + t[None, :])[inside]
        dst = (torch.arange(part.numel(), device=mask.device)[:, None] * width + t[None, :])[inside]
        groups.append((sel, dst, part.numel(), width))
    sels = torch.cat([g[0] for g in groups])
    order = torch.empty_like(sels).scatter_(0, sels, torch.arange(sels.numel(), device=mask.device))
    return groups, order


def packed_hidden(lm, input_ids=None, inputs_embeds=None, mask=None, read=None) -> torch.Tensor:
    """A Qwen2 decoder's last hidden states [B, T, H] for a right-padded batch, with every
    per-token layer (norms, projections with their LoRA adapters through `linear`, MLP) run once
    over the N real tokens packed into [N, H]. Only attention sees a padded layout, one per group
    of rows of similar length (`length_groups`): each row's real tokens sit at positions 0..L-1
    and attend causally to their own row only, so plain causal attention is exact and the pads
    (zeros) are never read. `read` ([B, T] bool, optional): the positions the caller reads; after
    the last layer's attention only they go on through its output projection and MLP, and every
    other position reads zero. The same function as transformers' padded pass up to float
    rounding at the positions read (tests/test_model.py), without its work on the pads: a
    task-mixed batch of short and long tasks is mostly padding."""
    from transformers.models.qwen2.modeling_qwen2 import rotate_half

    m = lm.model
    B, T = mask.shape
    flat = mask.reshape(-1).nonzero().squeeze(1)  # the real tokens, row-major
    x = m.embed_tokens(input_ids.reshape(-1)[flat]) if inputs_embeds is None else inputs_embeds.reshape(B * T, -1)[flat]
    n = x.shape[0]
    cos, sin = m.rotary_emb(x, torch.arange(T, device=mask.device).repeat(B)[flat][None])
    cos, sin = cos[0, :, None], sin[0, :, None]  # [N, 1, head_dim]
    c = m.config
    heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads

    groups, order = length_groups(mask)

    def attention(q, k, v, scale):  # [N, h, d] each -> [N, h * d], causal within each row
        out = []
        for sel, dst, rows_g, width in groups:

            def padded(t):  # the group's rows, [n_g, h, width, d], zeros at the pads
                return (
                    t.new_zeros(rows_g * width, *t.shape[1:])
                    .index_copy(0, dst, t if sel is None else t[sel])
                    .view(rows_g, width, *t.shape[1:])
                    .transpose(1, 2)
                )

            o = nn.functional.scaled_dot_product_attention(
                padded(q), padded(k), padded(v), is_causal=True, scale=scale, enable_gqa=heads != kv_heads
            )
            out.append(o.transpose(1, 2).reshape(rows_g * width, heads * head_dim)[dst])
        return out[0] if order is None else torch.cat(out).index_select(0, order)

    # the rows the caller reads: after the last layer's attention only they go on
    keep = None if read is None else read.reshape(-1)[flat].nonzero().squeeze(1)
    rows = flat
    for i, layer in enumerate(m.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = linear(a.q_proj, h).view(n, heads, head_dim)
        k = linear(a.k_proj, h).view(n, kv_heads, head_dim)
        v = linear(a.v_proj, h).view(n, kv_heads, head_dim)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        o = attention(q, k, v, a.scaling)
        if keep is not None and i == len(m.layers) - 1:
            x, o, rows = x[keep], o[keep], flat[keep]
        x = x + linear(a.o_proj, o)
        x = x + mlp(layer.mlp, layer.post_attention_layernorm(x))
    x = m.norm(x)
    return x.new_zeros(B * T, x.shape[-1]).index_copy(0, rows, x).view(B, T, -1)


def device_of(model) -> torch.device:
    """Where a model's weights are."""
    return next(model.parameters()).device


def device_for(cfg: dict) -> torch.device:
    """The device of a config's model jobs: CUDA when `resources.gpu` > 0 and one is present."""
    return torch.device("cuda") if cfg["resources"]["gpu"] > 0 and torch.cuda.is_available() else torch.device("cpu")
