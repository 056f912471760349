"""The trainer's step against the library step it replaced, on one model and the same batches,
in one process: kernel ops per step, host syncs per step, host milliseconds per step, graph
breaks when the forward is compiled, and both steps' outputs (losses and gradients over a few
steps). `bench train` and `bench seedscale` print it (`compare`, `render`).

The library step is the step as torch, transformers and peft give it without the project's
fast paths, as the trainer ran it before: peft's `set_adapter` switching and LoRA forward
(model.AdapterSwitch.library), transformers' padded pass with its attention mask
(backbone.LAYOUT = "transformers"), the z noise drawn on the CPU and copied in, every loss term
checked for NaN on the host, the gradient norm, the loss, the batch's tasks and token counts
read back every step, and torch's default AdamW. The trainer's step is `train.train_step` with
its batches and noise as `train.training_loop` makes them, on the layout the device takes
(`--layout` forces one: `padded` counts the GPU path's step on a CPU).

Kernel ops and syncs are counted by runtime.dispatch on whatever device runs the step; host
milliseconds are the step's wall time where the arithmetic is negligible (the small shapes
the benchmarks pass), i.e. what Python, the libraries and the dispatcher cost per step.
"""

from __future__ import annotations

import copy
import math
import time
from contextlib import contextmanager

import numpy as np
import torch

from latentstrat import batching
from latentstrat.cell import train
from latentstrat.modeling import backbone
from latentstrat.modeling.objective import forward_losses
from latentstrat.modeling.optim import grad_or_zero
from latentstrat.runtime import dispatch


@contextmanager
def library(model):
    """The model runs the library path inside the block (peft's switch and forward,
    transformers' pass with its mask)."""
    lora = model.adaptation == "lora"
    with layout("transformers"):
        if lora:
            model.switch.library = True
        try:
            yield
        finally:
            if lora:
                model.switch.library = False


def library_model(model):
    """A copy of `model` as the library step ran it: its trainable weights in float32 (peft
    upcasts adapters under a lower-precision backbone and casts the activations around them)."""
    lib = copy.deepcopy(model)
    with torch.no_grad():
        for p in lib.trainable_parameters():
            p.data = p.data.float()
    return lib


@contextmanager
def layout(kind: str | None):
    prev = backbone.LAYOUT
    backbone.LAYOUT = kind or prev
    try:
        yield
    finally:
        backbone.LAYOUT = prev


def library_batch(enc, b, batch_size: int, step: int):
    return batching.collate(enc, train.batch_at(enc.task_idx, batch_size, 0, step), b)


def library_step(model, opt, objective, enc, batch, step: int, clip: float) -> float:
    """One step of the trainer as it was (module docstring), on `model` in library mode."""
    dev = backbone.device_of(model)
    batch = batch.to(dev)
    eps = train.step_noise(0, step, (len(batch), model.latent_dim)).to(dev)  # drawn on the CPU
    losses = forward_losses(model, batch, objective, step, eps)
    for k in train.RECORDED:  # every term checked on the host, every step
        if bool((~torch.isfinite(losses[k].detach().reshape(-1))).any()):
            raise train.NonFiniteLoss(f"step {step + 1}: {k}")
    opt.zero_grad(set_to_none=True)
    losses["total"].backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), clip if clip > 0 else math.inf)
    np.bincount(batch.task_idx.cpu().numpy(), minlength=len(enc.tasks)).tolist()
    float(gnorm)
    opt.step()
    int(batch.gen_mask.sum() + batch.post_mask.sum())
    return float(losses["total"].detach())


def trainer_batch(enc, b, batch_size: int, step: int, device):
    multiple = 1 if device.type == "cpu" else train.PAD_MULTIPLE
    return batching.collate(enc, train.batch_at(enc.task_idx, batch_size, 0, step), b, multiple=multiple)


def trainer_step(model, opt, objective, batch, step: int, clip: float) -> torch.Tensor:
    """One step of the trainer (`train.train_step`), its batch and noise as the loop makes them."""
    dev = backbone.device_of(model)
    batch = batch.to(dev)
    eps = train.step_noise(0, step, (len(batch), model.latent_dim), dev)
    return train.train_step(model, opt, objective, batch, eps, step, clip)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def norm_ops(dtype, width: int, device) -> int:
    """Kernel ops of one RMSNorm forward and backward (torch's `rms_norm` on a `dtype` input of
    `width`, a frozen weight), as this device's torch runs it: a CPU build decomposes it into
    ~20 ops (statistics in float32, casts each way); a CUDA build runs one fused kernel each way."""
    x = torch.randn(4, width, dtype=dtype, device=device, requires_grad=True)
    w, g = torch.ones(width, dtype=dtype, device=device), torch.ones(4, width, dtype=dtype, device=device)
    with dispatch.count() as c:
        y = torch.nn.functional.rms_norm(x, (width,), w, 1e-6)
        torch.autograd.grad(y, x, g)
    return c.n_ops


@contextmanager
def _norms_counted(calls: list):
    """Counts the decoder's RMSNorm calls (backbone._rms_norm) inside the block."""
    inner = backbone._rms_norm

    def counted(norm, x):
        calls.append((x.dtype, x.shape[-1]))
        return inner(norm, x)

    backbone._rms_norm = counted
    try:
        yield
    finally:
        backbone._rms_norm = inner


def _measure(batch_fn, step_fn, first: int, steps: int, device) -> dict:
    """Ops and syncs of one step (after `first` warm-up steps), then the wall time of `steps`
    more. The batches are made on the host beforehand (`batch_fn`: host work on host tensors,
    the same for both steps), so the counts and times are the step's own. `norm_ops`: the ops
    of the step's RMSNorms among them (the fast pass's, counted by call; 0 for transformers')."""
    batches = [batch_fn(i) for i in range(first + 1 + steps)]
    for i in range(first):
        step_fn(batches[i], i)
    norms: list = []
    with dispatch.count() as c, _norms_counted(norms):
        step_fn(batches[first], first)
    _sync(device)
    t = time.perf_counter()
    for i in range(first + 1, first + 1 + steps):
        step_fn(batches[i], i)
    _sync(device)
    per_norm = {k: norm_ops(*k, device) for k in set(norms)}
    return {
        "ops": c.n_ops,
        "syncs": c.n_syncs,
        "sync_sites": c.where(),
        "host_ms": 1000 * (time.perf_counter() - t) / steps,
        "top_ops": dict(c.ops.most_common(6)),
        "norms": len(norms),
        "norm_ops": sum(per_norm[k] for k in norms),
    }


def graph_breaks(model, objective, enc, b, batch_size: int) -> int:
    """Graph breaks of the step's forward (objective.forward_losses) under torch.compile's
    tracer (torch._dynamo.explain), on a copy of the model in its current mode."""
    import torch._dynamo

    dev = backbone.device_of(model)
    batch = batching.collate(enc, train.batch_at(enc.task_idx, batch_size, 0, 0), b).to(dev)
    eps = train.step_noise(0, 0, (len(batch), model.latent_dim), dev)
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(lambda: forward_losses(model, batch, objective, 0, eps)["total"])()
    finally:
        torch._dynamo.reset()
    return int(explained.graph_break_count)


def outputs_equal(model, objective, enc, b, batch_size: int, steps: int, clip: float, lr: float) -> dict:
    """Both steps from the same weights over the same batches: the largest relative difference
    of the losses over `steps` steps, and the relative difference (norm of the difference over
    the norm, all trainable tensors together) of the gradients and of the weights' updates
    after the last. Adam normalizes each weight's step, so a weight whose gradient is near zero
    moves by about lr either way: updates differ more than losses and gradients do."""
    ref_model, new_model = library_model(model), copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref_model.trainable_parameters(), lr=lr)
    new_opt = train.optimizer(new_model.trainable_parameters(), lr, 0.01)
    ref_opt.param_groups[0]["weight_decay"] = new_opt.param_groups[0]["weight_decay"]
    dev = backbone.device_of(model)
    with library(ref_model):
        ref = [
            library_step(ref_model, ref_opt, objective, enc, library_batch(enc, b, batch_size, i), i, clip)
            for i in range(steps)
        ]
    new = [
        trainer_step(new_model, new_opt, objective, trainer_batch(enc, b, batch_size, i, dev), i, clip)
        for i in range(steps)
    ]
    new = [float(r[train.RECORDED.index("total")]) for r in new]

    def rel(pairs):
        diff = math.sqrt(sum(float((x.float() - y.float()).pow(2).sum()) for x, y in pairs))
        return diff / max(math.sqrt(sum(float(y.float().pow(2).sum()) for _, y in pairs)), 1e-30)

    start = [p.float() for p in model.trainable_parameters()]
    masters = {id(p): m for p, m in zip(new_opt.low, new_opt.masters)}  # a bf16 weight's own state
    trained = [masters.get(id(p), p) for p in new_model.trainable_parameters()]
    params = list(zip(trained, ref_model.trainable_parameters(), start))
    return {
        "losses_library": ref,
        "losses_trainer": new,
        "loss_rel": max(abs(a - c) / max(abs(a), 1e-12) for a, c in zip(ref, new)),
        "grad_rel": rel(
            [(grad_or_zero(p), grad_or_zero(q)) for p, q, _ in params if p.grad is not None or q.grad is not None]
        ),
        "dtypes": sorted({str(p.dtype).replace("torch.", "") for p in new_model.trainable_parameters()}),
        "update_rel": rel([(p.detach() - w.detach(), q.detach() - w.detach()) for p, q, w in params]),
    }


def compare(model, objective, data, batch_size: int, lr: float, clip: float = 1.0, steps: int = 3, kind=None) -> dict:
    """The library step and the trainer's step on copies of `model` (module docstring), on
    `data` = (the encoded train split, its reference NLLs); `kind` forces the trainer's layout
    (backbone.LAYOUT)."""
    enc, b = data
    dev = backbone.device_of(model)
    res = {}
    lib_model = library_model(model)
    lib_opt = torch.optim.AdamW(lib_model.trainable_parameters(), lr=lr)
    with library(lib_model):
        res["library"] = _measure(
            lambda i: library_batch(enc, b, batch_size, i),
            lambda batch, i: library_step(lib_model, lib_opt, objective, enc, batch, i, clip),
            2,
            steps,
            dev,
        )
        res["library"]["graph_breaks"] = graph_breaks(lib_model, objective, enc, b, batch_size)
    new_model = copy.deepcopy(model)
    new_opt = train.optimizer(new_model.trainable_parameters(), lr, 0.01)
    with layout(kind):
        res["trainer"] = _measure(
            lambda i: trainer_batch(enc, b, batch_size, i, dev),
            lambda batch, i: trainer_step(new_model, new_opt, objective, batch, i, clip),
            2,
            steps,
            dev,
        )
        res["trainer"]["graph_breaks"] = graph_breaks(new_model, objective, enc, b, batch_size)
        res["equal"] = outputs_equal(model, objective, enc, b, batch_size, steps, clip, lr)
    res["layout"] = kind or backbone.LAYOUT
    return res


def render(res: dict) -> list[str]:
    lib, new, eq = res["library"], res["trainer"], res["equal"]
    out = [f"step against the library step (trainer layout: {res['layout']}), per step:"]
    for what, key, fmt in (
        ("kernel ops", "ops", "{:,.0f}"),
        ("host syncs", "syncs", "{:,.0f}"),
        ("host ms", "host_ms", "{:,.1f}"),
        ("graph breaks", "graph_breaks", "{:,.0f}"),
    ):
        ratio = f"  ({lib[key] / new[key]:.2f}x fewer)" if new[key] else ""
        out.append(f"  {what:<13} library {fmt.format(lib[key]):>9}   trainer {fmt.format(new[key]):>9}{ratio}")
    if new["norm_ops"] > 2 * new["norms"]:  # a CPU build: RMSNorm decomposed
        fused = new["ops"] - new["norm_ops"] + 2 * new["norms"]
        out.append(
            f"  of the trainer's ops, {new['norm_ops']:,} are its {new['norms']} RMSNorms, which this torch build "
            f"decomposes; with one fused kernel each way (torch's CUDA build): {fused:,} ops"
        )
    out.append(f"  library syncs at: {lib['sync_sites']}")
    out.append(f"  trainer syncs at: {new['sync_sites']}")
    out.append(
        f"  outputs over {len(eq['losses_library'])} steps from the same weights: losses within "
        f"{eq['loss_rel']:.1e} (relative), gradients {eq['grad_rel']:.1e}, weight updates {eq['update_rel']:.1e}"
    )
    return out
