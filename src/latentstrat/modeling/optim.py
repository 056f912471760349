"""A cell's optimizer: AdamW over float32 weights, fused into one kernel where the device has
one (CPU and CUDA: its step counters stay on the device), torch's foreach AdamW elsewhere.

Trainable weights held in a lower precision (a bf16 backbone's LoRA adapters, which run in the
backbone's dtype so no activation is cast around an adapter) train through float32 master
copies: after the backward pass `gather` copies their gradients into the masters' (one foreach
copy), AdamW updates the masters, and `step` copies them back (one foreach copy). Gradient
clipping reads `params` (the float32 weights and the masters). The masters are part of
`state_dict`, so a resumed cell continues from the float32 values, not their rounding.
"""

from __future__ import annotations

import torch


class CellOptimizer:
    def __init__(self, params, lr: float, weight_decay: float):
        params = list(params)
        self.low = [p for p in params if p.dtype != torch.float32]
        self.masters = [p.detach().float().clone() for p in self.low]
        for m in self.masters:
            m.grad = torch.zeros_like(m)
        self.params = [p for p in params if p.dtype == torch.float32] + self.masters
        self.trained = params
        try:
            self.adamw = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay, fused=True)
        except RuntimeError:  # a device without the fused kernel
            self.adamw = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    @property
    def param_groups(self):
        return self.adamw.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.trained:
            p.grad = None

    def gather(self) -> None:
        """The lower-precision weights' gradients into their masters (float32)."""
        if self.low:
            torch._foreach_copy_([m.grad for m in self.masters], [grad_or_zero(p) for p in self.low])

    @torch.no_grad()
    def step(self) -> None:
        self.adamw.step()
        if self.low:
            torch._foreach_copy_(self.low, self.masters)

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), "masters": [m.detach().cpu() for m in self.masters]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """A state from `state_dict`, or a plain AdamW state of the same parameters (a
        checkpoint written before the masters; the masters then start from the weights)."""
        if "adamw" not in state:
            self._load_plain(state)
            return
        if len(state["masters"]) != len(self.masters):
            raise ValueError(
                f"optimizer state has {len(state['masters'])} master weights, this cell {len(self.masters)}"
            )
        for m, saved in zip(self.masters, state["masters"]):
            m.copy_(saved)
        for p, m in zip(self.low, self.masters):
            p.copy_(m)
        self.adamw.load_state_dict(state["adamw"])

    def _load_plain(self, state: dict) -> None:
        """A torch AdamW state over the trained weights in their order: the masters start from
        the weights (already loaded), the moments follow their weights into this order."""
        fp32 = [i for i, p in enumerate(self.trained) if p.dtype == torch.float32]
        new_to_old = fp32 + [i for i, p in enumerate(self.trained) if p.dtype != torch.float32]
        old = state["state"]
        state = {
            "state": {new: old[o] for new, o in enumerate(new_to_old) if o in old},
            "param_groups": [{**state["param_groups"][0], "params": list(range(len(new_to_old)))}],
        }
        for m, p in zip(self.masters, self.low):
            m.copy_(p)
        self.adamw.load_state_dict(state)


def grad_or_zero(p) -> torch.Tensor:
    """A weight's gradient, zeros where the backward pass gave it none."""
    return p.grad if p.grad is not None else torch.zeros_like(p)
