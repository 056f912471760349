"""The disentangling objective (design section 4, docs/design.md).

Per supervised token t of example i: l_it (generator NLL) and b_it (z-free reference NLL, read
from the reference stage). Token aggregation A_i (the ablated axis), the reconstruction terms
every cell logs and the family it optimizes (latentstrat.families), analytic Gaussian KL, beta
schedules and diagnostics. A cell's settings for J are parsed once into an `Objective`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from latentstrat.aggregations import aggregation as declared_aggregation
from latentstrat.cells import CellSettings, as_settings, format_value
from latentstrat.families import Family
from latentstrat.schedules import Schedule

TOKCC_EPS = 1e-3


@dataclass(frozen=True, eq=False)
class Objective:
    """What J reads of one cell's settings (cells.CellSettings, parsed once): the reconstruction family, the token
    aggregation, the KL weight and its schedule, the penalty weights, and the entangled model's
    scales for this aggregation and the family's tokcc exponent ({"S_ref", "T_ref", "n_bar"})."""

    family: Family
    aggregation: str
    beta: float
    beta_schedule: Schedule
    posterior_variance_weight: float
    router_marginal_kl_weight: float
    scales: dict

    @classmethod
    def for_cell(cls, settings, reference_scales: dict) -> "Objective":
        """A cell's J: its settings (cells.CellSettings), with the entangled model's scales for its
        aggregation and its family's tokcc exponent picked from the reference stage's table
        (`scales.json`: n_bar, S_ref per aggregation, T_ref per exponent and aggregation)."""
        s = as_settings(settings)
        scales = select_scales(reference_scales, s.token_aggregation.name, s.reconstruction_family.alpha)
        return cls._build(s, scales)

    @classmethod
    def with_scales(cls, settings, scales: dict) -> "Objective":
        """A cell's J with scales the caller measured itself ({"S_ref", "T_ref", "n_bar"}: the
        benchmarks and tests)."""
        return cls._build(as_settings(settings), scales)

    @classmethod
    def _build(cls, s: CellSettings, scales: dict) -> "Objective":
        return cls(
            family=s.reconstruction_family,
            aggregation=s.token_aggregation.name,
            beta=s.beta,
            beta_schedule=s.beta_schedule,
            posterior_variance_weight=s.posterior_variance_weight,
            router_marginal_kl_weight=s.router_marginal_kl_weight,
            scales=dict(scales),
        )

    def beta_at(self, step: int) -> float:
        return self.beta * self.beta_schedule.factor(step)

    def zfree(self) -> float:
        """The active objective of the z-free model on the validation split (its natural unit)."""
        return self.family.zfree(self.scales)


def alpha_key(alpha: float) -> str:
    """A tokcc exponent as the reference table's T_ref keys it ("0.25")."""
    return format_value(float(alpha))


def select_scales(table: dict, aggregation: str, alpha: float) -> dict:
    """{"S_ref", "T_ref", "n_bar"} for one aggregation and tokcc exponent from the reference
    stage's table; a table without them is a ValueError that names what it has."""
    if aggregation not in table["S_ref"]:
        raise ValueError(f"reference scales have no aggregation {aggregation!r} (have {sorted(table['S_ref'])})")
    key = alpha_key(alpha)
    if key not in table["T_ref"]:
        raise ValueError(
            f"reference scales have no T_ref for tokcc a={key} (have a={sorted(table['T_ref'])}); "
            "rerun the reference stage with this family in the config"
        )
    return {"S_ref": table["S_ref"][aggregation], "T_ref": table["T_ref"][key][aggregation], "n_bar": table["n_bar"]}


def aggregate_tokens(v: torch.Tensor, mask: torch.Tensor, aggregation: str, n_bar: float | None = None) -> torch.Tensor:
    """A_i(v) = sum_t v_it / d_i per example [B] from per-token values v [B, L] and mask [B, L],
    d_i the declared aggregation's divisor (latentstrat.aggregations): mean n_i, sum 1,
    sum_scaled n_bar (the mean n_i on train)."""
    mask = mask.to(v.dtype)
    return (v * mask).sum(-1) / declared_aggregation(aggregation).divisor(mask.sum(-1).clamp_min(1), n_bar)


def tokcc_weights(b: torch.Tensor, alpha: float) -> torch.Tensor:
    """w_it = (b_it + 1e-3)^alpha."""
    return (b.clamp_min(0) + TOKCC_EPS) ** alpha


def reconstruction_per_example(l, b, mask, family: Family, aggregation: str, scales: dict) -> dict[str, torch.Tensor]:
    """Per-example [B] values of every reconstruction term (families.TERMS: raw, dist_norm,
    tokcc) and of the family's objective (`active`).

    scales: {"S_ref": float, "T_ref": float, "n_bar": float} for this aggregation and the
    family's alpha (see `reference_scales`). b is a constant (no gradient flows into it).
    """
    b = b.detach().to(l.dtype)
    n_bar = scales.get("n_bar")
    raw = aggregate_tokens(l, mask, aggregation, n_bar)
    terms = {
        "raw": raw,
        "dist_norm": raw / scales["S_ref"],
        "tokcc": aggregate_tokens(tokcc_weights(b, family.alpha) * l, mask, aggregation, n_bar) / scales["T_ref"],
    }
    return {**terms, "active": family.active(terms)}


def reconstruction(l, b, mask, family: Family, aggregation: str, scales: dict) -> dict[str, torch.Tensor]:
    """Batch means (scalars) of every reconstruction term and the active objective."""
    return {k: v.mean() for k, v in reconstruction_per_example(l, b, mask, family, aggregation, scales).items()}


def gaussian_kl(mu_q, logvar_q, mu_r, logvar_r) -> torch.Tensor:
    """KL(N(mu_q, exp logvar_q) || N(mu_r, exp logvar_r)) per example [B], summed over dims."""
    return 0.5 * (logvar_r - logvar_q + (logvar_q.exp() + (mu_q - mu_r) ** 2) / logvar_r.exp() - 1).sum(-1)


def posterior_variance(logvar_q) -> torch.Tensor:
    """Mean of exp(logvar_q) over batch and dims."""
    return logvar_q.exp().mean()


def router_marginal_kl_to_prior(mu_r, logvar_r) -> torch.Tensor:
    """The batch's router Gaussians moment-matched to one diagonal Gaussian; KL to N(0, I)."""
    m = mu_r.mean(0)
    v = (logvar_r.exp() + mu_r**2).mean(0) - m**2
    v = v.clamp_min(1e-12)
    return 0.5 * (v + m**2 - 1 - v.log()).sum()


def token_nll(logits, targets) -> torch.Tensor:
    """Per-token NLL [B, L] from logits [B, L, V] and targets [B, L] (computed in float32)."""
    return torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")


def reference_scales(b_lists, aggregation: str, alpha: float = 0.25, n_bar: float | None = None) -> tuple[float, float]:
    """(S_ref, T_ref) from per-example reference NLL lists (the validation split):
    S_ref = mean_i A_i(b), T_ref = mean_i A_i(w * b), w = (b + 1e-3)^alpha."""
    b_lists = [list(x) for x in b_lists]
    if not b_lists or any(len(x) == 0 for x in b_lists):
        raise ValueError("reference_scales: needs a non-empty list of non-empty per-example b lists")
    L = max(len(x) for x in b_lists)
    b = torch.zeros(len(b_lists), L, dtype=torch.float64)
    mask = torch.zeros_like(b)
    for i, x in enumerate(b_lists):
        b[i, : len(x)] = torch.tensor(x, dtype=torch.float64)
        mask[i, : len(x)] = 1
    s = aggregate_tokens(b, mask, aggregation, n_bar).mean().item()
    t = aggregate_tokens(tokcc_weights(b, alpha) * b, mask, aggregation, n_bar).mean().item()
    if not (math.isfinite(s) and math.isfinite(t)) or s <= 0 or t <= 0:
        raise ValueError(f"reference_scales: non-positive or non-finite scales S_ref={s}, T_ref={t} ({aggregation})")
    return s, t


def forward_passes(model, batch, eps: torch.Tensor) -> dict:
    """The model's side of J on a batch: one posterior pass (z ~ q with the given noise `eps`)
    and one router/generator pass. The generator's per-token NLL `l` [B, L] (float32, to be
    read at `batch.sup_mask`) and the posterior's and router's Gaussians [B, D]."""
    mu_q, logvar_q = model.posterior(batch.post_ids, batch.post_mask, lengths=batch.post_lengths)
    z = mu_q + torch.exp(0.5 * logvar_q) * eps.to(mu_q.device)
    logits, mu_r, logvar_r = model.generator(
        batch.gen_ids, batch.gen_mask, z, batch.z_open_pos, batch.z_slot_pos, sup_pos=batch.gen_sup_pos, host=batch.host
    )
    return {
        "l": token_nll(logits, batch.sup_ids),
        "mu_q": mu_q,
        "logvar_q": logvar_q,
        "mu_r": mu_r,
        "logvar_r": logvar_r,
    }


def losses(passes: dict, b, sup_mask, objective: Objective, step: int) -> dict:
    """J from the passes (`forward_passes`, a batch's or a whole split's) and the reference NLL
    b at the same tokens: per-example [B] tensors for every reconstruction term, the active
    objective and the KL, scalars for the diagnostics, beta_t and J (`total`)."""
    o = objective
    rec = reconstruction_per_example(passes["l"], b, sup_mask, o.family, o.aggregation, o.scales)
    mu_q, logvar_q, mu_r, logvar_r = (passes[k] for k in ("mu_q", "logvar_q", "mu_r", "logvar_r"))
    kl = gaussian_kl(mu_q, logvar_q, mu_r, logvar_r)
    out = {
        **rec,
        "kl": kl,
        "mu_q": mu_q,
        "logvar_q": logvar_q,
        "mu_r": mu_r,
        "logvar_r": logvar_r,
        "posterior_variance": posterior_variance(logvar_q),
        "router_marginal_kl_to_prior": router_marginal_kl_to_prior(mu_r, logvar_r),
    }
    out["beta_t"] = o.beta_at(step)
    out["total"] = objective_j(
        rec["active"].mean(), kl.mean(), out["posterior_variance"], out["router_marginal_kl_to_prior"], o, step
    )
    return out


def forward_losses(model, batch, objective: Objective, step: int, eps: torch.Tensor) -> dict:
    """The objective J of a batch (design section 4), the one definition train, validation and
    evaluate call: `forward_passes`, then `losses`."""
    return losses(forward_passes(model, batch, eps), batch.b, batch.sup_mask, objective, step)


def objective_j(active, kl, post_var, router_marginal_kl, objective: Objective, step: int):
    """J = mean active reconstruction + beta_t * mean KL + the posterior-variance and
    router-marginal penalties (their weights: the cell's). Over a batch (forward_losses) or a
    whole split (the trainer's validation), from the means over it."""
    return (
        active
        + objective.beta_at(step) * kl
        + objective.posterior_variance_weight * post_var
        + objective.router_marginal_kl_weight * router_marginal_kl
    )


def supervised_logits(model, ids, mask, sup_pos) -> torch.Tensor:
    """Logits [B, L, V] at the positions whose next token is supervised. Only those hidden
    states go through the output projection (a 150k vocabulary stays cheap)."""
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    h = hidden.gather(1, sup_pos.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return model.get_output_embeddings()(h)


def zfree_token_nll(model, batch) -> torch.Tensor:
    """-log p(y_t | x, y_<t) per supervised token [B, L] (float32, 0 at padding): the z-free
    model on the generator record, the `[Z]` slot neutral (its token embedding, no z)."""
    logits = supervised_logits(model, batch.gen_ids, batch.gen_mask, batch.gen_sup_pos)
    return token_nll(logits, batch.sup_ids) * batch.sup_mask
