"""Count the places where a step makes the host wait for the device, on any device (CPU included).

A CUDA step synchronises with the host when it reads a device value (`.item()`, `int(t)`,
`float(t)`, `.tolist()`, `if t:`, all of which reach `aten._local_scalar_dense` or `aten.is_nonzero`),
when an op's output size depends on the data (the host must learn the size before it can
allocate: `nonzero`, `masked_select`, `unique`, boolean-mask indexing, `repeat_interleave`
without `output_size`, `bincount`), when it copies a device tensor to the host, or when it copies
host memory to the device without `non_blocking` (`cpu_tensor.to("cuda")`, and a device tensor made
from host data: `torch.as_tensor(0.5, device=x.device)`, `torch.tensor([...], device=...)`). The
last kind waits for every kernel queued before it: CUDA copies pageable host memory with
`cudaMemcpy` and a stream synchronisation (`torch.cuda.set_sync_debug_mode` flags it); a value the
device needs is better made there (`torch.full((), 0.5, device=x.device)`: a fill kernel, no copy).
`torch.cuda.set_sync_debug_mode` finds these on a GPU; `HostSyncCounter`, a `TorchDispatchMode`,
finds them by op on any device, so a CPU test can assert that a training step has none.

Compiled code and higher-order ops run under the counter as they run without it. A function compiled
with `torch.compile` (FlexAttention on CUDA) runs its compiled kernels: by default Dynamo does not
run compiled code under a user dispatch mode but falls back to eager, where FlexAttention becomes a
reference kernel that materialises every score. A higher-order op reached eagerly (FlexAttention
uncompiled) runs whole, with the counter off inside it: torch refuses a mode that does not declare
it handles them. Neither is looked into: a compiled region's kernels and a higher-order op's inner
ops are not counted (`HostSyncCounter.uninspected` names the higher-order ops that ran);
`torch.cuda.set_sync_debug_mode` sees the whole step.
"""

from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch._ops import HigherOrderOperator
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncCounter"]

# Ops that read a device value on the host.
_READS = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal", "aten::allclose"}
# Ops whose output size depends on the values of their input.
_DATA_SIZED = {"aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique", "aten::_unique2",
               "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::bincount",
               "aten::argwhere", "aten::histogram"}


def _device_to_host(func_name: str, args, kwargs) -> bool:
    src = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if func_name == "aten::_to_copy" and src is not None and src.device.type != "cpu":
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu"
    if func_name == "aten::copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


def _host_to_device(func_name: str, args, kwargs) -> bool:
    """A blocking copy of CPU memory into an accelerator tensor (`non_blocking` copies do not wait)."""
    if func_name == "aten::_to_copy" and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu":
        device = kwargs.get("device")
        return device is not None and torch.device(device).type != "cpu" and not kwargs.get("non_blocking", False)
    if func_name == "aten::copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        return args[0].device.type != "cpu" and args[1].device.type == "cpu" and blocking
    return False


def sync_reason(func, args, kwargs) -> str | None:
    """Why this op call synchronises host and device ("read", "data-sized", "to-host", "to-device"),
    or None."""
    name = func._schema.name
    if name in _READS:
        return "read"
    if name in _DATA_SIZED:
        return "data-sized"
    if name == "aten::repeat_interleave" and kwargs.get("output_size") is None and not (
            len(args) > 1 and isinstance(args[1], int)):
        return "data-sized"
    if name in ("aten::index", "aten::index_put", "aten::index_put_") and len(args) > 1:
        indices = args[1] or ()
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return "data-sized"                                       # a boolean mask: nonzero inside
    if _device_to_host(name, args, kwargs):
        return "to-host"
    if _host_to_device(name, args, kwargs):
        return "to-device"
    return None


# Tensor methods that read values on the host without an aten op on a CPU tensor (on CUDA they copy
# to the host first, which the dispatch mode also sees).
_HOST_METHODS = {torch.Tensor.tolist: "Tensor.tolist", torch.Tensor.numpy: "Tensor.numpy",
                 torch.Tensor.__array__: "Tensor.__array__"}


# Factories that build a tensor from host data (numbers, lists, arrays) and copy it to `device`
# inside one C++ call: no aten op of theirs reaches a dispatch mode, only the function itself.
_FROM_HOST_DATA = {torch.tensor: "torch.tensor", torch.as_tensor: "torch.as_tensor", torch.asarray: "torch.asarray"}


def _device_argument(args, kwargs):
    device = kwargs.get("device")
    if device is None and len(args) > 2 and not isinstance(args[2], torch.Tensor):
        device = args[2]                                   # as_tensor(data, dtype, device) positionally
    return device


class _MethodCounter(TorchFunctionMode):
    def __init__(self, record) -> None:
        super().__init__()
        self.record = record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_METHODS:
            self.record(f"{_HOST_METHODS[func]} (read)")
        elif func in _FROM_HOST_DATA and _device_argument(args, kwargs) is not None and not (
                args and isinstance(args[0], torch.Tensor)):
            # host data sent to a device; on the CPU any device counts, as reads do (it is the
            # device the tensors of a GPU run live on)
            self.record(f"{_FROM_HOST_DATA[func]} (to-device)")
        return func(*args, **kwargs)


def _on_accelerator(args, kwargs) -> bool:
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
    return any(t.device.type != "cpu" for t in tensors)


class HostSyncCounter(TorchDispatchMode):
    """`with HostSyncCounter() as c: step()`; then `c.total`, `c.counts` (op -> calls) and
    `c.where` (op -> the innermost frame outside torch of its first call, to find it).

    accelerator_only=False (the CPU tests): every read counts, since on the CPU the tensors that
    would live on the GPU cannot be told apart. accelerator_only=True (a GPU run): only ops on a
    non-CPU tensor count, so reading a CPU-resident scalar (AdamW's step counter) is not a sync;
    tensor methods are then seen as the to-host copies they make, and no torch-function mode is
    pushed (under one, Dynamo would recompile every compiled function): tensors made from host data
    with a device (`torch.as_tensor(x, device=...)`), which no dispatch mode sees, are then left to
    `torch.cuda.set_sync_debug_mode`. Blocking copies of CPU tensors to a device count in both modes.

    `uninspected` (name -> calls): higher-order ops that ran whole, their inner ops not counted."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True  # compiled code runs compiled under the counter (module docstring)

    def __init__(self, accelerator_only: bool = False) -> None:
        super().__init__()
        self.accelerator_only = accelerator_only
        self.counts: Counter[str] = Counter()
        self.uninspected: Counter[str] = Counter()
        self.where: dict[str, str] = {}
        self._methods = None if accelerator_only else _MethodCounter(self._record)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _record(self, key: str) -> None:
        self.counts[key] += 1
        if key not in self.where:
            frames = [f for f in traceback.extract_stack() if "/torch/" not in f.filename and f.filename != __file__]
            self.where[key] = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"

    def __enter__(self):
        if self._methods is not None:
            self._methods.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            if self._methods is not None:
                self._methods.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):  # torch has taken the counter off the stack for it
            self.uninspected[func.name()] += 1
            return func(*args, **kwargs)
        reason = sync_reason(func, args, kwargs)
        if reason is not None and (not self.accelerator_only or reason == "to-device" or _on_accelerator(args, kwargs)):
            self._record(f"{func._schema.name} ({reason})")
        return func(*args, **kwargs)
