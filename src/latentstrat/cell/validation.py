"""The trainer's validation: what a cell's history records at step 0 (before any update), every
`train.eval_every` steps and at the end, on the validation split (docs/design.md, sections 4-5).

- every reconstruction family, KL, active objective, KL/active, diagnostics, beta_t over the
  whole split (z ~ q with a fixed noise draw, so successive evaluations differ only by the
  weights; the split S_ref and T_ref come from, so the entangled model scores exactly 1);
- on a fixed subset (the first `val_probe_per_task` examples of each task): the posterior
  probe, mu_q(x, y_true) -> true strategy (unambiguous examples), per task and mean; the router
  probes, router-sampled z -> the strategy the generator follows under that z. Decoding every
  example at every evaluation is too slow, so "follows" is scored, not decoded: the strategy
  whose canonical trace has the highest likelihood under p(y|x,z) (examples whose best trace is
  shared by several strategies are left out). The evaluate stage decodes;
- answer accuracy / strategy match on `val_decode_per_task` decoded examples per task
  (decode.generate, scored by scoring.score_generations);
- per task: mean token count, example / token share, share of the summed loss, share of the
  gradient norm of the active objective (one validation batch per task, equal sizes).

`measure_model` is what depends on the model alone (shared by every cell that starts from the
same weights: latentstrat.cell.step0); `validate` adds the cell's own objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from latentstrat import batching, encoding
from latentstrat.cell.probes import linear_probe
from latentstrat.cells import Cell
from latentstrat.metrics import LOSS_METRIC_OF, LOSS_METRICS, SCORED_NAMES, M, derive
from latentstrat.modeling import objective as obj
from latentstrat.modeling.backbone import device_of
from latentstrat.modeling.decode import Decoding, generate
from latentstrat.modeling.objective import Objective, forward_losses
from latentstrat.modeling.scoring import score_generations
from latentstrat.tasks import TASKS

ROUTER, GLOBAL = SCORED_NAMES[M.within_task_router_probe], SCORED_NAMES[M.global_router_probe]
GRAD_SHARE_ROWS = 16  # rows per task of the validation gradient-norm share
GAUSSIANS = ("mu_q", "logvar_q", "mu_r", "logvar_r")


def validation_subset(df: pd.DataFrame, per_task: int) -> list[int]:
    """Row indices: the first `per_task` examples (by example_id) of each task."""
    rows = []
    for _, g in df.groupby("task", sort=True):
        rows += g.sort_values("example_id").index[:per_task].tolist()
    return rows


@dataclass(frozen=True)
class ValidationSettings:
    """What a validation reads of the config: the `train` section's validation sizes, the
    `probes` section and the `evaluate` section's decode length. `recorded` is the form a
    step-0 validation's fingerprint records (latentstrat.cell.step0)."""

    probe_per_task: int
    decode_per_task: int
    batch_size: int
    max_new_tokens: int
    probes: dict

    @classmethod
    def of(cls, train_cfg: dict, evaluate_cfg: dict, probes_cfg: dict) -> ValidationSettings:
        return cls(
            int(train_cfg["val_probe_per_task"]),
            int(train_cfg["val_decode_per_task"]),
            int(train_cfg["val_batch_size"]),
            int(evaluate_cfg["max_new_tokens"]),
            dict(probes_cfg),
        )

    def recorded(self) -> dict:
        return {
            "train": {"val_probe_per_task": self.probe_per_task, "val_decode_per_task": self.decode_per_task},
            "probes": self.probes,
            "max_new_tokens": self.max_new_tokens,
        }


def prepare_validation(
    settings: ValidationSettings, seed: int, tokenizer, val_df, b_val, latent_dim: int, z_slots: int
) -> dict:
    """The fixed validation inputs of every evaluation: the split (losses), the probe subset
    `rows`, the decoded subset, one noise draw per row for z ~ q and z ~ router (seeded by the
    training seed of the cell, or of the model as built), and the settings the probes and the
    decodes read (`settings`, whose `recorded()` a step-0 validation's fingerprint records)."""
    val_df = val_df.reset_index(drop=True)
    rows = validation_subset(val_df, settings.probe_per_task)
    gen = torch.Generator().manual_seed(int(seed) + 17)
    eps = torch.randn((len(val_df), latent_dim), generator=gen)
    router_eps = torch.randn((len(val_df), latent_dim), generator=gen)[rows]
    return {
        "df": val_df,
        "enc": encoding.encode(val_df, tokenizer, z_slots),
        "b": b_val,
        "rows": rows,
        "eps": eps,
        "router_eps": router_eps,
        "decode_rows": validation_subset(val_df, settings.decode_per_task),
        "settings": settings,
    }


@torch.no_grad()
def validate(
    model, tokenizer, cell: Cell, objective: Objective, val, step: int, measured: dict | None = None
) -> list[dict]:
    """History rows for one evaluation (`val`: from `prepare_validation`): the losses over the
    whole validation split, the probes, the decoded subset and the per-task shares.
    `measured`: the model's own measurements (`measure_model`) when they were taken elsewhere:
    the shared step-0 validation of every cell starting from this model (`step0_validation`)."""
    was_training = model.training
    model.eval()
    rows = val["rows"]
    sub = val["df"].loc[rows]
    if measured is None:
        measured = measure_model(model, tokenizer, val, cell.training_seed)
    metrics, per_row = validation_losses(measured["passes"], val, objective, step)
    metrics.update(measured["metrics"])
    metrics[SCORED_NAMES[M.matched_router_score]] = scored_matched(metrics)
    per_task = {t: dict(m) for t, m in measured["per_task"].items()}
    for t, m in per_task.items():
        if M.final_answer_accuracy in m:
            m[SCORED_NAMES[M.matched_router_score]] = scored_matched(m)
    grad = _task_grad_norms(model, objective, val, step)
    task_shares(sub, per_row["active"][torch.as_tensor(rows)].numpy().astype(np.float64), grad, per_task)
    if was_training:
        model.train()
    cid = cell.cell_id
    out = [dict(cell_id=cid, step=step, task="all", metric=k, value=float(v)) for k, v in metrics.items()]
    for t in sorted(per_task):
        out += [dict(cell_id=cid, step=step, task=t, metric=k, value=float(v)) for k, v in per_task[t].items()]
    return out


@torch.no_grad()
def measure_model(model, tokenizer, val, seed: int) -> dict:
    """What a validation measures of the model alone, whatever the cell's objective: the passes
    over the whole split (`validation_passes`), the probes and the decoded subset's metrics
    (overall in `metrics`, per task in `per_task`)."""
    was_training = model.training
    model.eval()
    tasks = sorted(val["df"].loc[val["rows"]].task.unique())
    per_task: dict[str, dict] = {t: {} for t in tasks}
    with model.merged():
        passes = validation_passes(model, val)
        on_subset = {k: passes[k][torch.as_tensor(val["rows"])] for k in GAUSSIANS}  # in `rows` order
        metrics = probe_metrics(model, tokenizer, val, on_subset, per_task)
        overall, decoded_by_task = _decoded_metrics(model, tokenizer, val, seed)
    metrics.update(overall)
    for t in tasks:
        per_task[t].update(decoded_by_task.get(t, {}))
    if was_training:
        model.train()
    return {"passes": passes, "metrics": metrics, "per_task": per_task}


def validation_passes(model, val) -> dict:
    """objective.forward_passes over the whole validation split, z ~ q with the fixed noise
    draw, in the split's row order: `l` (per row, a float32 array of its n_supervised token
    NLLs) and the Gaussians [N, D]."""
    df, enc = val["df"], val["enc"]
    bs = val["settings"].batch_size
    acc: dict[str, list] = {k: [] for k in GAUSSIANS}
    l_rows: list = [None] * len(df)
    order: list[int] = []
    for idx, batch in batching.split_batches(enc, bs, device_of(model)):
        order += idx
        out = obj.forward_passes(model, batch, val["eps"][idx])
        nll, n = out["l"].float().cpu().numpy(), batch.sup_mask.sum(1).tolist()
        for j, r in enumerate(idx):
            l_rows[r] = nll[j, : n[j]].copy()
        for k in GAUSSIANS:
            acc[k].append(out[k].float().cpu())
    back = torch.empty(len(df), dtype=torch.long)
    back[torch.as_tensor(order)] = torch.arange(len(df))
    return {"l": l_rows, **{k: torch.cat(v)[back] for k, v in acc.items()}}


def _padded(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row 1-d arrays -> ([N, L_max] float32 zero-padded, [N, L_max] mask)."""
    t = [torch.tensor(np.asarray(r, dtype=np.float32)) for r in rows]
    values = torch.nn.utils.rnn.pad_sequence(t, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(x)) for x in t], batch_first=True)
    return values, mask


def validation_losses(passes: dict, val, objective: Objective, step: int) -> tuple[dict, dict]:
    """J's terms over the whole validation split (the rows S_ref and T_ref are measured on, so a
    model equal to the reference scores exactly 1) from its passes: (history metrics, per-row
    tensors in the split's row order)."""
    nll, mask = _padded(passes["l"])
    b, _ = _padded(val["b"])
    out = obj.losses({**passes, "l": nll}, b, mask, objective, step)
    base = derive({metric: out[k].mean().item() for k, metric in LOSS_METRIC_OF.items()})
    metrics = {k: base[k] for k in (*LOSS_METRICS, M.kl_over_active_reconstruction, M.inferred_zfree_reference_scale)}
    metrics.update(
        posterior_variance=out["posterior_variance"].item(),
        router_marginal_kl_to_prior=out["router_marginal_kl_to_prior"].item(),
        beta_t=out["beta_t"],
        total_loss=out["total"].item(),
    )
    return metrics, {k: out[k] for k in LOSS_METRIC_OF}


def scored_matched(m: dict) -> float:
    """The history's matched router score: the likelihood-scored router probe x the decoded
    subset's strategy-match rate (the metrics row's identity, derive, on the scored probe)."""
    return derive(
        {
            M.within_task_router_probe: m.get(SCORED_NAMES[M.within_task_router_probe]),
            M.strategy_match_rate: m.get(M.strategy_match_rate),
        }
    )[M.matched_router_score]


def probe_metrics(model, tokenizer, val, on_subset: dict, per_task: dict) -> dict:
    """Posterior probe (mu_q -> true strategy, unambiguous rows) and the scored router probes
    (router-sampled z -> the strategy scored as followed by likelihood; SCORED_NAMES) per task
    into `per_task`; their means and the scored global router probe returned."""
    rows, df, probes = val["rows"], val["df"], val["settings"].probes
    sub = df.loc[rows]
    z_router = on_subset["mu_r"] + torch.exp(0.5 * on_subset["logvar_r"]) * val["router_eps"]
    followed = scored_strategies(model, tokenizer, df, rows, z_router, val["settings"].batch_size)
    mu_q, zr = on_subset["mu_q"].numpy(), z_router.numpy()
    amb, task_arr, strat = sub.ambiguous.to_numpy(), sub.task.to_numpy(), sub.strategy.to_numpy()
    fol = np.array([f if f is not None else "" for f in followed], dtype=object)
    for t in per_task:
        m = (task_arr == t) & ~amb
        per_task[t][M.posterior_probe], per_task[t]["posterior_probe_chance"] = _probe(mu_q[m], strat[m], probes)
        m2 = (task_arr == t) & (fol != "")
        per_task[t][ROUTER], per_task[t][f"{ROUTER}_chance"] = _probe(zr[m2], fol[m2], probes)
    out = {}
    for k in (M.posterior_probe, ROUTER):
        for key in (k, f"{k}_chance"):
            # the chance level averaged over the tasks the probe itself covers
            vals = [per_task[t][key] for t in per_task if np.isfinite(per_task[t][k])]
            out[key] = float(np.mean(vals)) if vals else math.nan
    g = fol != ""
    out[GLOBAL], out[f"{GLOBAL}_chance"] = _probe(
        zr[g], np.array([f"{a}:{b}" for a, b in zip(task_arr[g], fol[g])]), probes
    )
    return out


def _probe(X, y, probes: dict) -> tuple[float, float]:
    """(CV accuracy, chance level: the majority-class rate of the probed examples); `probes`:
    the config's probes section."""
    if len(y) == 0:
        return math.nan, math.nan
    r = linear_probe(np.asarray(X), np.asarray(y), folds=probes["folds"], seed=probes["seed"], shuffled_control=False)
    return float(r.accuracy), float(r.chance)


@torch.no_grad()
def scored_strategies(
    model, tokenizer, df: pd.DataFrame, rows: list[int], z: torch.Tensor, batch_size: int
) -> list[str | None]:
    """Per row: the strategy whose canonical trace is most likely under p(y|x,z), or None when
    the best trace is shared by several strategies."""
    cand, owner = [], []
    for k, r in enumerate(rows):
        task, x = df.task[r], df.x[r]
        traces: dict[str, list[str]] = {}
        for s in TASKS[task].strategies:
            traces.setdefault(TASKS[task].render(x, s), []).append(s)
        for y, strategies in traces.items():
            cand.append({"task": task, "x": x, "y": y})
            owner.append((k, strategies))
    cdf = pd.DataFrame(cand)
    enc = encoding.encode(cdf, tokenizer, model.z_slots)
    dev = device_of(model)
    scores = np.zeros(len(cdf))
    for idx, b in batching.split_batches(enc, batch_size, dev):
        zz = z[[owner[i][0] for i in idx]].to(dev)
        logits, _, _ = model.generator(b.gen_ids, b.gen_mask, zz, b.z_open_pos, b.z_slot_pos, sup_pos=b.gen_sup_pos)
        nll = (obj.token_nll(logits, b.sup_ids) * b.sup_mask).sum(1)
        scores[idx] = -nll.cpu().numpy()
    best: dict[int, tuple[float, list[str]]] = {}
    for i, (k, strategies) in enumerate(owner):
        if k not in best or scores[i] > best[k][0]:
            best[k] = (scores[i], strategies)
    return [best[k][1][0] if len(best[k][1]) == 1 else None for k in range(len(rows))]


def task_shares(sub: pd.DataFrame, active: np.ndarray, grad: dict, per_task: dict) -> None:
    """Per task (over the probe subset: equal examples per task): mean token count, example /
    token share, share of the summed active objective and of the gradient norm."""
    n_sup = sub.n_supervised.to_numpy().astype(float)
    task_arr = sub.task.to_numpy()
    gsum = sum(grad.values())
    for t in per_task:
        m = task_arr == t
        per_task[t].update(
            token_count_mean=float(n_sup[m].mean()),
            example_share=float(m.mean()),
            token_share=float(n_sup[m].sum() / n_sup.sum()),
            loss_share=float(active[m].sum() / active.sum()) if active.sum() else math.nan,
            grad_norm_share=grad[t] / gsum if gsum > 0 else math.nan,
        )


def _decoded_metrics(model, tokenizer, val, seed: int) -> tuple[dict, dict]:
    """Answer accuracy and strategy-match rate of router-sampled greedy generations on the
    decoded subset: (overall, {task: per-task})."""
    df, rows = val["df"], val["decode_rows"]
    if not rows:
        return {M.final_answer_accuracy: math.nan, M.strategy_match_rate: math.nan}, {}
    sub = df.loc[rows]
    gen = generate(
        model,
        tokenizer,
        sub.x.tolist(),
        decoding=Decoding(val["settings"].max_new_tokens, val["settings"].batch_size, seed=seed),
    )
    scored = score_generations(sub, gen.texts)
    correct = scored.correct.to_numpy(dtype=float)
    matched = scored.matched_strategies.map(len).gt(0).to_numpy(dtype=float)
    task_arr = sub.task.to_numpy()
    by_task = {
        t: {
            M.final_answer_accuracy: float(correct[task_arr == t].mean()),
            M.strategy_match_rate: float(matched[task_arr == t].mean()),
        }
        for t in np.unique(task_arr)
    }
    return {M.final_answer_accuracy: float(correct.mean()), M.strategy_match_rate: float(matched.mean())}, by_task


def _task_grad_norms(model, objective: Objective, val: dict, step: int) -> dict[str, float]:
    """Per task: gradient norm of the mean active objective on one validation batch of that
    task (GRAD_SHARE_ROWS rows each, equal across tasks) from the probe subset `val["rows"]`."""
    params = model.trainable_parameters()
    df, dev = val["df"], device_of(model)
    by_task: dict[str, list[int]] = {}
    for r in val["rows"]:
        by_task.setdefault(df.task[r], []).append(r)
    size = min(GRAD_SHARE_ROWS, min(len(v) for v in by_task.values()))
    out = {}
    for t, rs in sorted(by_task.items()):
        batch = batching.collate(val["enc"], rs[:size], val["b"]).to(dev)
        with torch.enable_grad():
            o = forward_losses(model, batch, objective, step, val["eps"][rs[:size]])
            grads = torch.autograd.grad(o["active"].mean(), params, allow_unused=True)
        out[t] = math.sqrt(sum(float(g.float().pow(2).sum()) for g in grads if g is not None))
    return out
