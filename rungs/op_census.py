"""Count what a piece of work asks the device to do, op by op: kernels, bytes moved and GEMM FLOPs.

`OpCensus` is a `TorchDispatchMode`: every aten op that reaches it is classified (GEMM, attention,
cast, copy, gather/scatter, fill, elementwise, reduction, other; views and metadata ops move nothing
and are not counted) and charged the bytes of the tensors it reads and writes and, for a GEMM, its
multiply-add FLOPs. It runs under `FakeTensorMode` as well as on real tensors, so a block of a
model at full widths can be counted on a CPU without allocating it (`count_fake`).

Bytes are the proxy for the elementwise passes between the GEMMs: an op is charged the whole of
every tensor it takes or returns (inputs read once, outputs written once, an in-place or `out=`
argument written once and, in place, read once), which is what a memory-bound kernel moves. Index
ops are charged their index, the tensor they read and the one they write. `modelled_seconds`
turns a census into a device time with two rates (GEMM FLOP/s, memory bytes/s) and a fixed cost
per kernel: a roofline estimate, not a measurement.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_leaves

T = TypeVar("T")

__all__ = ["CATEGORIES", "OpCensus", "OpRecord", "active_census", "count_fake", "gemm_flops", "modelled_seconds"]

CATEGORIES = ("gemm", "attention", "cast", "copy", "index", "fill", "elementwise", "reduction", "fused", "other")

_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "addmv", "mv", "dot", "vdot", "_addmm_activation"}
_ATTENTION_PREFIXES = ("_scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention",
                       "flex_attention")
_COPIES = {"clone", "copy_", "cat", "stack", "constant_pad_nd", "repeat", "slice_backward", "select_backward",
           "slice_scatter", "select_scatter", "narrow_copy", "contiguous", "flip", "roll", "diagonal_backward",
           "expand_copy", "_pad_enum", "as_strided_scatter"}
_INDEX = {"index_select", "index_copy", "index_copy_", "index_add", "index_add_", "index", "index_put",
          "index_put_", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
          "scatter_reduce_", "embedding", "embedding_dense_backward", "take", "masked_scatter", "masked_fill",
          "masked_fill_"}
_FILLS = {"zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
          "fill_", "zero_", "arange", "scalar_tensor", "randn", "rand", "normal_", "uniform_", "randint", "randperm",
          "eye"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm", "topk", "sort",
               "argsort", "cumsum", "cumprod", "_softmax", "_log_softmax", "_softmax_backward_data",
               "_log_softmax_backward_data", "logsumexp", "prod", "var", "std", "var_mean", "all", "any",
               "searchsorted", "argmax", "argmin", "nll_loss_forward", "nll_loss_backward", "_linalg_vecdot",
               "linalg_vecdot", "count_nonzero", "bincount"}
# In-place writes of a source's rows into self at an index: they move the source, not all of self.
_INDEX_WRITES = {"index_copy_", "index_add_", "scatter_", "scatter_add_"}
# Ops that move no data (metadata, aliasing, device queries) whatever their schema says.
# Allocations without a fill move nothing either.
_FREE = {"detach", "alias", "lift_fresh", "sym_size", "sym_stride", "sym_numel", "is_same_size", "_unsafe_view",
         "_local_scalar_dense", "set_", "resize_", "record_stream", "_assert_async", "_assert_tensor_metadata",
         "empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "promote_types", "result_type"}


def _base_name(func) -> str:
    return func._schema.name.split("::")[-1]


def category(func, args, kwargs) -> str | None:
    """The census category of an op call; None for an op that moves no data."""
    name = _base_name(func)
    if getattr(func, "is_view", False) or name in _FREE or func.namespace not in ("aten", "prims"):
        return None
    if name in _GEMMS:
        return "gemm"
    if name.startswith(_ATTENTION_PREFIXES):
        return "attention"
    if name in ("_to_copy", "to", "_to_dtype"):
        return "cast" if _changes_dtype(args, kwargs) else "copy"
    if name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor) and args[0].dtype != args[1].dtype:
        return "cast"
    if name in _COPIES:
        return "copy"
    if name in _INDEX:
        return "index"
    if name in _FILLS:
        return "fill"
    if name in _REDUCTIONS:
        return "reduction"
    if torch.Tag.pointwise in func.tags or name.endswith("_backward") or name.startswith("_foreach_"):
        return "elementwise"
    return "other"


def _changes_dtype(args, kwargs) -> bool:
    dtype = kwargs.get("dtype")
    return dtype is not None and isinstance(args[0], torch.Tensor) and dtype != args[0].dtype


def gemm_flops(name: str, args) -> int:
    """2 x multiply-adds of a GEMM call (grouped_mm: every row of its first operand)."""
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm", "addmv", "_addmm_activation") else (args[0], args[1])
    if name == "_grouped_mm":
        if a.ndim == 2 and b.ndim == 3:          # (rows, K) x (E, K, N)
            return 2 * a.shape[0] * a.shape[1] * b.shape[-1]
        if a.ndim == 2 and b.ndim == 2:          # (K, rows) x (rows, N) -> (E, K, N)
            return 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * max(a.shape[0], b.shape[0])
    if a.ndim == 1 and b.ndim == 1:
        return 2 * a.numel()
    batch = a.shape[0] if a.ndim == 3 else 1
    return 2 * batch * a.shape[-2] * a.shape[-1] * (b.shape[-1] if b.ndim > 1 else 1)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class OpRecord:
    """One op call: its name, category, bytes read and written, GEMM FLOPs, and its tensors' shapes."""
    name: str
    category: str
    read_bytes: int
    write_bytes: int
    flops: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @property
    def bytes(self) -> int:
        return self.read_bytes + self.write_bytes


def _record(func, args, kwargs, out) -> OpRecord | None:
    kind = category(func, args, kwargs)
    if kind is None:
        return None
    schema = func._schema
    read = write = 0
    written: set[int] = set()
    for i, arg in enumerate(schema.arguments):
        value = kwargs.get(arg.name, args[i] if i < len(args) and not arg.kwarg_only else None)
        tensors = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
        is_write = arg.alias_info is not None and arg.alias_info.is_write
        for t in tensors:
            if is_write:
                written.add(id(t))
                write += _nbytes(t)
                if not arg.name.startswith("out"):
                    read += _nbytes(t)              # in place: read, then written
            else:
                read += _nbytes(t)
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and id(t) not in written]
    write += sum(_nbytes(t) for t in outs)
    if kind == "fill":
        read = 0
    name = _base_name(func)
    if name == "copy_":                         # writes self, reads only the source
        read, write = _nbytes(args[1]), _nbytes(args[0])
    elif name in _INDEX_WRITES and isinstance(args[-1], torch.Tensor):
        index, source = args[2], args[-1]       # self.index_copy_(dim, index, source): source-sized rows
        read, write = _nbytes(index) + _nbytes(source), _nbytes(source)
    flops = gemm_flops(name, args) if kind == "gemm" else 0
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    return OpRecord(name, kind, read, write, flops, tuple(tuple(t.shape) for t in tensors),
                    tuple(str(t.dtype).removeprefix("torch.") for t in tensors))


def _accumulator_copy(record: OpRecord, func, args, kwargs) -> OpRecord | None:
    """The copy a CUDA addmm/baddbmm makes first: out-of-place with beta != 0, cuBLAS accumulates into
    its output, so the input is copied there before the GEMM (one read, one write of the input)."""
    if record.name not in ("addmm", "baddbmm") or kwargs.get("beta", 1) == 0:
        return None
    if func._schema.overload_name not in ("", "default"):
        return None                           # in place or out=: accumulates where the input already is
    acc = args[0]
    return OpRecord(f"{record.name}_input_copy", "copy", _nbytes(acc), _nbytes(acc), 0, (tuple(acc.shape),),
                    (str(acc.dtype).removeprefix("torch."),))


@dataclass
class OpCensus(TorchDispatchMode):
    """`with OpCensus() as census: work()`; then `census.records` (one `OpRecord` per counted op
    call, in order), `census.by_category()`, `census.by_op()` and `census.summary()`.

    fuse_pointwise=True counts each call of a `rungs.pointwise.fused` function as the one kernel it
    compiles to on a GPU (category "fused": its tensor arguments read, its outputs written) instead
    of the eager ops it runs here."""

    fuse_pointwise: bool = False
    records: list[OpRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        self._paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self._paused:
            record = _record(func, args, kwargs, out)
            if record is not None:
                self.records.append(record)
                copy = _accumulator_copy(record, func, args, kwargs)
                if copy is not None:
                    self.records.append(copy)
        return out

    def count_as_one_kernel(self, name: str, fn: Callable, args: tuple):
        """Run fn(*args) uncounted and record it as the one kernel it compiles to: its tensor inputs
        read once, its outputs written once. Where it takes part in autograd, its backward is
        recorded as one kernel too: the gradients of its outputs and its inputs read, the gradients
        of its inputs written (what a compiled forward/backward pair moves, give or take what it saves)."""
        short = name.rsplit(".", 1)[-1]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return _OneKernelRegion.apply(self, short, fn, args, *tensors)
        with self._pause():
            out = fn(*args)
        self._add_fused(short, tensors, [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out

    def _add_fused(self, name: str, reads: list[torch.Tensor], writes: list[torch.Tensor]) -> None:
        self.records.append(OpRecord(name, "fused", sum(map(_nbytes, reads)), sum(map(_nbytes, writes)), 0,
                                     tuple(tuple(t.shape) for t in reads),
                                     tuple(str(t.dtype).removeprefix("torch.") for t in reads)))

    @contextmanager
    def _pause(self):
        self._paused = True
        try:
            yield
        finally:
            self._paused = False

    def by_category(self) -> dict[str, dict[str, int]]:
        """category -> {kernels, bytes, flops}, every category present (zeros where none ran)."""
        table = {c: {"kernels": 0, "bytes": 0, "flops": 0} for c in CATEGORIES}
        for r in self.records:
            row = table[r.category]
            row["kernels"] += 1
            row["bytes"] += r.bytes
            row["flops"] += r.flops
        return table

    def by_op(self) -> dict[str, dict[str, int]]:
        """"category/op" -> {kernels, bytes}, largest bytes first."""
        table: dict[str, Counter] = defaultdict(Counter)
        for r in self.records:
            table[f"{r.category}/{r.name}"].update(kernels=1, bytes=r.bytes)
        return {k: dict(v) for k, v in sorted(table.items(), key=lambda kv: -kv[1]["bytes"])}

    def summary(self, gemm_flops_per_second: float, bytes_per_second: float,
                seconds_per_kernel: float) -> dict[str, object]:
        cats = self.by_category()
        between = [c for c in CATEGORIES if c not in ("gemm", "attention")]
        return {
            "kernels": len(self.records),
            "gemm_flops": cats["gemm"]["flops"],
            "gemm_bytes": cats["gemm"]["bytes"],
            "bytes_between_gemms": sum(cats[c]["bytes"] for c in between),
            "kernels_between_gemms": sum(cats[c]["kernels"] for c in between),
            "by_category": cats,
            "modelled_seconds": modelled_seconds(self.records, gemm_flops_per_second, bytes_per_second,
                                                 seconds_per_kernel),
        }


def modelled_seconds(records: Iterable[OpRecord], gemm_flops_per_second: float, bytes_per_second: float,
                     seconds_per_kernel: float) -> dict[str, float]:
    """Roofline device time by category: each op max(FLOPs / GEMM rate, bytes / memory rate) plus a
    fixed cost per kernel; "total" is their sum."""
    times: Counter = Counter()
    for r in records:
        times[r.category] += max(r.flops / gemm_flops_per_second, r.bytes / bytes_per_second) + seconds_per_kernel
    out = {c: float(times[c]) for c in CATEGORIES}
    out["total"] = float(sum(times.values()))
    return out


class _OneKernelRegion(torch.autograd.Function):
    """A fused region under autograd, counted as one forward and one backward kernel."""

    @staticmethod
    def forward(ctx, census, name, fn, args, *tensors):
        ctx.census, ctx.name, ctx.fn, ctx.args = census, name, fn, args
        ctx.save_for_backward(*tensors)
        with census._pause():
            out = fn(*args)
        census._add_fused(name, list(tensors), [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
        return out

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[4:]
        leaves = [t.detach().requires_grad_(need) for t, need in zip(saved, needs)]
        it = iter(leaves)
        args = [next(it) if isinstance(a, torch.Tensor) else a for a in ctx.args]
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        with ctx.census._pause(), torch.enable_grad():
            outs = [o for o in tree_leaves(ctx.fn(*args)) if isinstance(o, torch.Tensor)]
            pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
            found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        by_leaf = dict(zip(map(id, wanted), found))
        results = [by_leaf.get(id(leaf)) for leaf in leaves]
        ctx.census._add_fused(ctx.name + "_backward", [*(g for g in grads if g is not None), *saved],
                              [r for r in results if r is not None])
        return (None, None, None, None, *results)


def active_census() -> OpCensus | None:
    """The innermost OpCensus on the dispatch-mode stack, if one is counting."""
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, OpCensus):
            return mode
    return None


def count_fake(setup: Callable[[], T], work: Callable[[T], object], *, fuse_pointwise: bool = False) -> OpCensus:
    """Build with `setup()` and count `work(built)`, both under `FakeTensorMode`: shapes and dtypes as
    on a device, no memory allocated, no arithmetic done. Only `work` is counted."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        built = setup()
        census = OpCensus(fuse_pointwise=fuse_pointwise)
        with census:
            work(built)
    return census
