"""Chains of elementwise ops between the GEMMs: eager where they run on a CPU, one kernel each on a GPU.

Eager PyTorch runs every op of `silu(a) * b * g` as its own kernel, each reading and writing whole
operands: between the MoE's grouped GEMMs that is most of the device time at mai-base-2's widths
(experts of 768 x 768, where a GEMM does ~1.5 kFLOP per byte it touches and a pointwise pass ~0).
A function decorated with `fused` runs compiled on CUDA (`torch.compile`: inductor emits one Triton
kernel for the chain, its row reduction included) and eagerly elsewhere. The math is the same
function either way; on a GPU the compiled one rounds its float32 intermediates once, at the end.

Compiling is skipped inside an enclosing `torch.compile` (the enclosing graph takes the ops in),
when `set_compiled(False)` says so (benchmarks compare the two), and for good after a compile
failure of that function (logged once). Under an `OpCensus` with `fuse_pointwise=True` a call is
counted as the one kernel it is on a GPU: the bytes of its inputs and outputs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from rungs.op_census import active_census

__all__ = ["fused", "rope_rotate", "set_compiled", "swiglu", "swiglu_backward"]

logger = logging.getLogger(__name__)

Fn = TypeVar("Fn", bound=Callable[..., object])
_STATE = {"compiled": True}
_FAILED: set[str] = set()


def set_compiled(enabled: bool) -> bool:
    """Compile `fused` functions on CUDA (the default) or run them eagerly everywhere; returns the
    previous setting."""
    previous = _STATE["compiled"]
    _STATE["compiled"] = bool(enabled)
    return previous


def _tensors(args) -> list[Tensor]:
    return [a for a in args if isinstance(a, Tensor)]


def fused(fn: Fn) -> Fn:
    """Run `fn` (pointwise ops on tensors, at most a row reduction) as one compiled kernel on CUDA."""
    compiled: Callable | None = None
    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def run(*args):
        nonlocal compiled
        tensors = _tensors(args)
        census = active_census()
        if census is not None and census.fuse_pointwise:
            return census.count_as_one_kernel(name, fn, args)
        if (not _STATE["compiled"] or name in _FAILED or torch.compiler.is_compiling()
                or not tensors or tensors[0].device.type != "cuda"):
            return fn(*args)
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        try:
            return compiled(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # a backend that cannot compile this: eager from now on
            _FAILED.add(name)
            logger.warning("compiling %s failed (%s: %s); running it eagerly", name, type(err).__name__, err)
            return fn(*args)

    run.eager = fn  # type: ignore[attr-defined]
    return run  # type: ignore[return-value]


@fused
def swiglu(a: Tensor, b: Tensor, gate: Tensor | None) -> Tensor:
    """silu(a) * b, times gate[:, None] when a gate is given: (rows, H) in a's dtype."""
    h = F.silu(a) * b
    return h * gate.unsqueeze(1) if gate is not None else h


@fused
def swiglu_backward(dh: Tensor, a: Tensor, b: Tensor, gate: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of h = gate[:, None] * silu(a) * b given dh = dL/dh (rows, H), all in a's dtype:
    (h, d[a | b] (rows, 2H), dgate (rows,)). h is returned for the weight gradient of the GEMM that
    consumed it; dgate is a row dot product (float32 sums, rounded once to a's dtype)."""
    g = gate.unsqueeze(1)
    silu = F.silu(a)
    ungated = silu * b
    dgate = torch.linalg.vecdot(dh, ungated)
    dg = dh * g
    da = torch.ops.aten.silu_backward(dg * b, a)
    return ungated * g, torch.cat([da, dg * silu], dim=1), dgate


@fused
def rope_rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (2j, 2j+1) of x (..., hd) by the angles whose cos and sin (broadcastable
    to x's (..., hd/2)) are given: real arithmetic in float32, returned in x's dtype. What a compiled
    kernel fuses; `rungs.model.apply_rope`'s complex multiply is the faster eager form on a CPU."""
    pairs = x.float().unflatten(-1, (-1, 2))                   # (..., hd/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).to(x.dtype)
