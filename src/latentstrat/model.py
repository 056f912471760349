"""Backbones and the latent strategy model (design section 3, docs/design.md).

A backbone is a transformers causal LM: the embedded small Qwen2 (built from a `Qwen2Config`,
tied embeddings), any hub/local model via `from_pretrained`, or random init from a config JSON.
A saved Qwen2 (the entangled model the cells start from) loads as our own `qwen2` module: the
same function and parameter names, without importing transformers (`load_entangled`).

`LatentStrategyModel` wraps one backbone with
- a router head on the hidden state at `<z>` -> (mu_r, logvar_r),
- a posterior head on the last non-pad token of the posterior input -> (mu_q, logvar_q),
- a z projection: z -> P slot embeddings written into the `[Z]` positions (added to the
  `[Z]` token embedding), so the generator pass conditions on z. It starts at zero, and the
  adapters start as the identity (LoRA's B = 0; `full` copies the backbone), so at step 0 the
  generator computes exactly the backbone's p(y|x) on the record with a neutral slot: the
  entangled model's, since it trains on that record (docs/design.md, "Initialization").
  z can then only add information.
and two "adapters":
- `lora`: two LoRA adapters (`LoraLinear`: "generator" = router+generator, "posterior") over one frozen
  base; only adapters and heads train.
- `full`: two trainable copies of the backbone (generator copy, posterior copy). Chosen over one
  shared trainable base so `full` keeps the two-adapter semantics (the posterior's weights never
  see the generator's gradients and vice versa); memory is 2x the backbone.
- `frozen`: one frozen backbone, heads only.
"""
from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import torch
import torch.nn as nn

from latentstrat.config import pretrained_source

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ADAPTERS = ("generator", "posterior")
# the cells' passes run packed (`packed_hidden`) where the backbone allows it; False: always
# transformers' padded pass (the benchmark's baseline)
PACKED = True


# ----------------------------------------------------------------------------- backbones


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
        raise ValueError(f"config key backbone.embedded.hidden_size ({e['hidden_size']}) must be divisible by num_attention_heads ({e['num_attention_heads']})")
    if e["num_attention_heads"] % e["num_key_value_heads"]:
        raise ValueError(f"config key backbone.embedded.num_attention_heads ({e['num_attention_heads']}) must be divisible by num_key_value_heads ({e['num_key_value_heads']})")
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
    if source == "embedded":
        if tokenizer is None:
            raise ValueError("build_backbone: backbone.source 'embedded' needs the dataset tokenizer")
        model = AutoModelForCausalLM.from_config(embedded_config(backbone_cfg["embedded"], tokenizer))
    elif source == "pretrained":
        path, revision = pretrained_source(backbone_cfg)
        try:
            model = AutoModelForCausalLM.from_pretrained(path, revision=revision, dtype=dtype)
        except OSError as e:
            raise OSError(f"config key backbone.name_or_path: cannot load the model {path!r} (revision "
                          f"{revision or 'default'}): {e}. Offline: point name_or_path at a local directory, or "
                          f"fill the hub cache and set HF_HUB_OFFLINE=1") from None
    elif source == "config_json":
        path = backbone_cfg.get("name_or_path")
        if not path or not Path(path).exists():
            raise FileNotFoundError(f"config key backbone.name_or_path: config JSON {path!r} does not exist")
        config = AutoConfig.from_pretrained(path)
        config.use_cache = False
        model = AutoModelForCausalLM.from_config(config)
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


def load_entangled(entangle_dir: str | Path, dtype: str | None = None):
    """The entangled (z-free) model saved by the entangle stage: `<entangle_dir>/model/`.

    Accepts the stage directory or the `model/` directory itself. A Qwen2 loads as our own
    `qwen2.Qwen2ForCausalLM` (the same function, without importing transformers), any other
    architecture through transformers.
    """
    from latentstrat import qwen2

    d = Path(entangle_dir)
    if (d / "model" / "config.json").exists():
        d = d / "model"
    if not (d / "config.json").exists():
        raise FileNotFoundError(f"entangled model {d} has no config.json (run the entangle stage first)")
    if qwen2.supported(qwen2.read_config(d)) is None:
        return qwen2.load(d, DTYPES[dtype] if dtype else None)
    from transformers import AutoModelForCausalLM

    kw = {"dtype": DTYPES[dtype]} if dtype else {}
    return AutoModelForCausalLM.from_pretrained(d, **kw)


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ----------------------------------------------------------------------------- the packed pass


def packable(lm, mask) -> bool:
    """Whether `packed_hidden` computes exactly `lm`'s function on this batch: a Qwen2 decoder
    (full causal attention, no attention dropout while training) and a right-padded mask."""
    c = lm.config
    if c.model_type != "qwen2" or getattr(c, "use_sliding_window", False):
        return False
    if any(t != "full_attention" for t in getattr(c, "layer_types", None) or []):
        return False
    if lm.training and float(getattr(c, "attention_dropout", 0.0)) > 0:
        return False
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


def packed_hidden(lm, input_ids=None, inputs_embeds=None, mask=None) -> torch.Tensor:
    """A Qwen2 decoder's last hidden states [B, T, H] for a right-padded batch, with every
    per-token layer (norms, projections with their LoRA adapters, MLP) run once over the N real
    tokens packed into [N, H]; only attention sees the padded [B, T] layout. A right-padded
    row's real tokens sit at positions 0..L-1 and attend causally to real tokens only, so plain
    causal attention is exact and the pads (zeros here) are never read. The same function as
    transformers' padded pass up to float rounding (tests/test_model.py), without its work on
    the pads: a task-mixed batch of short and long tasks is mostly padding."""
    from latentstrat.qwen2 import rotate_half

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

    def padded(t):  # [N, h, d] -> [B, h, T, d], zeros at the pads
        return t.new_zeros(B * T, *t.shape[1:]).index_copy(0, flat, t).view(B, T, *t.shape[1:]).transpose(1, 2)

    for layer in m.layers:
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(n, heads, head_dim)
        k = a.k_proj(h).view(n, kv_heads, head_dim)
        v = a.v_proj(h).view(n, kv_heads, head_dim)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        o = nn.functional.scaled_dot_product_attention(padded(q), padded(k), padded(v), is_causal=True,
                                                       scale=a.scaling, enable_gqa=heads != kv_heads)
        x = x + a.o_proj(o.transpose(1, 2).reshape(B * T, heads * head_dim)[flat])
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = m.norm(x)
    return x.new_zeros(B * T, x.shape[-1]).index_copy(0, flat, x).view(B, T, -1)


# ----------------------------------------------------------------------------- latent model


class GaussianHead(nn.Module):
    """hidden [B, H] -> (mu, logvar) [B, D], in float32."""

    def __init__(self, hidden: int, latent_dim: int):
        super().__init__()
        self.proj = nn.Linear(hidden, 2 * latent_dim)
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)

    def forward(self, h):
        mu, logvar = self.proj(h.float()).chunk(2, dim=-1)
        return mu, logvar


# ----------------------------------------------------------------------------- LoRA


class LoraLinear(nn.Module):
    """A frozen linear layer (`base_layer`) plus named low-rank adapters: y = W x + s B A x for
    the active adapter (`state.active`, shared by every layer of one model), s = alpha / r
    (with dropout on x in training when lora.dropout > 0). A
    starts like a linear layer's weight (Kaiming uniform), B at zero: a new adapter is the
    identity. The adapters stay float32 under a lower-precision base."""

    def __init__(self, base: nn.Linear, state: "_Active", dropout: float = 0.0):
        super().__init__()
        self.base_layer = base
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_A, self.lora_B = nn.ModuleDict(), nn.ModuleDict()
        self.scaling: dict[str, float] = {}
        self.state = state

    def add_adapter(self, name: str, r: int, alpha: float) -> None:
        self.lora_A[name] = nn.Linear(self.base_layer.in_features, r, bias=False)
        self.lora_B[name] = nn.Linear(r, self.base_layer.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A[name].weight, a=5 ** 0.5)
        nn.init.zeros_(self.lora_B[name].weight)
        self.scaling[name] = alpha / r

    def forward(self, x):
        y = self.base_layer(x)
        name = self.state.active
        if name not in self.lora_A:
            return y
        a, b = self.lora_A[name], self.lora_B[name]
        return (y + b(a(self.lora_dropout(x.to(a.weight.dtype)))) * self.scaling[name]).to(y.dtype)

    def delta(self, name: str) -> torch.Tensor:
        """Adapter `name` as a change of the base weight: s B A."""
        return (self.lora_B[name].weight @ self.lora_A[name].weight) * self.scaling[name]


class _Active:
    """Which adapter a model's LoRA layers apply (one object shared by all of them)."""

    def __init__(self, name: str):
        self.active = name


def lora_targets(lm, target_modules) -> list[str]:
    """Names of the linear layers that get adapters: every one but the output projection
    ("all-linear"), or those whose last name part is listed."""
    out_proj = lm.get_output_embeddings()
    names = []
    for n, mod in lm.named_modules():
        if not isinstance(mod, nn.Linear) or mod is out_proj:
            continue
        if target_modules == "all-linear" or n.rsplit(".", 1)[-1] in target_modules:
            names.append(n)
    if not names:
        raise ValueError(f"config key lora.target_modules: {target_modules!r} matches no linear layer of the backbone")
    return names


def add_lora(lm, lora_cfg: dict | None, adapters=ADAPTERS) -> _Active:
    """Wrap the backbone's target linear layers (`lora_targets`) in LoraLinear with `adapters`
    (r, alpha from lora_cfg), in place; returns the shared active-adapter switch."""
    c = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear", **(lora_cfg or {})}
    state = _Active(adapters[0])
    layers = []
    for n in lora_targets(lm, c["target_modules"]):
        parent, _, child = n.rpartition(".")
        holder = lm.get_submodule(parent) if parent else lm
        layer = LoraLinear(getattr(holder, child), state, float(c["dropout"]))
        setattr(holder, child, layer)
        layers.append(layer)
    for name in adapters:  # one adapter over every layer, then the next
        for layer in layers:
            layer.add_adapter(name, int(c["r"]), float(c["alpha"]))
    return state


def merged_copy(lm, name: str):
    """A copy of a LoRA backbone with plain linear layers, adapter `name` folded in."""
    out = copy.deepcopy(lm)
    with torch.no_grad():
        for n, mod in list(out.named_modules()):
            if isinstance(mod, LoraLinear):
                base = mod.base_layer  # the copy's own weights: W + s B A folded in place
                base.weight += mod.delta(name).to(base.weight.dtype)
                parent, _, child = n.rpartition(".")
                setattr(out.get_submodule(parent) if parent else out, child, base)
    return out.eval()


class LatentStrategyModel(nn.Module):
    def __init__(self, backbone, latent_dim: int, z_slots: int = 1, adaptation: str = "lora",
                 lora_cfg: dict | None = None):
        super().__init__()
        if adaptation not in ("lora", "full", "frozen"):
            raise ValueError(f"cell setting adaptation: unknown adaptation {adaptation!r} (lora, full, frozen)")
        self.adaptation = adaptation
        self.latent_dim = latent_dim
        self.z_slots = z_slots
        self.hidden = backbone.config.hidden_size
        self.dtype_ = next(backbone.parameters()).dtype
        for p in backbone.parameters():
            p.requires_grad_(False)
        if adaptation == "lora":
            self.lora = add_lora(backbone, lora_cfg)  # adapters "generator" and "posterior"
            self.lm = self.lm_post = backbone
        elif adaptation == "full":
            self.lm = backbone
            self.lm_post = copy.deepcopy(backbone)
            for p in list(self.lm.parameters()) + list(self.lm_post.parameters()):
                p.requires_grad_(True)
        else:
            self.lm = self.lm_post = backbone
        self.router_head = GaussianHead(self.hidden, latent_dim)
        self.posterior_head = GaussianHead(self.hidden, latent_dim)
        self.z_proj = nn.Linear(latent_dim, z_slots * self.hidden)
        nn.init.zeros_(self.z_proj.weight)  # the initialization invariant: z adds nothing at step 0
        nn.init.zeros_(self.z_proj.bias)
        self._active = "generator"
        self._merged = False
        self._trainable = self._trainable_names()
        params = dict(self.named_parameters())
        self._trainable_params = [params[n] for n in self._trainable]
        for p in self._trainable_params:
            p.requires_grad_(True)

    # -------------------------------------------------------------- adapters

    def _trainable_names(self) -> list[str]:
        heads = ("router_head.", "posterior_head.", "z_proj.")
        names = []
        for n, p in self.named_parameters():  # tied weights appear once
            if n.startswith(heads):
                names.append(n)
            elif self.adaptation == "lora" and ".lora_" in n:
                names.append(n)
            elif self.adaptation == "full" and n.startswith(("lm.", "lm_post.")):
                names.append(n)
        return names

    def _set_active(self, name: str) -> None:
        if name not in ADAPTERS:
            raise ValueError(f"unknown adapter {name!r} (expected one of {ADAPTERS})")
        if self.adaptation == "lora" and not self._merged:
            self.lora.active = name
        self._active = name

    @contextlib.contextmanager
    def adapter(self, name: str):
        prev = self._active
        self._set_active(name)
        try:
            yield
        finally:
            self._set_active(prev)

    @contextlib.contextmanager
    def merged(self):
        """No-grad passes (validation, evaluation, decoding) on two plain copies of the backbone,
        each with one adapter folded into its weights (W + scale B A): the same
        function as the LoRA passes up to float rounding, and exactly the same while B = 0
        (step 0), without each linear layer's two extra small matmuls (1.3x on a validation pass
        on CPU, `python -m latentstrat.bench train`). The copies live for the `with` block (2x
        the backbone's memory meanwhile). `full` and `frozen` models run as they are."""
        if self.adaptation != "lora":
            yield
            return
        if torch.is_grad_enabled():
            raise RuntimeError("LatentStrategyModel.merged() is for no-grad passes (use torch.no_grad())")
        saved = self.lm, self.lm_post
        try:
            self.lm, self.lm_post = self._merged_copy("generator"), self._merged_copy("posterior")
            self._merged = True
            yield
        finally:  # the LoRA model was never touched (_set_active leaves it alone meanwhile)
            self.lm, self.lm_post = saved
            self._merged = False

    def _merged_copy(self, name: str):
        return merged_copy(self.lm, name)

    # -------------------------------------------------------------- passes

    def _hidden(self, lm, input_ids=None, inputs_embeds=None, mask=None):
        """Last hidden states [B, T, H] of a right-padded batch (the pads' rows are not to be
        read): the packed pass for a Qwen2 backbone (`packed_hidden`), transformers' own padded
        pass otherwise."""
        if PACKED and packable(lm, mask):
            return packed_hidden(lm, input_ids=input_ids, inputs_embeds=inputs_embeds, mask=mask)
        return lm.model(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=mask,
                        use_cache=False).last_hidden_state

    def posterior(self, post_ids, post_mask):
        """q(z|x,y): last-token pooling of the posterior adapter's pass -> (mu_q, logvar_q)."""
        with self.adapter("posterior"):
            h = self._hidden(self.lm_post, input_ids=post_ids, mask=post_mask)
        last = post_mask.long().sum(1) - 1
        pooled = h[torch.arange(h.shape[0], device=h.device), last]
        return self.posterior_head(pooled)

    def router_prefix(self, ids, mask, z_open_pos):
        """p(z|x) from the `<z>` hidden state; only the prefix up to `<z>` is run."""
        T = int(z_open_pos.max()) + 1
        with self.adapter("generator"):
            h = self._hidden(self.lm, input_ids=ids[:, :T], mask=mask[:, :T])
        return self.router_head(h[torch.arange(h.shape[0], device=h.device), z_open_pos])

    def slot_embeddings(self, z):
        """z [B, D] -> [B, P, H] added to the `[Z]` token embedding at the slot positions."""
        return self.z_proj(z.float()).view(z.shape[0], self.z_slots, self.hidden)

    def embed_with_z(self, ids, z, z_slot_pos):
        emb = self.lm.get_input_embeddings()(ids)
        rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(z_slot_pos)
        slots = emb[rows, z_slot_pos] + self.slot_embeddings(z).to(emb.dtype)
        emb = emb.index_put((rows, z_slot_pos), slots)  # out of place: keeps autograd simple
        return emb

    def generator(self, gen_ids, gen_mask, z, z_open_pos, z_slot_pos, sup_pos=None):
        """One pass: router from the `<z>` hidden state (it has seen x only), generator logits
        with z written into the slots. Logits are [B, T, V], or [B, L, V] at `sup_pos` only
        (positions whose next token is supervised: cheaper for large vocabularies)."""
        with self.adapter("generator"):
            h = self._hidden(self.lm, inputs_embeds=self.embed_with_z(gen_ids, z, z_slot_pos), mask=gen_mask)
            rows = torch.arange(h.shape[0], device=h.device)
            mu_r, logvar_r = self.router_head(h[rows, z_open_pos])
            if sup_pos is not None:
                h = h[rows[:, None], sup_pos]
            logits = self.lm.lm_head(h)
        return logits, mu_r, logvar_r

    # -------------------------------------------------------------- weights

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self._trainable_params)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        params = dict(self.named_parameters())
        return {n: params[n].detach().contiguous() for n in self._trainable}

    def save_trainable(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        from latentstrat.io import atomic_path

        sd = {n: t.cpu().clone() for n, t in self.trainable_state_dict().items()}
        with atomic_path(path, suffix=".safetensors") as tmp:
            save_file(sd, str(tmp), metadata={"adaptation": self.adaptation, "latent_dim": str(self.latent_dim),
                                              "z_slots": str(self.z_slots)})

    def load_trainable(self, path_or_state) -> None:
        """Load adapters + heads (lora), everything (full) or heads (frozen). Strict on names."""
        if isinstance(path_or_state, (str, Path)):
            from safetensors.torch import load_file

            if not Path(path_or_state).exists():
                raise FileNotFoundError(f"trained weights {path_or_state} do not exist")
            try:
                state = load_file(str(path_or_state))
            except Exception as e:  # noqa: BLE001 - truncated, random bytes, not safetensors
                from latentstrat.io import unreadable_message

                raise ValueError(unreadable_message("trained weights", path_or_state, f"{type(e).__name__}: {e}")) from None
            where = str(path_or_state)
        else:
            state, where = path_or_state, "state dict"
        # cells trained while the adapters were peft's name them under peft's wrapper
        state = {("lm." + n[len("peft.base_model.model."):]) if n.startswith("peft.base_model.model.") else n: t
                 for n, t in state.items()}
        missing = sorted(set(self._trainable) - set(state))
        extra = sorted(set(state) - set(self._trainable))
        if missing or extra:
            raise ValueError(f"{where} does not match this model ({self.adaptation}): missing {missing[:5]}, unexpected {extra[:5]}")
        params = dict(self.named_parameters())
        with torch.no_grad():
            for n, t in state.items():
                if params[n].shape != t.shape:
                    raise ValueError(f"{where}: {n} has shape {tuple(t.shape)}, model has {tuple(params[n].shape)}")
                params[n].copy_(t.to(params[n].dtype))


# ----------------------------------------------------------------------------- a cell's model


def build_model(cfg: dict, cell: dict, tokenizer, entangle_dir, new_token_ids=()) -> LatentStrategyModel:
    """Backbone per `init` (entangled: the entangle stage's model; direct: from the config, with
    the tokens the data stage added, `data.added_token_ids`, at the mean embedding), wrapped
    with the cell's latent settings. Seeded: the same cell builds the same model."""
    torch.manual_seed(int(cell["seed"]))
    if cell["init"] == "entangled":
        backbone = load_entangled(entangle_dir, dtype=cfg["backbone"]["dtype"])
    else:
        backbone = build_backbone(cfg["backbone"], tokenizer, list(new_token_ids))
    return LatentStrategyModel(backbone, int(cell["latent_dim"]), int(cell["z_slots"]), cell["adaptation"], cfg["lora"])


def device_of(model) -> torch.device:
    """Where a model's weights are."""
    return next(model.parameters()).device


def device_for(cfg: dict) -> torch.device:
    """The device of a config's model jobs: CUDA when `resources.gpu` > 0 and one is present."""
    return torch.device("cuda") if cfg["resources"]["gpu"] > 0 and torch.cuda.is_available() else torch.device("cpu")
