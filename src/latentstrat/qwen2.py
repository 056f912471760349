"""A Qwen2 decoder of our own, for the stages that only run a saved model (reference, the cells'
step0 / train / evaluate jobs): it reads a `save_pretrained` folder (config.json and
safetensors) without importing transformers, whose import costs each model job about 2 s.

Same module names and parameter names as transformers' Qwen2ForCausalLM (`model.layers.0.
self_attn.q_proj`, ...), so the packed pass (`model.packed_hidden`), the LoRA adapters and
the saved cell weights treat both alike, and the same function up to float rounding
(tests/test_qwen2.py compares logits, hidden states and cached decoding with transformers').
`load` takes only what this file implements (`supported`): full causal attention, the default
RoPE, SiLU; anything else loads through transformers (`model.load_entangled`).

Contents, top to bottom: config, the layers (RMSNorm, rotary embedding, attention, MLP), the
decoder and the causal LM, the KV cache, loading.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Qwen2Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    pad_token_id: int | None = None
    model_type: str = "qwen2"
    attention_dropout: float = 0.0
    use_sliding_window: bool = False
    layer_types: list = field(default_factory=list)


def _rope(raw: dict) -> tuple[str, float]:
    """(rope type, theta) from a config.json (transformers 5: rope_parameters; 4: rope_theta and
    rope_scaling)."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return rope_type, float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))


def supported(raw: dict) -> str | None:
    """Why a config.json is not a Qwen2 this file implements, or None."""
    if raw.get("model_type") != "qwen2":
        return f"model_type {raw.get('model_type')!r}"
    if raw.get("use_sliding_window") or any(t != "full_attention" for t in raw.get("layer_types") or []):
        return "sliding-window attention"
    if _rope(raw)[0] != "default":
        return f"RoPE type {_rope(raw)[0]!r}"
    if raw.get("hidden_act", "silu") != "silu":
        return f"activation {raw.get('hidden_act')!r}"
    if float(raw.get("attention_dropout", 0.0)) > 0:
        return "attention dropout"
    return None


def config_from_json(raw: dict) -> Qwen2Config:
    heads = raw["num_attention_heads"]
    return Qwen2Config(
        vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads, rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope(raw)[1], tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        pad_token_id=raw.get("pad_token_id"),
        layer_types=list(raw.get("layer_types") or []))


# ----------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, c: Qwen2Config):
        super().__init__()
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float) / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        """cos, sin [B, T, head_dim] for position ids [B, T], in x's dtype."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: Qwen2Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, cache=None):
        """x [B, T, H]; cos/sin [B, T, d]; mask [B, 1, T, S] (True: attend) or None for plain
        causal attention; cache: the previous tokens' keys and values (appended to)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scaling,
                                           enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, c: Qwen2Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: Qwen2Config, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(c, layer_idx)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


# ----------------------------------------------------------------------------- the model


@dataclass
class Output:
    last_hidden_state: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    cache: "KVCache | None" = None


class Qwen2Model(nn.Module):
    """The decoder: embeddings, layers, final norm."""

    def __init__(self, c: Qwen2Config):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(c)

    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None, position_ids=None, cache=None,
                use_cache: bool = False) -> Output:
        """Last hidden states [B, T, H]. attention_mask [B, S] (1: a real token) covers the cached
        tokens and these; position_ids [B, T] default to 0..T-1 after the cached tokens."""
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T = x.shape[:2]
        past = cache.length if cache is not None else 0
        if use_cache and cache is None:
            cache = KVCache(len(self.layers))
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=x.device)[None].expand(B, T)
        mask = None
        if past > 0 or (attention_mask is not None and not bool(attention_mask.all())):
            keys = attention_mask.bool() if attention_mask is not None else torch.ones(B, past + T, dtype=torch.bool, device=x.device)
            causal = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
            mask = causal[None, None] & keys[:, None, None, :]
            # a padding query with nothing to attend to attends to itself (its output is not read)
            itself = torch.zeros(T, past + T, dtype=torch.bool, device=x.device)
            itself[torch.arange(T), past + torch.arange(T)] = True
            mask = mask | (~mask.any(-1, keepdim=True) & itself)
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache if use_cache else None)
        return Output(last_hidden_state=self.norm(x), cache=cache if use_cache else None)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, c: Qwen2Config):
        super().__init__()
        self.config = c
        self.model = Qwen2Model(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def get_decoder(self):
        return self.model

    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None, position_ids=None, cache=None,
                use_cache: bool = False, logits_to_keep: int = 0) -> Output:
        out = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                         position_ids=position_ids, cache=cache, use_cache=use_cache)
        h = out.last_hidden_state if logits_to_keep == 0 else out.last_hidden_state[:, -logits_to_keep:]
        return Output(logits=self.lm_head(h), cache=out.cache)


class KVCache:
    """Per layer, the keys and values [B, kv_heads, S, d] of the tokens seen so far."""

    def __init__(self, n_layers: int):
        self.k: list = [None] * n_layers
        self.v: list = [None] * n_layers

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def update(self, layer: int, k, v):
        if self.k[layer] is not None:
            k, v = torch.cat([self.k[layer], k], 2), torch.cat([self.v[layer], v], 2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    def batch_select_indices(self, keep):
        self.k = [t[keep] for t in self.k]
        self.v = [t[keep] for t in self.v]


# ----------------------------------------------------------------------------- loading


def read_config(folder: str | Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def load(folder: str | Path, dtype: torch.dtype | None = None) -> Qwen2ForCausalLM:
    """The causal LM saved in `folder` (config.json + model.safetensors, or shards listed in
    model.safetensors.index.json), in `dtype` (default: the saved one). Every weight must be
    there and nothing else: an error names the file and the keys."""
    from safetensors.torch import load_file

    folder = Path(folder)
    raw = read_config(folder)
    why = supported(raw)
    if why:
        raise ValueError(f"{folder / 'config.json'}: not a Qwen2 this loader implements ({why})")
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    state = {}
    for f in files:
        state.update(load_file(str(folder / f)))
    with torch.random.fork_rng(devices=[]):  # the throwaway initialization leaves the caller's RNG alone
        lm = Qwen2ForCausalLM(config_from_json(raw))
    expected = {n for n, _ in lm.named_parameters()}  # tied lm_head appears once, as the embedding
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected - {"lm_head.weight"})
    if missing or extra:
        raise ValueError(f"{folder}: the weights do not match its config.json (missing {missing[:5]}, unexpected {extra[:5]})")
    dtype = dtype or next(iter(state.values())).dtype
    lm.load_state_dict({n: state[n].to(dtype) for n in expected}, strict=False, assign=True)
    if lm.config.tie_word_embeddings:  # assign replaced the embedding's parameter
        lm.lm_head.weight = lm.model.embed_tokens.weight
    return lm.eval()
