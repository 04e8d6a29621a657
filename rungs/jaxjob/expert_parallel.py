"""Expert parallelism for the JAX job: `rungs.jaxjob.moe`'s multi-round dispatch in `jax.shard_map`.

The JAX twin of `rungs.parallel.expert_parallel`. On a (data, expert) mesh each device holds the
tokens of its batch shard and E / P experts (P = the expert axis, an "EP group" is one row of
the mesh); every data row is an independent EP group whose expert weights are replicated over
the data axis. Per call, on every device:

1. count its (token, slot) pairs per expert; ONE `all_gather` over the expert axis gives every
   device of the EP group the (P, E) count matrix, from which each derives the same round plan
   (`moe.round_take` on the group's per-expert loads, as `rungs.moe.plan_rounds`): an expert is
   guaranteed `capacity` rows a round, its group mates' unused slots go to overloaded experts,
   the rest waits. Expert e's pairs are taken source-major (device 0's first), each device's in
   its stable by-expert order, exactly as `build_rounds` in the torch module.
2. per round, ONE `all_to_all` with a FIXED buffer: each device sends each peer `send_rows` rows
   (the most a round can bring one peer: min(E/P * capacity, local pairs)); what a row is, the
   receiver derives from the same count matrix, so no metadata travels. XLA:CPU has no
   `ragged_all_to_all`, hence the fixed per-peer buffer. The receiver compacts the rows into one
   buffer of E/P * capacity rows grouped by local expert (`moe.row_layout`), runs the grouped
   SwiGLU (`moe.expert_rows`), and a second `all_to_all` of the same size returns the outputs.
3. backward (a `custom_vjp`: a while loop has no reverse-mode rule) re-dispatches x together with
   the output gradient in one exchange per round and recomputes the round, so nothing of a round
   outlives it: every buffer is fixed by the capacity, the widths and P, never by skew. Skew
   costs rounds, not memory (measured with `memory_analysis()`, `tests/.../test_expert_parallel`).

Expert weight gradients are summed over the EP group by the exchange; over the data axis
`shard_map`'s transpose sums them (the weights enter replicated over data).

Where the mesh does not fit the call (tokens not divisible by the devices, E not by P, the group
size not dividing E / P), `fits` says so and `routed_experts` falls back to the single-device
algorithm (`moe.local_routed_experts`) partitioned by GSPMD. The choice is made here, not in `moe`,
so the single-device algorithm knows nothing of meshes and the two modules import one way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from rungs.jaxjob.moe import (Dispatch, count_per_expert, expert_rows, local_routed_experts, round_take, rounds_needed,
                              row_layout)
from rungs.jaxjob.sharding import DATA, EXPERT, active_mesh

__all__ = ["EPLayout", "ExpertParallelError", "ep_layout", "fits", "routed_experts", "routed_experts_sharded",
           "routed_experts_with_rounds"]

_ROW_ALIGN = 8


class ExpertParallelError(ValueError):
    """An expert-parallel layout that cannot run (experts not divisible by the expert axis...)."""


def _align(rows: int) -> int:
    return -(-max(rows, 1) // _ROW_ALIGN) * _ROW_ALIGN


@dataclass(frozen=True)
class EPLayout:
    """Static sizes of one sharded call, seen from one device (hashable: a jit constant)."""

    n_ranks: int         # P, devices on the expert axis
    n_experts: int       # E
    group_size: int      # experts sharing spare slots (divides E / P, as the torch module requires)
    capacity: int        # guaranteed rows per expert per round
    local_pairs: int     # (token, slot) pairs of this device
    top_k: int
    block_rows: int
    backend: str

    @property
    def local_experts(self) -> int:
        return self.n_experts // self.n_ranks

    @property
    def send_rows(self) -> int:
        """Rows sent to each peer per round: a round brings one peer's experts at most
        local_experts * capacity rows, and a device has no more than its pairs."""
        return _align(min(self.local_experts * self.capacity, self.local_pairs))

    @property
    def compute_rows(self) -> int:
        """Rows a device's experts compute on per round (the torch module's buffer_rows)."""
        return _align(min(self.local_experts * self.capacity, self.n_ranks * self.local_pairs))

    def group_plan(self) -> Dispatch:
        """The round plan's sizes over the EP group's E experts (`moe.round_take`)."""
        return Dispatch(self.n_experts, self.group_size, self.capacity, self.compute_rows, 1, self.backend)

    def local(self) -> Dispatch:
        """The grouped matmul's sizes over this device's experts and its compute buffer."""
        rows = self.block_rows if self.backend == "pallas" else min(self.block_rows, self.compute_rows)
        return Dispatch(self.local_experts, self.group_size, self.capacity, self.compute_rows, rows, self.backend)


def ep_layout(d: Dispatch, n_tokens: int, top_k: int, data: int, expert: int) -> EPLayout:
    """The layout of a `Dispatch` over a (data, expert) mesh; `n_tokens` is the global count.

    The group size is min(configured, E / P) as `rungs.parallel.expert_parallel`; capacity None
    (one round always fits) means ceil(pairs of the EP group / group size), as there."""
    world = data * expert
    if n_tokens % world:
        raise ExpertParallelError(f"{n_tokens} tokens do not split over {world} devices")
    if d.n_experts % expert:
        raise ExpertParallelError(f"n_experts={d.n_experts} must be divisible by the expert axis {expert}")
    local = d.n_experts // expert
    group_size = min(d.group_size, local)
    if local % group_size:
        raise ExpertParallelError(f"group_size={group_size} must divide the {local} experts per device")
    local_pairs = n_tokens // world * top_k
    capacity = d.capacity_per_expert or max(1, math.ceil(local_pairs * expert / group_size))
    return EPLayout(expert, d.n_experts, group_size, capacity, local_pairs, top_k, d.block_rows, d.backend)


def fits(d: Dispatch, n_tokens: int, mesh) -> bool:
    """Whether `routed_experts_sharded` can run this call on `mesh` (else: the GSPMD fallback)."""
    try:
        ep_layout(d, n_tokens, 1, mesh.shape[DATA], mesh.shape[EXPERT])
    except ExpertParallelError:
        return False
    return True


# --- the plan, seen from one device ---------------------------------------------------------

class _Plan:
    """Everything a device derives from the gathered (P, E) counts, shared by forward and backward."""

    def __init__(self, lay: EPLayout, counts: jax.Array, expert_idx: jax.Array):
        self.lay = lay
        self.me = jax.lax.axis_index(EXPERT)
        self.counts = counts                                                  # (P, E)
        self.total = counts.sum(0)                                            # (E,) the group's loads
        self.src_lo = jnp.cumsum(counts, 0) - counts                          # (P, E) source-major
        mine = counts[self.me]
        self.my_start = jnp.cumsum(mine) - mine                               # (E,)
        self.order = jnp.argsort(expert_idx.reshape(-1), stable=True)        # my pairs by expert
        self.n_rounds = rounds_needed(self.total, lay.group_plan())

    def round(self, r: jax.Array, done: jax.Array):
        """Round r's exchange: (send pairs (P, S), recv compute layout), and the new `done`."""
        lay = self.lay
        P_, L, S = lay.n_ranks, lay.local_experts, lay.send_rows
        take = round_take(self.total - done, r, lay.group_plan())            # (E,)
        lo = jnp.maximum(done[None], self.src_lo)
        rows = jnp.maximum(jnp.minimum((done + take)[None], self.src_lo + self.counts) - lo, 0)  # (P, E)
        offset = lo - self.src_lo                                             # >= 0 where rows > 0

        # What I send: to peer p its experts' rows in expert order, slots j of a fixed (P, S) buffer.
        mine = rows[self.me].reshape(P_, L)                                   # (P, L)
        e_loc, pos, valid = _slots(mine, S)                                   # (P, S) each
        expert = jnp.arange(P_)[:, None] * L + e_loc
        at = self.my_start[expert] + offset[self.me][expert] + pos
        send_pair = jnp.where(valid, self.order[jnp.clip(at, 0, lay.local_pairs - 1)], lay.local_pairs)

        # What I receive: from source s the rows of my experts, laid out as s packed them.
        got = jax.lax.dynamic_slice_in_dim(rows, self.me * L, L, axis=1)     # (P, L)
        r_loc, _, r_valid = _slots(got, S)                                    # (P, S)
        flat = jnp.arange(P_ * S)
        key = jnp.where(r_valid.reshape(-1), r_loc.reshape(-1) * (P_ * S) + flat, L * P_ * S + flat)
        recv_order = jnp.argsort(key)                   # received rows by (local expert, source)
        per_expert = got.sum(0)                                               # (L,)
        starts = jnp.cumsum(per_expert) - per_expert
        local = lay.local()
        row_pair, row_valid, groups = row_layout(per_expert, jnp.zeros_like(per_expert), starts, recv_order,
                                                 P_ * S, local)
        return (send_pair, row_pair, row_valid, groups), done + take


def _slots(rows: jax.Array, S: int):
    """For (P, L) rows per (peer, local expert) packed expert-major into S slots per peer: each
    slot's local expert, its position within that expert's rows, and whether it holds a row."""
    ends = jnp.cumsum(rows, 1)                                                # (P, L)
    j = jnp.arange(S)
    e_loc = jnp.minimum((ends[:, None, :] <= j[None, :, None]).sum(-1), rows.shape[1] - 1)  # (P, S)
    end = jnp.take_along_axis(ends, e_loc, 1)
    count = jnp.take_along_axis(rows, e_loc, 1)
    return e_loc, j[None] - (end - count), j[None] < ends[:, -1:]


def _exchange(buf: jax.Array) -> jax.Array:
    """(P, S, ...) with block p for peer p → (P, S, ...) with block s from source s."""
    return jax.lax.all_to_all(buf, EXPERT, 0, 0, tiled=True)


def _run_rounds(plan: _Plan, round_fn, init):
    def body(state):
        r, done, carry = state
        layout, done = plan.round(r, done)
        return r + 1, done, round_fn(carry, *layout)

    state = _varying((jnp.zeros((), plan.n_rounds.dtype), jnp.zeros_like(plan.total), init))
    _, _, carry = jax.lax.while_loop(lambda s: s[0] < plan.n_rounds, body, state)
    return carry


def _varying(tree):
    """Mark a loop's initial carry as varying over the mesh (as the values the rounds produce)."""
    def cast(a):
        missing = tuple(ax for ax in (DATA, EXPERT) if ax not in jax.typeof(a).manual_axis_type.varying)
        return jax.lax.pcast(a, missing, to="varying") if missing else a
    return jax.tree.map(cast, tree)


# --- the exchange with its backward ---------------------------------------------------------

@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ep_pairs(lay: EPLayout, counts, x, expert_idx, w_gate, w_up, w_down):
    """y_pairs (local pairs, latent): expert(idx[p])(x[p // k]) for every pair of this device."""
    return _ep_forward(lay, counts, x, expert_idx, w_gate, w_up, w_down)


def _ep_forward(lay, counts, x, expert_idx, w_gate, w_up, w_down):
    plan = _Plan(lay, counts, expert_idx)
    k, S, P_ = lay.top_k, lay.send_rows, lay.n_ranks
    weights = [w.astype(x.dtype) for w in (w_gate, w_up, w_down)]
    x_ext = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])       # row T: the padding row

    def round_fn(y_pairs, send_pair, row_pair, row_valid, groups):
        recv = _exchange(x_ext[jnp.minimum(send_pair // k, x.shape[0])]).reshape(P_ * S, -1)
        xin = jnp.where(row_valid[:, None], recv[jnp.minimum(row_pair, P_ * S - 1)], 0)
        y = expert_rows(xin, jnp.ones(row_valid.shape, x.dtype), *weights, groups, lay.local())
        out = jnp.zeros((P_ * S, x.shape[1]), x.dtype).at[row_pair].set(y, mode="drop")
        back = _exchange(out.reshape(P_, S, -1))
        return y_pairs.at[send_pair].set(back, mode="drop")                  # padding slots: dropped

    return _run_rounds(plan, round_fn, jnp.zeros((lay.local_pairs, x.shape[1]), x.dtype))


def _ep_fwd(lay, counts, x, expert_idx, w_gate, w_up, w_down):
    return _ep_forward(lay, counts, x, expert_idx, w_gate, w_up, w_down), (counts, x, expert_idx, w_gate, w_up,
                                                                            w_down)


def _ep_bwd(lay, res, dy_pairs):
    counts, x, expert_idx, w_gate, w_up, w_down = res
    plan = _Plan(lay, counts, expert_idx)
    k, S, P_, latent = lay.top_k, lay.send_rows, lay.n_ranks, x.shape[1]
    params = (w_gate, w_up, w_down)
    weights = [w.astype(x.dtype) for w in params]
    acc = jnp.promote_types(w_gate.dtype, jnp.float32)
    x_ext = jnp.concatenate([x, jnp.zeros((1, latent), x.dtype)])
    dy_ext = jnp.concatenate([dy_pairs.astype(x.dtype), jnp.zeros((1, latent), x.dtype)])
    local = lay.local()

    def round_fn(carry, send_pair, row_pair, row_valid, groups):
        dx_pairs, grads = carry
        # one exchange re-dispatches the inputs (recompute) together with the output gradients
        both = jnp.concatenate([x_ext[jnp.minimum(send_pair // k, x.shape[0])],
                                dy_ext[jnp.minimum(send_pair, lay.local_pairs)]], -1)      # (P, S, 2 latent)
        recv = _exchange(both).reshape(P_ * S, 2 * latent)
        rows = jnp.where(row_valid[:, None], recv[jnp.minimum(row_pair, P_ * S - 1)], 0)
        xin, dy = rows[:, :latent], rows[:, latent:]
        ones = jnp.ones(row_valid.shape, x.dtype)
        _, pull = jax.vjp(lambda a, *w: expert_rows(a, ones, *w, groups, local), xin, *weights)
        dxin, *dw = pull(dy)
        grads = tuple(s + g.astype(acc) for s, g in zip(grads, dw))
        out = jnp.zeros((P_ * S, latent), x.dtype).at[row_pair].set(dxin, mode="drop")
        back = _exchange(out.reshape(P_, S, latent))
        return dx_pairs.at[send_pair].set(back, mode="drop"), grads

    init = (jnp.zeros((lay.local_pairs, latent), x.dtype), tuple(jnp.zeros(w.shape, acc) for w in params))
    dx_pairs, grads = _run_rounds(plan, round_fn, init)
    dx = dx_pairs.reshape(-1, k, latent).sum(1)                               # slot order
    zero_int = np.zeros(expert_idx.shape, jax.dtypes.float0)
    return (np.zeros(counts.shape, jax.dtypes.float0), dx.astype(x.dtype), zero_int,
            *(g.astype(w.dtype) for g, w in zip(grads, params)))


_ep_pairs.defvjp(_ep_fwd, _ep_bwd)


def routed_experts_sharded(d: Dispatch, x, gate, expert_idx, w_gate, w_up, w_down, mesh=None):
    """`moe.local_routed_experts` with the experts spread over the mesh's expert axis.

    x (N, latent), gate and expert_idx (N, k) are global arrays (split over data x expert rows);
    the stacks (E, ., .) are split over the expert axis. `mesh`: the mesh (None: the one set by
    `sharding.use_mesh`). Returns (y (N, latent), rounds (devices,) int32: the rounds each device's EP
    group ran)."""
    mesh = active_mesh() if mesh is None else mesh
    n_tokens, k = expert_idx.shape
    lay = ep_layout(d, n_tokens, k, mesh.shape[DATA], mesh.shape[EXPERT])
    rows, stacks = P((DATA, EXPERT)), P(EXPERT)

    def body(x, gate, expert_idx, w_gate, w_up, w_down):
        counts = jax.lax.all_gather(count_per_expert(expert_idx, lay.n_experts), EXPERT)   # (P, E)
        # The stacks are replicated over data: marked varying there, their gradients (which differ
        # per data row) are summed over it by the transpose of this cast.
        w_gate, w_up, w_down = _varying((w_gate, w_up, w_down))
        y_pairs = _ep_pairs(lay, counts, x, expert_idx, w_gate, w_up, w_down)            # (T k, latent)
        y = (y_pairs.reshape(-1, k, x.shape[1]) * gate.astype(x.dtype)[..., None]).sum(1)  # slot order
        rounds = rounds_needed(counts.sum(0), lay.group_plan())
        return y, rounds.astype(jnp.int32)[None]

    return jax.shard_map(body, mesh=mesh, in_specs=(rows, rows, rows, stacks, stacks, stacks),
                         out_specs=(rows, rows))(x, gate, expert_idx, w_gate, w_up, w_down)


def routed_experts(d: Dispatch, x, gate, expert_idx, w_gate, w_up, w_down):
    """The routed experts the model runs: x (T, latent), gate (T, k), expert_idx (T, k) int,
    w_gate/w_up (E, hidden, latent), w_down (E, latent, hidden) → (T, latent).

    Traced under `sharding.use_mesh(mesh)` (the JAX engine compiles its step so), this is expert
    parallelism in `shard_map` (`routed_experts_sharded`) where the shapes divide the mesh;
    otherwise the single-device algorithm (`moe.local_routed_experts`), which GSPMD partitions."""
    return routed_experts_with_rounds(d, x, gate, expert_idx, w_gate, w_up, w_down)[0]


def routed_experts_with_rounds(d: Dispatch, x, gate, expert_idx, w_gate, w_up, w_down):
    """(`routed_experts`, the rounds it ran: the most any expert-parallel group ran when sharded)."""
    mesh = active_mesh()
    if mesh is not None and fits(d, expert_idx.shape[0], mesh):
        y, rounds = routed_experts_sharded(d, x, gate, expert_idx, w_gate, w_up, w_down)
        return y, rounds.max()
    rounds = rounds_needed(count_per_expert(expert_idx, d.n_experts), d)
    return local_routed_experts(d, x, gate, expert_idx, w_gate, w_up, w_down), rounds
