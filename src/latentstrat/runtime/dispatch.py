"""What a piece of torch code asks of the machine, counted on whatever device it runs: the
kernel ops it dispatches (aten ops that compute, not views), the host syncs among them, and the
reads of tensor values by the host (`.item()`, `float(t)`, `.tolist()`, `.cpu()`, ...).

A host sync is an op whose result the host must wait for on an accelerator: a value read back
(`_local_scalar_dense`: `.item()`, `float()`, `int()`, `bool()`), an op whose output shape
depends on the data (`nonzero`, `masked_select`, `unique`, boolean indexing, `repeat_interleave`
without its output size) or a comparison answered on the host (`equal`, `is_nonzero`). Counted
on the CPU they show where a GPU step would stall, without a GPU: the trainer's test holds the
step to none between logging points (tests/test_step.py), and the step benchmarks print them
(`python -m latentstrat.bench train`, `bench seedscale`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "nonzero",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "equal",
        "is_nonzero",
    }
)
# value reads through Python: each ends in a sync on an accelerator (`.cpu()` and `.numpy()` copy
# the tensor to the host; on the CPU they dispatch nothing, so they are counted here)
HOST_READS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__"})
# ops that only describe a tensor (no kernel runs)
_NO_KERNEL = frozenset({"detach", "lift_fresh", "alias", "_unsafe_view", "set_"})


def _is_sync(func, args, kwargs) -> bool:
    name = func._schema.name.split("::")[-1]
    if name in SYNC_OPS:
        return True
    if name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3:
        return isinstance(args[0], torch.Tensor) and not isinstance(args[1] if len(args) > 1 else None, int)
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):  # boolean indices: a nonzero
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    return False


@dataclass
class Counts:
    """Ops by name (kernels only), host syncs by name, host reads by method."""

    ops: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)
    reads: Counter = field(default_factory=Counter)

    @property
    def n_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def n_syncs(self) -> int:
        """Syncs among the dispatched ops plus the host's reads of tensor values."""
        return sum(self.syncs.values()) + sum(self.reads.values())

    def where(self, k: int = 8) -> str:
        both = self.syncs + self.reads
        return ", ".join(f"{n} x{c}" for n, c in both.most_common(k)) or "none"


class _Dispatch(TorchDispatchMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if not func.is_view and name not in _NO_KERNEL:
            self.counts.ops[name] += 1
        if _is_sync(func, args, kwargs):
            self.counts.syncs[name] += 1
        return func(*args, **kwargs)


class _Reads(TorchFunctionMode):
    def __init__(self, counts: Counts):
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.counts.reads[name] += 1
        elif name == "to" and _to_host(args, kwargs or {}):
            self.counts.reads["to(cpu)"] += 1  # from an accelerator: never on a CPU run
        return func(*args, **(kwargs or {}))


def _to_host(args, kwargs) -> bool:
    dev = kwargs.get("device", args[1] if len(args) > 1 else None)
    src = args[0] if args and isinstance(args[0], torch.Tensor) else None
    to_cpu = isinstance(dev, (str, torch.device)) and str(dev).startswith("cpu")
    return to_cpu and src is not None and src.device.type != "cpu"


class count:
    """`with count() as c:` counts the kernel ops, host syncs and host reads of the block."""

    def __enter__(self) -> Counts:
        self.counts = Counts()
        self._modes = [_Reads(self.counts), _Dispatch(self.counts)]
        for m in self._modes:
            m.__enter__()
        return self.counts

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)
        return False
