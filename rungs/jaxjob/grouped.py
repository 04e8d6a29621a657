"""Grouped matmuls over row blocks: each block of `block_rows` rows belongs to one expert.

The routed experts lay one round's rows out expert by expert, each expert's rows padded to whole
blocks (`rungs.jaxjob.moe.row_layout`), so a block's rows all multiply the same expert matrix:

    out[b] = a[b] @ w[block_expert[b]].T        a (nb * block_rows, K), w (E, N, K) → (nb * block_rows, N)

Two implementations of that product, with the same layout and the same gradients:

- "xla": one batched einsum against the blocks' gathered weights, `w[block_expert]` (nb, N, K).
  Any backend; on XLA:CPU it is the fastest path measured. Its cost is the gather: nb copies of an
  N × K matrix each way (at L18's 768 × 768 experts, 1,408 blocks of 64 rows: 1.7 GB in bf16 per
  projection, 3.3 GB for the fp32 gradient XLA:CPU makes of it).
- "pallas": a Pallas kernel that reads each block's expert matrix in place (no gather) and a
  second one for the weight gradient, dW[e] = sum over e's blocks of dy_bᵀ a_b, accumulated in
  fp32; Triton on a CUDA GPU, the Pallas interpreter elsewhere (tests run it so on the CPU).
  The memory is the rows' and the weights', nothing of size nb × N × K.

`lax.ragged_dot` is not here: it takes group sizes, not blocks (`rungs.jaxjob.moe._gmm`), and
XLA on NVIDIA GPUs expands it into a dense dot over an (E, rows, K) operand (84 GiB at L18 widths:
docs/performance/jax.md).
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["IMPLEMENTATIONS", "GroupedMatmulError", "gmm", "pallas_interpreted"]

IMPLEMENTATIONS = ("xla", "pallas")

# Tiles of the Pallas kernels (Triton wants powers of two, at least 16 along every dot axis).
_TILE_N = 128
_TILE_K = 64
_MIN_TILE = 16
# The xla path gathers at most this many weight elements at a time (2^25: 64 MiB in bf16), so its
# temporaries stay bounded whatever the rows; cpu-demo's rounds fit in one step.
_GATHERED_ELEMENTS = 1 << 25


class GroupedMatmulError(ValueError):
    """A grouped matmul whose sizes the chosen implementation cannot take."""


def pallas_interpreted() -> bool:
    """Whether the Pallas kernels run interpreted here (no CUDA GPU: Triton needs one)."""
    return jax.default_backend() not in ("gpu", "cuda")


def gmm(a: jax.Array, w: jax.Array, block_expert: jax.Array, *, block_rows: int, impl: str = "xla",
        interpret: bool | None = None) -> jax.Array:
    """a (nb * block_rows, K) times its blocks' experts of w (E, N, K) → (nb * block_rows, N), a's dtype.

    `block_expert` (nb,) int32, non-decreasing (each expert's blocks consecutive, as `row_layout`
    makes them); E marks a block no expert uses (its rows are zeros; its output rows are zeros).
    `interpret` (pallas only; None: `pallas_interpreted()`)."""
    rows, k = a.shape
    if w.ndim != 3 or w.shape[2] != k:
        raise GroupedMatmulError(f"w must be (E, N, {k}), got {tuple(w.shape)}")
    if block_rows < 1 or rows % block_rows or block_expert.shape != (rows // block_rows,):
        raise GroupedMatmulError(f"{rows} rows, block_rows={block_rows} and block_expert {block_expert.shape} "
                                 "do not match: rows must be whole blocks, one expert index per block")
    if impl not in IMPLEMENTATIONS:
        raise GroupedMatmulError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    block_expert = block_expert.astype(jnp.int32)
    if impl == "xla":
        return _grouped("xla", block_rows, False, a, w, block_expert)
    if block_rows < _MIN_TILE or block_rows & (block_rows - 1):
        raise GroupedMatmulError(f"the pallas kernels need block_rows a power of two >= {_MIN_TILE}, got {block_rows}")
    interpret = pallas_interpreted() if interpret is None else interpret
    if interpret and _varying_axes(a, w):
        # The Pallas interpreter cannot run inside shard_map (its grid loop mixes per-device and
        # replicated indices): off a GPU, expert parallelism multiplies with the xla path, the same
        # products over the same layout.
        return _grouped("xla", block_rows, False, a, w, block_expert)
    # Pad K and N to whole tiles (zero rows and columns change no product), run, cut back.
    n = w.shape[1]
    kp, np_ = _padded(k), _padded(n)
    ap = jnp.pad(a, ((0, 0), (0, kp - k))) if kp != k else a
    wp = jnp.pad(w, ((0, 0), (0, np_ - n), (0, kp - k))) if (kp, np_) != (k, n) else w
    out = _grouped("pallas", block_rows, bool(interpret), ap, wp, block_expert)
    return out[:, :n] if np_ != n else out


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _grouped(impl: str, block_rows: int, interpret: bool, a, w, block_expert):
    """The product with its backward made of the same grouped products: da = dout w[e] and
    dW[e] = sum over e's blocks of doutᵀ a, summed in fp32 (w is read in a's dtype)."""
    if impl == "xla":
        return _xla_rows_times_experts(a, w, block_expert, block_rows, transpose_w=False)
    return _rows_times_experts(a, w, block_expert, block_rows=block_rows, interpret=interpret, transpose_w=False)


def _grouped_fwd(impl, block_rows, interpret, a, w, block_expert):
    return _grouped(impl, block_rows, interpret, a, w, block_expert), (a, w, block_expert)


def _grouped_bwd(impl, block_rows, interpret, res, dout):
    a, w, block_expert = res
    dout = dout.astype(a.dtype)
    if impl == "xla":
        da = _xla_rows_times_experts(dout, w, block_expert, block_rows, transpose_w=True)
        dw = _xla_weight_gradient(dout, a, block_expert, w.shape[0], block_rows)
    else:
        da = _rows_times_experts(dout, w, block_expert, block_rows=block_rows, interpret=interpret, transpose_w=True)
        dw = _weight_gradient(dout, a, block_expert, w.shape[0], block_rows=block_rows, interpret=interpret)
    return da, dw.astype(w.dtype), np.zeros(block_expert.shape, jax.dtypes.float0)


_grouped.defvjp(_grouped_fwd, _grouped_bwd)


# --- xla: batched einsums over gathered weights, a bounded number of blocks at a time -----------

def _chunks(n_blocks: int, n: int, k: int) -> int:
    """Blocks per step: their gathered weights at most _GATHERED_ELEMENTS (all at once if they fit)."""
    return max(1, min(n_blocks, _GATHERED_ELEMENTS // (n * k)))


def _xla_rows_times_experts(a, w, block_expert, block_rows: int, *, transpose_w: bool):
    rows, k = a.shape
    n = w.shape[2] if transpose_w else w.shape[1]
    nb, E = rows // block_rows, w.shape[0]
    per = _chunks(nb, n, k)
    steps = -(-nb // per)
    blocks = jnp.pad(a.reshape(nb, block_rows, k), ((0, steps * per - nb), (0, 0), (0, 0)))
    experts = jnp.pad(block_expert, (0, steps * per - nb), constant_values=E)
    spec = "brk,bkn->brn" if transpose_w else "brk,bnk->brn"

    def one(xs):
        x, e = xs
        out = jnp.einsum(spec, x, jnp.take(w, jnp.minimum(e, E - 1), axis=0).astype(a.dtype))
        return jnp.where((e < E)[:, None, None], out, 0)                       # unused blocks: zeros

    if steps == 1:
        out = one((blocks, experts))
    else:
        out = jax.lax.map(one, (blocks.reshape(steps, per, block_rows, k), experts.reshape(steps, per)))
    return out.reshape(steps * per * block_rows, n)[:rows]


def _xla_weight_gradient(dy, a, block_expert, n_experts: int, block_rows: int):
    rows, n = dy.shape
    k = a.shape[1]
    nb = rows // block_rows
    per = _chunks(nb, n, k)
    steps = -(-nb // per)
    pad = ((0, steps * per - nb), (0, 0), (0, 0))
    dys = jnp.pad(dy.reshape(nb, block_rows, n), pad).reshape(steps, per, block_rows, n)
    xs = jnp.pad(a.reshape(nb, block_rows, k), pad).reshape(steps, per, block_rows, k)
    experts = jnp.pad(block_expert, (0, steps * per - nb), constant_values=n_experts).reshape(steps, per)

    def step(dw, chunk):
        g, x, e = chunk
        per_block = jnp.einsum("brn,brk->bnk", g, x).astype(jnp.float32)          # (per, N, K)
        return dw.at[e].add(per_block, mode="drop"), None                          # unused blocks: dropped

    # zeros typed like the rows: under shard_map the carry must vary over the mesh axes they vary over
    like = jnp.where(False, dy.reshape(-1)[0], 0).astype(jnp.float32)
    dw, _ = jax.lax.scan(step, jnp.zeros((n_experts, n, k), jnp.float32) + like, (dys, xs, experts))
    return dw


# --- pallas ----------------------------------------------------------------------------------

def _padded(dim: int) -> int:
    return -(-dim // _MIN_TILE) * _MIN_TILE


def _tile(dim: int, cap: int) -> int:
    """The largest power of two <= cap dividing dim (dim a multiple of 16: at least 16)."""
    t = cap
    while dim % t:
        t //= 2
    return t


def _varying_axes(*inputs: jax.Array) -> frozenset:
    """The mesh axes (inside `shard_map`) any of `inputs` varies over; empty outside one. The type's
    field moved between JAX releases (`vma`, then `manual_axis_type.varying`), hence the probe."""
    out: frozenset = frozenset()
    for x in inputs:
        t = jax.typeof(x)
        axis_type = getattr(t, "manual_axis_type", None)
        out |= frozenset(axis_type.varying if axis_type is not None else getattr(t, "vma", ()))
    return out


def _out_struct(shape: tuple[int, ...], dtype: Any, *inputs: jax.Array) -> jax.ShapeDtypeStruct:
    """A kernel's output type: inside `shard_map` (expert parallelism) it varies over the mesh axes
    its inputs vary over, and must say so."""
    varying = _varying_axes(*inputs)
    if not varying:
        return jax.ShapeDtypeStruct(shape, dtype)
    if "manual_axis_type" in inspect.signature(jax.ShapeDtypeStruct).parameters:
        axis_type = jax.typeof(inputs[0]).manual_axis_type
        return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=type(axis_type)(varying=varying))
    return jax.ShapeDtypeStruct(shape, dtype, vma=varying)


def _pallas():
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plt

    return pl, plt


def _dot(x, y, x_axis: int, y_axis: int):
    """x · y contracting x's axis x_axis with y's y_axis, accumulated in fp32 (one tensor-core dot)."""
    return jax.lax.dot_general(x, y, (((x_axis,), (y_axis,)), ((), ())), preferred_element_type=jnp.float32)


def _rows_times_experts(a, w, block_expert, *, block_rows: int, interpret: bool, transpose_w: bool):
    """The forward kernel (transpose_w False: out = a w[e]ᵀ, w (E, N, K)) and the input-gradient one
    (True: out = a w[e], w (E, K', N') read as (K', N')); grid (blocks, output tiles)."""
    pl, plt = _pallas()
    rows, k = a.shape
    n = w.shape[2] if transpose_w else w.shape[1]
    tn, tk = _tile(n, _TILE_N), _tile(k, _TILE_K)

    n_experts = w.shape[0]

    def kernel(expert_ref, a_ref, w_ref, out_ref):
        i, j = pl.program_id(0), pl.program_id(1)
        e = expert_ref[i]

        def step(kk, acc):
            x = a_ref[pl.ds(i * block_rows, block_rows), pl.ds(kk * tk, tk)]              # (b, tk)
            if transpose_w:
                return acc + _dot(x, w_ref[e, pl.ds(kk * tk, tk), pl.ds(j * tn, tn)], 1, 0)
            return acc + _dot(x, w_ref[e, pl.ds(j * tn, tn), pl.ds(kk * tk, tk)], 1, 1)

        @pl.when(e < n_experts)
        def _():
            acc = jax.lax.fori_loop(0, k // tk, step, jnp.zeros((block_rows, tn), jnp.float32))
            out_ref[...] = acc.astype(out_ref.dtype)

        @pl.when(e >= n_experts)   # an unused block: zeros, no reads
        def _():
            out_ref[...] = jnp.zeros((block_rows, tn), out_ref.dtype)

    return pl.pallas_call(
        kernel, grid=(rows // block_rows, n // tn),
        in_specs=[pl.no_block_spec] * 3,
        out_specs=pl.BlockSpec((block_rows, tn), lambda i, j: (i, j)),
        out_shape=_out_struct((rows, n), a.dtype, block_expert, a, w), interpret=interpret,
        compiler_params=None if interpret else plt.CompilerParams(num_warps=4, num_stages=3),
        name="grouped_matmul_t" if transpose_w else "grouped_matmul")(block_expert, a, w)


def _weight_gradient(dy, a, block_expert, n_experts: int, *, block_rows: int, interpret: bool):
    """dW (E, N, K) fp32 with dW[e] = sum over e's blocks b of dy_bᵀ a_b; grid (experts, N tiles, K tiles),
    each program looping over its expert's consecutive blocks (none: zeros)."""
    pl, plt = _pallas()
    n, k = dy.shape[1], a.shape[1]
    tn, tk = _tile(n, _TILE_N), _tile(k, _TILE_K)
    experts = jnp.arange(n_experts, dtype=jnp.int32)
    first = jnp.searchsorted(block_expert, experts, side="left").astype(jnp.int32)         # (E,)
    count = jnp.searchsorted(block_expert, experts, side="right").astype(jnp.int32) - first

    def kernel(first_ref, count_ref, dy_ref, a_ref, out_ref):
        e, j, kk = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        start = first_ref[e]

        def step(b, acc):
            at = pl.ds((start + b) * block_rows, block_rows)
            return acc + _dot(dy_ref[at, pl.ds(j * tn, tn)], a_ref[at, pl.ds(kk * tk, tk)], 0, 0)  # (tn, tk)

        out_ref[...] = jax.lax.fori_loop(0, count_ref[e], step, jnp.zeros((tn, tk), jnp.float32))

    return pl.pallas_call(
        kernel, grid=(n_experts, n // tn, k // tk),
        in_specs=[pl.no_block_spec] * 4,
        out_specs=pl.BlockSpec((None, tn, tk), lambda e, j, kk: (e, j, kk)),
        out_shape=_out_struct((n_experts, n, k), jnp.float32, first, count, dy, a), interpret=interpret,
        compiler_params=None if interpret else plt.CompilerParams(num_warps=4, num_stages=3),
        name="grouped_matmul_dw")(first, count, dy, a)
