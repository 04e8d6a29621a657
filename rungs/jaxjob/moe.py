"""Routed SwiGLU experts in JAX: dropless, multi-round, fixed shapes (the JAX twin of `rungs.moe`).

Same contract as `rungs.moe.RoutedExperts`: out[t] = sum_j gate[t, j] * expert(idx[t, j])(x[t]),
computed in rounds by the same plan (`rungs.moe.plan_rounds`, here vectorised over experts so it
runs inside jit): per group and round each expert is guaranteed min(remaining, capacity) rows and
the group's spare slots go, by capped cumulative sum, to its overloaded experts starting at expert
(round mod group_size). Every round computes on a buffer of a fixed number of rows, so one jit
serves every step and the live memory is set by T*k, the capacity and the widths, never by skew:
skew costs rounds (time), not memory.

The round loop is a `lax.while_loop` inside a `custom_vjp` (a while loop has no reverse-mode rule,
and keeping every round's activations would make memory grow with skew): backward runs the same
rounds again, recomputes each round's activations and pulls the cotangent through them with
`jax.vjp`, accumulating weight gradients in fp32. Input and gate gradients land in per-pair rows
and the k slots of a token are summed in slot order, as in the torch module.

Grouped matmul, three paths (`default_backend()` picks by platform):
- "blocks": each expert's rows of the round padded to a multiple of `block_rows`, the buffer cut
  into blocks that each belong to one expert, and one batched einsum per projection against the
  blocks' gathered weights (`grouped.gmm`, impl "xla"). At most E partial blocks of padding per
  round; the XLA:CPU path.
- "pallas": the same blocks, multiplied by Pallas kernels that read each block's expert matrix in
  place (`grouped.gmm`, impl "pallas": Triton on a CUDA GPU, interpreted elsewhere); the GPU path.
- "ragged": `jax.lax.ragged_dot` over the round's rows packed in expert order. A grouped kernel
  on TPU; XLA on NVIDIA GPUs and XLA:CPU expand it into a dense dot over an (E, rows, K) operand
  (E x the FLOPs, and 84 GiB per operand at L18 widths: docs/performance/jax.md), so it is kept as
  a reference and a benchmark candidate, never chosen by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from rungs.jaxjob.grouped import gmm

__all__ = ["BACKENDS", "Dispatch", "dispatch_for", "default_backend", "round_take", "plan_rounds",
           "count_per_expert", "rounds_needed", "row_layout", "expert_rows", "sorted_pairs", "local_routed_experts"]

_ROW_ALIGN = 8  # the torch module's buffer rounding, kept so buffer sizes agree


BACKENDS = ("blocks", "pallas", "ragged")


def default_backend() -> str:
    """The Pallas grouped kernels on a CUDA GPU, the batched einsum over padded blocks elsewhere."""
    return "pallas" if jax.default_backend() in ("gpu", "cuda") else "blocks"


@dataclass(frozen=True)
class Dispatch:
    """Static sizes of one call (hashable: a jit constant)."""

    n_experts: int
    group_size: int
    capacity: int        # per-expert guaranteed rows per round
    buffer_rows: int     # rows every round computes on (ragged path)
    block_rows: int      # rows per block (blocks and pallas paths)
    backend: str         # one of BACKENDS
    capacity_per_expert: int | None = None  # as configured (None: one round fits all pairs of the call)

    @property
    def slab_rows(self) -> int:
        return self.group_size * self.capacity

    @property
    def n_blocks(self) -> int:
        # Each expert's rows padded to whole blocks add fewer than one block per expert.
        return -(-self.buffer_rows // self.block_rows) + self.n_experts


def dispatch_for(n_tokens: int, top_k: int, n_experts: int, *, capacity_per_expert: int | None = None,
                 group_size: int | None = None, backend: str | None = None, block_rows: int = 64) -> Dispatch:
    """Sizes exactly as `RoutedExperts.forward` derives them (capacity None: one round always fits)."""
    group_size = n_experts if group_size is None else group_size
    if group_size < 1 or n_experts % group_size:
        raise ValueError(f"group_size={group_size} must be >= 1 and divide n_experts={n_experts}")
    if capacity_per_expert is not None and capacity_per_expert < 1:
        raise ValueError(f"capacity_per_expert must be >= 1 or None, got {capacity_per_expert}")
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if block_rows < 1 or (backend == "pallas" and (block_rows < 16 or block_rows & (block_rows - 1))):
        raise ValueError(f"block_rows must be >= 1 (a power of two >= 16 for pallas), got {block_rows}")
    n_pairs = n_tokens * top_k
    capacity = capacity_per_expert or max(1, math.ceil(n_pairs / group_size))
    buffer_rows = min((n_experts // group_size) * group_size * capacity, max(n_pairs, 1))
    buffer_rows = -(-buffer_rows // _ROW_ALIGN) * _ROW_ALIGN
    # pallas keeps its block size (the kernels' tile); blocks need not be larger than the buffer
    rows = block_rows if backend == "pallas" else min(block_rows, buffer_rows)
    return Dispatch(n_experts, group_size, capacity, buffer_rows, rows, backend, capacity_per_expert)


def count_per_expert(expert_idx: jax.Array, n_experts: int) -> jax.Array:
    """(E,) int32: how many (token, slot) pairs chose each expert."""
    return jnp.zeros((n_experts,), jnp.int32).at[expert_idx.reshape(-1)].add(1)


def rounds_needed(counts: jax.Array, d: Dispatch) -> jax.Array:
    """ceil(max group load / slab rows), the torch module's `last_stats["rounds"]`."""
    loads = counts.reshape(-1, d.group_size).sum(-1)  # (groups,)
    return -(-loads.max() // d.slab_rows)


def round_take(remaining: jax.Array, r: jax.Array, d: Dispatch) -> jax.Array:
    """(E,) rows each expert computes in round r, given the (E,) rows it still has (plan_rounds)."""
    shift = r % d.group_size
    rem = jnp.roll(remaining.reshape(-1, d.group_size), -shift, axis=1)  # (groups, gs), priority order
    take = jnp.minimum(rem, d.capacity)
    spare = d.slab_rows - take.sum(1, keepdims=True)
    # The sequential lending loop, closed form: experts 0..j of the priority order get
    # min(their cumulative need, spare) extra rows in total.
    lent = jnp.minimum(jnp.cumsum(rem - take, axis=1), spare)
    take = take + jnp.diff(lent, axis=1, prepend=0)
    return jnp.roll(take, shift, axis=1).reshape(-1)


def plan_rounds(counts: jax.Array, d: Dispatch, max_rounds: int) -> jax.Array:
    """(max_rounds, E) rows per expert per round, zero rows past the last round (for tests, stats)."""
    def step(remaining, r):
        take = round_take(remaining, r, d)
        return remaining - take, take
    _, takes = jax.lax.scan(step, counts, jnp.arange(max_rounds))
    return takes


def row_layout(take, done, starts, order, n_pairs, d: Dispatch):
    """Pair id of every buffer row of one round (n_pairs where the row is unused) and the grouping.

    ragged: rows packed in expert order, (buffer_rows,) pair ids, group sizes (E,) with the unused
    tail given to the last expert. blocks, pallas: (n_blocks * block_rows,) pair ids, each expert's
    rows starting on a block boundary, and the (n_blocks,) expert of each block (E: unused).
    """
    if d.backend == "ragged":
        per_expert, n_rows = take, d.buffer_rows
    else:
        per_expert, n_rows = -(-take // d.block_rows) * d.block_rows, d.n_blocks * d.block_rows
    ends = jnp.cumsum(per_expert)
    row = jnp.arange(n_rows)
    e = jnp.minimum(jnp.searchsorted(ends, row, side="right"), d.n_experts - 1)  # expert of each row
    pos = row - (ends[e] - per_expert[e])
    valid = (row < ends[-1]) & (pos < take[e])
    sorted_at = jnp.clip(starts[e] + done[e] + pos, 0, max(n_pairs - 1, 0))
    pair = jnp.where(valid, order[sorted_at], n_pairs)
    if d.backend == "ragged":
        groups = take.at[-1].add(d.buffer_rows - take.sum())
    else:
        first = row[:: d.block_rows]                                          # (n_blocks,)
        groups = jnp.where(first < ends[-1], e[:: d.block_rows], d.n_experts)
    return pair, valid, groups


def _gmm(a: jax.Array, w: jax.Array, groups: jax.Array, d: Dispatch) -> jax.Array:
    """Rows of a (R, K) times their expert's w[e].T, w (E, N, K) (torch Linear layout) → (R, N)."""
    if d.backend == "ragged":
        return jax.lax.ragged_dot(a, jnp.swapaxes(w, 1, 2), groups)
    return gmm(a, w, groups, block_rows=d.block_rows, impl="pallas" if d.backend == "pallas" else "xla")


def expert_rows(xin, g_rows, w_gate, w_up, w_down, groups, d: Dispatch):
    """One round's gated SwiGLU expert outputs for its rows: (R, latent)."""
    h = jax.nn.silu(_gmm(xin, w_gate, groups, d)) * _gmm(xin, w_up, groups, d)  # (R, hidden)
    return _gmm(h, w_down, groups, d) * g_rows[:, None]


def sorted_pairs(expert_idx, d: Dispatch):
    flat = expert_idx.reshape(-1)
    counts = count_per_expert(flat, d.n_experts)
    order = jnp.argsort(flat, stable=True)            # pairs sorted by expert
    starts = jnp.cumsum(counts) - counts               # first sorted position of each expert
    return counts, order, starts


def _rounds(d: Dispatch, expert_idx, round_fn, init):
    """Run round_fn(carry, pair, valid, groups) over the rounds of this routing."""
    counts, order, starts = sorted_pairs(expert_idx, d)
    n_pairs = expert_idx.size
    n_rounds = rounds_needed(counts, d)

    def body(state):
        r, done, carry = state
        take = round_take(counts - done, r, d)
        pair, valid, groups = row_layout(take, done, starts, order, n_pairs, d)
        return r + 1, done + take, round_fn(carry, pair, valid, groups)

    _, _, carry = jax.lax.while_loop(lambda s: s[0] < n_rounds, body,
                                     (jnp.zeros((), n_rounds.dtype), jnp.zeros_like(counts), init))
    return carry


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def local_routed_experts(d: Dispatch, x, gate, expert_idx, w_gate, w_up, w_down):
    """x (T, latent), gate (T, k), expert_idx (T, k) int, w_gate/w_up (E, hidden, latent),
    w_down (E, latent, hidden) → (T, latent), on this device's arrays: the rounds in a while loop,
    recomputed in backward. Weights are used in x's dtype. The model calls it through
    `rungs.jaxjob.expert_parallel.routed_experts`, which runs expert parallelism instead on a mesh."""
    return _forward(d, x, gate, expert_idx, w_gate, w_up, w_down)


def _forward(d, x, gate, expert_idx, w_gate, w_up, w_down):
    n_tokens, k = expert_idx.shape
    weights = [w.astype(x.dtype) for w in (w_gate, w_up, w_down)]
    gate_pairs = gate.reshape(-1).astype(x.dtype)

    def round_fn(y_pairs, pair, valid, groups):
        xin = jnp.where(valid[:, None], x[pair // k % max(n_tokens, 1)], 0)  # (R, latent)
        g_rows = jnp.where(valid, gate_pairs[jnp.minimum(pair, gate_pairs.size - 1)], 0)
        y = expert_rows(xin, g_rows, *weights, groups, d)
        return y_pairs.at[pair].set(y, mode="drop")                         # unused rows: dropped

    y_pairs = _rounds(d, expert_idx, round_fn, jnp.zeros((n_tokens * k, x.shape[1]), x.dtype))
    return y_pairs.reshape(n_tokens, k, x.shape[1]).sum(1)                  # slot order


def _fwd(d, x, gate, expert_idx, w_gate, w_up, w_down):
    return _forward(d, x, gate, expert_idx, w_gate, w_up, w_down), (x, gate, expert_idx, w_gate, w_up, w_down)


def _bwd(d, res, dout):
    x, gate, expert_idx, w_gate, w_up, w_down = res
    n_tokens, k = expert_idx.shape
    params = (w_gate, w_up, w_down)
    weights = [w.astype(x.dtype) for w in params]
    gate_pairs = gate.reshape(-1).astype(x.dtype)
    dout = dout.astype(x.dtype)
    acc = jnp.promote_types(w_gate.dtype, jnp.float32)

    def round_fn(carry, pair, valid, groups):
        dx_pairs, dgate_pairs, grads = carry
        tok = pair // k % max(n_tokens, 1)
        xin = jnp.where(valid[:, None], x[tok], 0)
        g_rows = jnp.where(valid, gate_pairs[jnp.minimum(pair, gate_pairs.size - 1)], 0)
        dy = jnp.where(valid[:, None], dout[tok], 0)
        # Recompute this round and pull dy through it (nothing of a round outlives it).
        _, pull = jax.vjp(lambda a, g, *w: expert_rows(a, g, *w, groups, d), xin, g_rows, *weights)
        dxin, dg, *dw = pull(dy)
        grads = tuple(s + g.astype(acc) for s, g in zip(grads, dw))
        return dx_pairs.at[pair].set(dxin, mode="drop"), dgate_pairs.at[pair].set(dg, mode="drop"), grads

    init = (jnp.zeros((n_tokens * k, x.shape[1]), x.dtype), jnp.zeros((n_tokens * k,), x.dtype),
            tuple(jnp.zeros(w.shape, acc) for w in params))
    dx_pairs, dgate_pairs, grads = _rounds(d, expert_idx, round_fn, init)
    dx = dx_pairs.reshape(n_tokens, k, x.shape[1]).sum(1)                   # slot order
    dgate = dgate_pairs.reshape(gate.shape).astype(gate.dtype)
    d_idx = np.zeros(expert_idx.shape, jax.dtypes.float0)
    return (dx, dgate, d_idx, *(g.astype(w.dtype) for g, w in zip(grads, params)))


local_routed_experts.defvjp(_fwd, _bwd)
