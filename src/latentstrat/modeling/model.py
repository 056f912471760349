"""The latent strategy model (design section 3, docs/design.md).

`LatentStrategyModel` wraps one backbone (latentstrat.modeling.backbone: a transformers causal LM) with
- a router head on the hidden state at `<z>` -> (mu_r, logvar_r),
- a posterior head on the last non-pad token of the posterior input -> (mu_q, logvar_q),
- a z projection: z -> P slot embeddings written into the `[Z]` positions (added to the
  `[Z]` token embedding), so the generator pass conditions on z. It starts at zero, and the
  adapters start as the identity (LoRA's B = 0; `full` copies the backbone), so at step 0 the
  generator computes exactly the backbone's p(y|x) on the record with a neutral slot: the
  entangled model's, since it trains on that record (docs/design.md, "Initialization").
  z can then only add information.
and one of three adaptations:
- `lora`: two peft LoRA adapters over one frozen backbone, "generator" (router + generator) and
  "posterior"; only the adapters and the heads train. A trained cell saves them in peft's own
  format (`save_trained`): `adapters/generator/` and `adapters/posterior/` open with
  `PeftModel.from_pretrained` on the entangled model.
- `full`: two trainable copies of the backbone (generator copy, posterior copy), so `full` keeps
  the two-adapter semantics (the posterior's weights never see the generator's gradients and
  vice versa); memory is 2x the backbone.
- `frozen`: one frozen backbone, heads only.
"""

from __future__ import annotations

import contextlib
import copy
import json
import types
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from latentstrat.batching import HostRows, host_array
from latentstrat.cells import cell_training_seed
from latentstrat.modeling.backbone import build_backbone, hidden_at, load_entangled

ADAPTERS = ("generator", "posterior")
# the parameters new to the latent model (not in the causal LM): its heads and the z projection
HEAD_PREFIXES = ("router_head.", "posterior_head.", "z_proj.")
# a trained cell's folder (save_trained / load_trained): peft adapters, full copies, the heads
ADAPTERS_DIR, BACKBONES_DIR, HEADS_DIR = "adapters", "backbones", "heads"
HEADS_WEIGHTS, HEADS_CONFIG = "heads.safetensors", "config.json"


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


# ----------------------------------------------------------------------------- LoRA (peft)


def lora_config(lora_cfg: dict | None, base_model_name_or_path: str | None = None):
    """peft's LoraConfig for the config's `lora` section: r, alpha, dropout, target modules
    ("all-linear": every linear layer but the output projection, or the listed names)."""
    from peft import LoraConfig

    c = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear", **(lora_cfg or {})}
    targets = c["target_modules"] if c["target_modules"] == "all-linear" else list(c["target_modules"])
    return LoraConfig(
        r=int(c["r"]),
        lora_alpha=float(c["alpha"]),
        lora_dropout=float(c["dropout"]),
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model_name_or_path,
    )


def add_lora(backbone, lora_cfg: dict | None, adapters=ADAPTERS):
    """The backbone as a peft model with one LoRA adapter per name in `adapters` (A Kaiming
    uniform, B zero: each starts as the identity), in the backbone's dtype: under a bf16
    backbone the adapters run in bf16 (no activation cast around them) and train through
    float32 master copies (modeling.optim.CellOptimizer)."""
    from peft import get_peft_model

    first = lora_config(lora_cfg, getattr(backbone, "name_or_path", None) or None)
    try:
        with warnings.catch_warnings():  # peft asks transformers a question transformers 5 renamed
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(backbone, first, adapter_name=adapters[0], autocast_adapter_dtype=False)
    except ValueError as e:
        raise ValueError(
            f"config key lora.target_modules: {first.target_modules!r} does not fit the backbone: {e}"
        ) from None
    for name in adapters[1:]:
        peft_model.add_adapter(name, lora_config(lora_cfg, first.base_model_name_or_path), autocast_adapter_dtype=False)
    return peft_model


def merged_copy(peft_model, name: str):
    """A plain transformers model: a copy of the peft model's backbone with adapter `name`
    folded into its weights (peft's merge_and_unload; W + scale B A)."""
    return copy.deepcopy(peft_model).merge_and_unload(adapter_names=[name]).eval()


class AdapterSwitch:
    """Which of the two LoRA adapters every LoRA layer runs: one flag (`active`) that the layers
    read, instead of peft's `set_adapter`, which walks every module and resets `requires_grad`
    on every adapter weight (twice a step). Both adapters' weights train in one step, so their
    `requires_grad` is set once. Each LoRA layer's forward (`_switched_forward`) computes
    W x + b + s B A x of the named adapter as one matmul and one accumulating matmul, without
    peft's full-width temporaries; any setup that is not a plain adapter (dropout, a variant
    such as DoRA, a merged or disabled layer, extra arguments, autocast) runs peft's own forward
    for the named adapter. `library = True` switches with peft's `set_adapter` and runs peft's forward
    everywhere: the baseline the switch is tested equal to (tests/test_model.py)."""

    def __init__(self, peft_model, active: str):
        from peft.tuners.lora import LoraLayer

        self.active = active
        self.library = False
        self.peft = peft_model
        self.layers = [m for m in peft_model.modules() if isinstance(m, LoraLayer)]
        for m in self.layers:
            m.forward = types.MethodType(_switched_forward, m)
            m._adapter_switch = self

    def set(self, name: str) -> None:
        if self.library and self.peft.active_adapter != name:
            trainable = [p for m in self.layers for p in m.parameters() if p.requires_grad]
            self.peft.set_adapter(name)
            for p in trainable:  # peft's set_adapter freezes the other adapter; both train
                p.requires_grad_(True)
        self.active = name


def _switched_forward(self, x, *args, **kwargs):
    """A peft LoRA layer's forward under its AdapterSwitch (installed on the layer instance)."""
    switch, cls_forward = self._adapter_switch, type(self).forward
    name = switch.active
    if switch.library:
        return cls_forward(self, x, *args, **kwargs)
    plain = (
        not (args or kwargs or self.merged or self.disable_adapters)
        and name in self.lora_A
        and name not in self.lora_variant
        and isinstance(self.lora_dropout[name], nn.Identity)
        and isinstance(self.base_layer, nn.Linear)
        and not torch.is_autocast_enabled(x.device.type)
    )
    if not plain:
        self._active_adapter = [name]
        return cls_forward(self, x, *args, **kwargs)
    base = self.base_layer
    flat = x.reshape(-1, x.shape[-1])
    out = LoraMatmul.apply(
        flat, base.weight, base.bias, self.lora_A[name].weight, self.lora_B[name].weight, self.scaling[name]
    )
    return out.view(*x.shape[:-1], out.shape[-1])


_ZEROS: dict = {}


def _zero(t) -> torch.Tensor:
    """A 0-d zero of t's device and dtype, made once (addmm's ignored input at beta 0)."""
    key = (t.device, t.dtype)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros((), device=t.device, dtype=t.dtype)
    return _ZEROS[key]


class LoraMatmul(torch.autograd.Function):
    """y = x W^T + bias + s (x A^T) B^T for a frozen W and bias, in the dtype of x, with the
    gradients it needs and no more: 3 matmuls forward, 5 backward (4 without the input's
    gradient), the scale folded into them (autograd's own graph of the same expression takes 11
    ops, casts aside). Adapter weights in another dtype than x are cast to it and their
    gradients cast back."""

    @staticmethod
    def forward(ctx, x, w, bias, a, b, scale):
        ac, bc = (a, b) if a.dtype == x.dtype else (a.to(x.dtype), b.to(x.dtype))
        xa = x @ ac.t()
        y = x @ w.t() if bias is None else torch.addmm(bias, x, w.t())
        y.addmm_(xa, bc.t(), alpha=scale)
        ctx.save_for_backward(x, w, ac, bc, xa)
        ctx.scale, ctx.dtypes = scale, (a.dtype, b.dtype)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, a, b, xa = ctx.saved_tensors
        zero = _zero(g)
        gxa = torch.addmm(zero, g, b, beta=0, alpha=ctx.scale)  # s g B
        gb = torch.addmm(zero, g.t(), xa, beta=0, alpha=ctx.scale)  # s g^T (x A^T)
        ga = gxa.t() @ x
        gx = torch.addmm(g @ w, gxa, a) if ctx.needs_input_grad[0] else None
        if ga.dtype != ctx.dtypes[0]:
            ga, gb = ga.to(ctx.dtypes[0]), gb.to(ctx.dtypes[1])
        return gx, None, None, ga, gb, None


class LatentStrategyModel(nn.Module):
    def __init__(
        self, backbone, latent_dim: int, z_slots: int = 1, adaptation: str = "lora", lora_cfg: dict | None = None
    ):
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
            self.peft = add_lora(backbone, lora_cfg)  # adapters "generator" and "posterior"
            self._set_lms(backbone, backbone)  # peft put its LoRA layers into the backbone itself
            object.__setattr__(self, "switch", AdapterSwitch(self.peft, ADAPTERS[0]))
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

    def _set_lms(self, lm, lm_post) -> None:
        """With lora, `lm` / `lm_post` are views of the peft model's backbone (or the merged
        copies), not submodules of their own: the weights are registered once, under `peft.`."""
        object.__setattr__(self, "lm", lm)
        object.__setattr__(self, "lm_post", lm_post)

    # -------------------------------------------------------------- adapters

    def _trainable_names(self) -> list[str]:
        names = []
        for n, p in self.named_parameters():  # tied weights appear once
            if n.startswith(HEAD_PREFIXES):
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
            self.switch.set(name)
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
        each with one adapter merged into its weights by peft (`merged_copy`): the same function
        as the LoRA passes up to float rounding, and exactly the same while B = 0 (step 0),
        without each linear layer's two extra small matmuls (`python -m latentstrat.bench
        train`). The copies live for the `with` block (2x the backbone's memory meanwhile).
        `full` and `frozen` models run as they are."""
        if self.adaptation != "lora":
            yield
            return
        if torch.is_grad_enabled():
            raise RuntimeError("LatentStrategyModel.merged() is for no-grad passes (use torch.no_grad())")
        saved = self.lm, self.lm_post
        try:
            self._set_lms(merged_copy(self.peft, "generator"), merged_copy(self.peft, "posterior"))
            self._merged = True
            yield
        finally:  # the peft model was never touched (_set_active leaves it alone meanwhile)
            self._set_lms(*saved)
            self._merged = False

    # -------------------------------------------------------------- passes

    def posterior(self, post_ids, post_mask, lengths=None):
        """q(z|x,y): last-token pooling of the posterior adapter's pass -> (mu_q, logvar_q).
        `lengths`: the rows' lengths on the host (the batch's; read from the mask otherwise)."""
        lengths = host_array(post_mask.sum(1)) if lengths is None else np.asarray(lengths)
        read = (np.arange(len(lengths)), lengths - 1)
        with self.adapter("posterior"):
            h = hidden_at(self.lm_post, post_mask, lengths, read, input_ids=post_ids)
        return self.posterior_head(h)

    def router_prefix(self, ids, mask, z_open_pos):
        """p(z|x) from the `<z>` hidden state of right-padded rows; only the prefix up to `<z>` is run."""
        z_open = host_array(z_open_pos)
        T = int(z_open.max()) + 1
        lengths = np.minimum(host_array(mask.sum(1)), T)
        with self.adapter("generator"):
            h = hidden_at(self.lm, mask[:, :T], lengths, (np.arange(len(z_open)), z_open), input_ids=ids[:, :T])
        return self.router_head(h)

    def slot_embeddings(self, z):
        """z [B, D] -> [B, P, H] added to the `[Z]` token embedding at the slot positions."""
        return self.z_proj(z.float()).view(z.shape[0], self.z_slots, self.hidden)

    def embed_with_z(self, ids, z, z_slot_pos):
        emb = self.lm.get_input_embeddings()(ids)
        rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(z_slot_pos)
        slots = emb[rows, z_slot_pos] + self.slot_embeddings(z).to(emb.dtype)
        emb = emb.index_put((rows, z_slot_pos), slots)  # out of place: keeps autograd simple
        return emb

    def generator(self, gen_ids, gen_mask, z, z_open_pos, z_slot_pos, sup_pos=None, host=None):
        """One pass: router from the `<z>` hidden state (it has seen x only), generator logits
        with z written into the slots. Logits are [B, T, V], or [B, L, V] at `sup_pos` only
        (positions whose next token is supervised: cheaper for large vocabularies). `host`:
        the batch's positions on the host (batching.HostRows; read from the tensors otherwise)."""
        host = host or HostRows.of(gen_mask, z_open_pos, sup_pos)
        B = len(host.lengths)
        rows = np.arange(B)
        if sup_pos is None:
            read = None
        else:
            L = host.sup_pos.shape[1]
            read = (np.concatenate([rows, np.repeat(rows, L)]), np.concatenate([host.z_open, host.sup_pos.reshape(-1)]))
        with self.adapter("generator"):
            emb = self.embed_with_z(gen_ids, z, z_slot_pos)
            h = hidden_at(self.lm, gen_mask, host.lengths, read, inputs_embeds=emb)
            if read is None:
                mu_r, logvar_r = self.router_head(h[torch.arange(B, device=h.device), z_open_pos])
            else:
                mu_r, logvar_r = self.router_head(h[:B])
                h = h[B:].view(B, L, -1)
            logits = self.lm.lm_head(h)
        return logits, mu_r, logvar_r

    def gradient_checkpointing_enable(self) -> None:
        """transformers' activation checkpointing on the trained backbone passes (non-reentrant,
        so the frozen embeddings need no gradient). With lora both adapters' passes share one
        backbone and run before one backward, so each recomputation runs under the adapter its
        forward ran with (torch's `context_fn`). The packed CPU pass runs the layers itself and
        does not recompute: checkpointing is a GPU memory option."""
        kwargs = {"use_reentrant": False}
        if self.adaptation == "lora":
            kwargs["context_fn"] = lambda: (contextlib.nullcontext(), self.adapter(self._active))
        for lm in {id(self.lm): self.lm, id(self.lm_post): self.lm_post}.values():
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)

    # -------------------------------------------------------------- weights

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self._trainable_params)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        params = dict(self.named_parameters())
        return {n: params[n].detach().contiguous() for n in self._trainable}

    def load_trainable(self, state: dict) -> None:
        """Load a `trainable_state_dict` (a checkpoint's): strict on names and shapes."""
        missing = sorted(set(self._trainable) - set(state))
        extra = sorted(set(state) - set(self._trainable))
        if missing or extra:
            raise ValueError(
                f"state dict does not match this model ({self.adaptation}): missing {missing[:5]}, unexpected "
                f"{extra[:5]}"
            )
        params = dict(self.named_parameters())
        with torch.no_grad():
            for n, t in state.items():
                if params[n].shape != t.shape:
                    raise ValueError(f"state dict: {n} has shape {tuple(t.shape)}, model has {tuple(params[n].shape)}")
                params[n].copy_(t.to(params[n].dtype))

    def heads_state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t for n, t in self.trainable_state_dict().items() if n.startswith(HEAD_PREFIXES)}

    def save_trained(self, out_dir: str | Path) -> None:
        """A trained cell in the formats of its tools: with lora, peft's own adapter folders
        (`adapters/generator/`, `adapters/posterior/`: adapter_config.json +
        adapter_model.safetensors); with full, the two backbone copies as transformers folders
        (`backbones/generator/`, `backbones/posterior/`); always the heads (router, posterior,
        z projection) in `heads/heads.safetensors` with `heads/config.json`, written last."""
        from safetensors.torch import save_file

        from latentstrat.io import atomic_path, write_text

        out = Path(out_dir)
        if self.adaptation == "lora":
            self.peft.save_pretrained(str(out / ADAPTERS_DIR), selected_adapters=list(ADAPTERS))
        elif self.adaptation == "full":
            for name, lm in (("generator", self.lm), ("posterior", self.lm_post)):
                lm.save_pretrained(str(out / BACKBONES_DIR / name))
        heads = {n: t.cpu().clone() for n, t in self.heads_state_dict().items()}
        described = {
            "adaptation": self.adaptation,
            "latent_dim": self.latent_dim,
            "z_slots": self.z_slots,
            "hidden_size": self.hidden,
            "tensors": {n: list(t.shape) for n, t in heads.items()},
            "router_head": "Linear(hidden_size, 2 latent_dim) on the hidden state at <z> -> (mu_r, logvar_r)",
            "posterior_head": "Linear(hidden_size, 2 latent_dim) on the posterior pass's last token -> (mu_q, "
            "logvar_q)",
            "z_proj": "Linear(latent_dim, z_slots hidden_size): z -> slot embeddings added at the [Z] positions",
        }
        write_text(json.dumps(described, indent=2) + "\n", out / HEADS_DIR / HEADS_CONFIG)
        with atomic_path(out / HEADS_DIR / HEADS_WEIGHTS, suffix=".safetensors") as tmp:
            save_file(heads, str(tmp), metadata={"adaptation": self.adaptation})

    def load_trained(self, train_dir: str | Path) -> None:
        """The weights `save_trained` wrote; a missing, unreadable or mismatched file gives an
        error naming it."""
        d = Path(train_dir)
        saved = _read_json(d / HEADS_DIR / HEADS_CONFIG, "trained heads config")
        want = {
            "adaptation": self.adaptation,
            "latent_dim": self.latent_dim,
            "z_slots": self.z_slots,
            "hidden_size": self.hidden,
        }
        diff = {k: (saved.get(k), v) for k, v in want.items() if saved.get(k) != v}
        if diff:
            raise ValueError(f"{d / HEADS_DIR / HEADS_CONFIG} does not fit this cell: (saved, expected) {diff}")
        heads = _read_safetensors(d / HEADS_DIR / HEADS_WEIGHTS, "trained heads")
        if self.adaptation == "lora":
            for name in ADAPTERS:
                self._load_adapter(d / ADAPTERS_DIR / name, name)
        elif self.adaptation == "full":
            for name, lm in (("generator", self.lm), ("posterior", self.lm_post)):
                folder = d / BACKBONES_DIR / name
                state = _read_safetensors(folder / "model.safetensors", f"trained {name} backbone")
                missing, unexpected = lm.load_state_dict(state, strict=False)
                if unexpected or [k for k in missing if k != "lm_head.weight"]:
                    raise ValueError(
                        f"{folder} does not fit this backbone: missing {missing[:5]}, unexpected {unexpected[:5]}"
                    )
        self._load_heads(heads, d / HEADS_DIR / HEADS_WEIGHTS)

    def _load_heads(self, heads: dict, where) -> None:
        params = dict(self.named_parameters())
        want = set(self.heads_state_dict())
        if set(heads) != want:
            raise ValueError(
                f"{where} does not match this model: missing {sorted(want - set(heads))[:5]}, "
                f"unexpected {sorted(set(heads) - want)[:5]}"
            )
        with torch.no_grad():
            for n, t in heads.items():
                if params[n].shape != t.shape:
                    raise ValueError(f"{where}: {n} has shape {tuple(t.shape)}, model has {tuple(params[n].shape)}")
                params[n].copy_(t.to(params[n].dtype))

    def _load_adapter(self, folder: Path, name: str) -> None:
        """One peft adapter folder into the adapter `name`: its LoRA settings must be the
        cell's, and every LoRA weight of that adapter must be in it."""
        from peft import LoraConfig
        from peft.utils import set_peft_model_state_dict

        if not (folder / "adapter_config.json").exists():
            raise FileNotFoundError(f"trained {name} adapter {folder} has no adapter_config.json (run the train stage)")
        saved, ours = LoraConfig.from_pretrained(str(folder)), self.peft.peft_config[name]
        diff = {
            k: (getattr(saved, k), getattr(ours, k))
            for k in ("r", "lora_alpha", "target_modules")
            if _norm(getattr(saved, k)) != _norm(getattr(ours, k))
        }
        if diff:
            raise ValueError(
                f"trained {name} adapter {folder} was saved with other LoRA settings: (saved, config) {diff}"
            )
        state = _read_safetensors(folder / "adapter_model.safetensors", f"trained {name} adapter")
        result = set_peft_model_state_dict(self.peft, state, adapter_name=name)
        missing = [k for k in result.missing_keys if f".lora_A.{name}." in k or f".lora_B.{name}." in k]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"trained {name} adapter {folder} does not fit this backbone: missing {missing[:5]}, "
                f"unexpected {list(result.unexpected_keys)[:5]}"
            )


def _norm(v):
    return sorted(v) if isinstance(v, (set, list, tuple)) else v


def _read_json(path: Path, what: str) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist (run the train stage)")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        from latentstrat.io import unreadable_message

        raise ValueError(unreadable_message(what, path, f"{type(e).__name__}: {e}")) from None


def _read_safetensors(path: Path, what: str) -> dict:
    from safetensors.torch import load_file

    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist (run the train stage)")
    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - truncated, random bytes, not safetensors
        from latentstrat.io import unreadable_message

        raise ValueError(unreadable_message(what, path, f"{type(e).__name__}: {e}")) from None


# ----------------------------------------------------------------------------- a cell's model


def build_model(
    backbone_cfg: dict, lora_cfg: dict, cell: dict, tokenizer, entangle_dir, new_token_ids=()
) -> LatentStrategyModel:
    """Backbone per `init` (entangled: the entangle stage's model; direct: from the `backbone`
    section, with the tokens the data stage added, `data.added_token_ids`, at the mean
    embedding), wrapped with the cell's latent settings and the `lora` section's adapters.
    Seeded by the cell's training seed (cells.cell_training_seed): the same cell, or the other
    arm of its pair, builds the same model."""
    torch.manual_seed(cell_training_seed(cell))
    if cell["init"] == "entangled":
        backbone = load_entangled(
            entangle_dir, dtype=backbone_cfg["dtype"], attn_implementation=backbone_cfg["attn_implementation"]
        )
    else:
        backbone = build_backbone(backbone_cfg, tokenizer, list(new_token_ids))
    return LatentStrategyModel(backbone, int(cell["latent_dim"]), int(cell["z_slots"]), cell["adaptation"], lora_cfg)
