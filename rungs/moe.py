"""Routed SwiGLU experts, dropless, computed in rounds over a fixed buffer with no host synchronisation.

The (token, slot) pairs are sorted by expert on the device; the sorted list is cut into consecutive
rounds of `buffer_rows` rows, a number fixed by the static sizes (T*k, the capacity, the group
size, the widths), never by the routing:

    buffer_rows = min(n_groups * group_size * capacity, T*k)  (rounded up to _ROW_ALIGN)
    rounds      = ceil(T*k / buffer_rows)

Round r computes sorted pairs [r*buffer_rows, (r+1)*buffer_rows) with one grouped matmul per
projection; the per-expert offsets of the round are clamp(cumsum(counts) - r*buffer_rows, 0, rows),
computed on the device. Nothing in the forward or the backward reads a device value on the host
(no `.item()`, `int()`, `.tolist()`, and no op whose output size depends on the data), so a GPU
step never waits for the host, and the memory is one round's whatever the skew: skew moves rows
between experts inside the fixed buffer, it costs neither memory nor extra rounds. Before this
design the rounds followed `plan_rounds` (each group of experts a fixed slab per round, the
overflow waiting for the next round): its number of rounds depends on the routing, which a
host-free path cannot know in advance. `plan_rounds` stays (`rungs.moe_rounds`, with the counting and
the capacity calibration, re-exported here): it is the plan expert parallelism
runs (`rungs.parallel.expert_parallel`, a group being one rank's experts), and the round count it
would need, ceil(max group load / slab), is still reported as `last_stats["rounds"]` (the skew
statistic the engines log); `last_stats["computed_rounds"]` is the static count this module ran.
With capacity None (the default) or a calibrated capacity every step is one round.

A one-round step keeps its slab of activations for backward (`recompute="always"` recomputes
it); with several rounds backward recomputes each round instead of saving it, so the bytes saved
for backward and the live buffers are bounded by one round's.

The combine is deterministic: each (token, slot) pair's gated output lands in its own row of a
(T*k, latent) buffer and the k slots of a token are summed in slot order (no scatter-add, no
atomics); backward accumulates input gradients the same way and weight gradients round by round
in fp32.

Host reads that remain, off the fast path: backend="loop", float64 (which grouped_mm does not
take) and operands that break grouped_mm's 16-byte alignment read each round's offsets on the host
(one mm per expert); reading `last_stats` reads the step's statistics once.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import is_fake

from rungs.moe_rounds import MoEConfigError, calibrate_capacity, count_per_expert, plan_rounds
from rungs.pointwise import swiglu, swiglu_backward

__all__ = ["MoEConfigError", "RoutedExperts", "calibrate_capacity", "count_per_expert", "plan_rounds"]

logger = logging.getLogger(__name__)

# grouped_mm needs 16-byte aligned row strides; the round buffer's row count is padded to this.
_ROW_ALIGN = 8


def _aligned(t: Tensor) -> bool:
    step = 16 // t.element_size()
    strides = all(s % step == 0 for s, n in zip(t.stride(), t.shape) if s != 1 and n > 1)
    if is_fake(t):                    # shapes only (a census): the allocator aligns what the strides allow
        return strides and t.storage_offset() % step == 0
    return t.data_ptr() % 16 == 0 and strides


# (device type, dtype) pairs on which grouped_mm raised (e.g. fp32 on CUDA, older GPUs): loop there.
_GROUPED_MM_UNSUPPORTED: set[tuple[str, torch.dtype]] = set()


def _host_offsets(a: Tensor, backend: str) -> bool:
    """Whether grouped matmuls on `a` will run one mm per expert (and so need the offsets on the host)."""
    return backend == "loop" or a.dtype == torch.float64 or (a.device.type, a.dtype) in _GROUPED_MM_UNSUPPORTED


def grouped_mm(a: Tensor, b: Tensor, offs: Tensor, ends: list[int] | None, backend: str) -> Tensor:
    """Grouped matmul. a (rows, K) with b (E, K, N) -> (rows, N), group e = rows offs[e-1]:offs[e];
    or a (K, rows) with b (rows, N) -> (E, K, N) (weight gradients). Rows past offs[-1] are not
    computed (their output rows are unspecified). `offs` is (E,) int32 on a's device; `ends` the
    same offsets on the host, or None to read them from `offs` only if needed. Falls back to one mm
    per group when the backend is "loop", the operands break grouped_mm's 16-byte alignment rule,
    or grouped_mm does not support this device and dtype."""
    key = (a.device.type, a.dtype)
    if (backend == "grouped_mm" and a.dtype != torch.float64 and key not in _GROUPED_MM_UNSUPPORTED
            and _aligned(a) and _aligned(b)):
        try:
            return F.grouped_mm(a, b, offs=offs)
        except (RuntimeError, NotImplementedError) as err:
            _GROUPED_MM_UNSUPPORTED.add(key)
            logger.warning("grouped_mm unavailable for %s %s (%s); computing one mm per expert", *key, err)
    if ends is None:
        ends = offs.tolist()                                                   # host read: fallback only
    starts = [0, *ends[:-1]]
    if b.ndim == 3:
        out = a.new_empty(a.shape[0], b.shape[-1])
        for e, (s, t) in enumerate(zip(starts, ends)):
            if t > s:
                torch.mm(a[s:t], b[e], out=out[s:t])
        return out
    out = a.new_zeros(len(ends), a.shape[0], b.shape[-1])
    for e, (s, t) in enumerate(zip(starts, ends)):
        if t > s:
            torch.mm(a[:, s:t], b[s:t], out=out[e])
    return out


class _Round:
    """One round: sorted pairs [start, start + rows), their pair ids and per-expert offsets (device)."""

    def __init__(self, order: Tensor, expert_ends: Tensor, start: int, rows: int, host_offsets: bool):
        self.rows = rows
        self.pairs = order[start:start + rows]                                  # a static slice
        self.offs = (expert_ends - start).clamp_(0, rows).to(torch.int32)      # (E,) device
        self.ends = self.offs.tolist() if host_offsets else None               # loop fallback only


def _rounds(order: Tensor, expert_ends: Tensor, buffer_rows: int, host_offsets: bool):
    n_pairs = order.numel()
    for start in range(0, n_pairs, buffer_rows):
        yield _Round(order, expert_ends, start, min(buffer_rows, n_pairs - start), host_offsets)


def _used_rows(n: int, buffer: Tensor) -> Tensor:
    """The first n rows of a round's fixed buffer, rounded up to the row alignment. The padding rows
    past n are zeroed (at most _ROW_ALIGN - 1 of them): they lie past the last offset, which
    grouped_mm ignores, and hold zeros rather than whatever the allocator left there."""
    used = buffer[:min(buffer.shape[0], -(-n // _ROW_ALIGN) * _ROW_ALIGN)]
    used[n:].zero_()
    return used


def _compute_weights(w_gate: Tensor, w_up: Tensor, w_down: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The expert weights in the compute dtype: gate and up stacked as one (E, 2H, latent) tensor (one
    grouped GEMM computes both projections), down (E, latent, H); each written by one cast."""
    n_experts, hidden, latent = w_gate.shape
    w_gate_up = torch.empty(n_experts, 2 * hidden, latent, dtype=dtype, device=w_gate.device)
    w_gate_up[:, :hidden].copy_(w_gate)
    w_gate_up[:, hidden:].copy_(w_up)
    return w_gate_up, w_down.to(dtype)


def _accumulate(acc: Tensor | None, part: Tensor, dtype: torch.dtype) -> Tensor:
    """Weight gradient over rounds: the first round's GEMM output as it is, from the second on a
    sum in `dtype` (float32 or wider): a one-round step casts once and adds nothing."""
    if acc is None:
        return part
    if acc.dtype != dtype:
        acc = acc.to(dtype)
    return acc.add_(part)


def _round_forward(x, gate_pairs, w_gate_up, w_down, k, xin, y_pairs, rnd: _Round, backend):
    # One round; a function so that its temporaries are freed before the next round starts.
    # y_p = w_down (g_p * silu(w_gate x_p) * (w_up x_p)): the gate scales the hidden rows, so the
    # down projection's output is already gated and the combine is a sum.
    n, pairs, offs, ends = rnd.rows, rnd.pairs, rnd.offs, rnd.ends
    hidden = w_down.shape[-1]
    xin = _used_rows(n, xin)
    torch.index_select(x, 0, pairs // k, out=xin[:n])
    h_gate_up = grouped_mm(xin, w_gate_up.mT, offs, ends, backend)                # (rows, 2 hidden)
    gate = _round_gate(gate_pairs, pairs, xin.shape[0])
    h = swiglu(h_gate_up[:, :hidden], h_gate_up[:, hidden:], gate)               # (rows, hidden), gated
    y = grouped_mm(h, w_down.mT, offs, ends, backend)                             # (rows, latent)
    y_pairs.index_copy_(0, pairs, y[:n])
    return xin, h_gate_up


def _round_gate(gate_pairs: Tensor, pairs: Tensor, rows: int) -> Tensor:
    """The round's gates in row order, padded with zeros to the buffer's used rows."""
    gate = gate_pairs[pairs]
    return F.pad(gate, (0, rows - gate.shape[0])) if rows > gate.shape[0] else gate


def _round_backward(x, gate_pairs, w_gate_up, w_down, k, xin, dy, dout, dx_pairs, dgate_pairs, grads,
                    rnd: _Round, backend, kept=None) -> list:
    # Recompute the round's activations (unless `kept` from forward), then its share of every
    # gradient. With h_p = g_p silu(a_p) b_p and y_p = w_down h_p: d w_down += dy_p h_p^T,
    # dh_p = w_down^T dy_p, d g_p = <dh_p, silu(a_p) b_p>, d a_p and d b_p from g_p dh_p; the
    # elementwise part is one pass (`rungs.pointwise.swiglu_backward`), the input gradient one GEMM
    # over the stacked gate|up rows.
    n, pairs, offs, ends = rnd.rows, rnd.pairs, rnd.offs, rnd.ends
    hidden = w_down.shape[-1]
    dy = _used_rows(n, dy)
    if kept is None:
        xin = _used_rows(n, xin)
        torch.index_select(x, 0, pairs // k, out=xin[:n])
        h_gate_up = grouped_mm(xin, w_gate_up.mT, offs, ends, backend)
    else:
        xin, h_gate_up = kept
    torch.index_select(dout, 0, pairs // k, out=dy[:n])
    gate = _round_gate(gate_pairs, pairs, xin.shape[0])
    dh = grouped_mm(dy, w_down, offs, ends, backend)                              # (rows, hidden)
    h, dh_gate_up, dgate = swiglu_backward(dh, h_gate_up[:, :hidden], h_gate_up[:, hidden:], gate)
    del dh
    if dgate_pairs is not None:
        dgate_pairs.index_copy_(0, pairs, dgate[:n].to(dgate_pairs.dtype))
    acc = torch.promote_types(w_down.dtype, torch.float32)
    grads[2] = _accumulate(grads[2], grouped_mm(dy.mT, h, offs, ends, backend), acc)   # (E, latent, hidden)
    del h
    grads[0] = _accumulate(grads[0], grouped_mm(dh_gate_up[:, :hidden].mT, xin, offs, ends, backend), acc)
    grads[1] = _accumulate(grads[1], grouped_mm(dh_gate_up[:, hidden:].mT, xin, offs, ends, backend), acc)
    dxin = grouped_mm(dh_gate_up, w_gate_up, offs, ends, backend)                 # (rows, latent)
    dx_pairs.index_copy_(0, pairs, dxin[:n])
    return grads


class _RoundedExperts(torch.autograd.Function):
    """out[t] = sum_j gate[t, j] * expert(idx[t, j])(x[t]), computed in rounds of fixed size.

    Memory policy: with more than one round nothing per round is saved and backward recomputes
    each round; a single round keeps its own (xin, gate|up projections) slab (unless
    recompute="always"), the same buffers a recomputed round allocates in backward. The round
    count is static (T*k and the buffer size), so whether a step keeps or recomputes never depends
    on the routing. The weights come in as the (fp32) parameters and are cast to x's dtype inside
    forward and again inside backward, so no low-precision weight copy is saved; weight gradients
    are the GEMM's output for one round and a float32 sum over several, returned in the
    parameters' dtype. With `held` (`rungs.held_weights`) the cast copies are made once and reused,
    and a weight gradient is added into the parameter's existing `.grad` in place (None returned)."""

    @staticmethod
    def forward(ctx, x, gate, w_gate, w_up, w_down, order, expert_ends, k, buffer_rows, backend, recompute, held):
        ctx.k, ctx.buffer_rows, ctx.backend, ctx.held = k, buffer_rows, backend, held
        keep = recompute == "multi_round" and 0 < order.numel() <= buffer_rows
        host = _host_offsets(x, backend)
        with torch.autocast(x.device.type, enabled=False):
            weights = held.weights(x.dtype) if held is not None else _compute_weights(w_gate, w_up, w_down, x.dtype)
            gate_pairs = gate.reshape(-1).to(x.dtype)
            y_pairs = x.new_empty(order.numel(), w_down.shape[1])
            xin = x.new_empty(buffer_rows, x.shape[1])
            kept: tuple = ()
            for rnd in _rounds(order, expert_ends, buffer_rows, host):
                used = _round_forward(x, gate_pairs, *weights, k, xin, y_pairs, rnd, backend)
                kept = used if keep else ()
                del used
            out = y_pairs.view(-1, k, y_pairs.shape[1]).sum(1)                   # slot order: deterministic
        ctx.save_for_backward(x, gate, w_gate, w_up, w_down, order, expert_ends, *kept)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        x, gate, w_gate, w_up, w_down, order, expert_ends, *kept = ctx.saved_tensors
        grads: list = [None, None, None]
        held = ctx.held
        with torch.autocast(x.device.type, enabled=False):
            weights = held.weights(x.dtype) if held is not None else _compute_weights(w_gate, w_up, w_down, x.dtype)
            gate_pairs = gate.reshape(-1).to(x.dtype)
            dx_pairs = x.new_empty(order.numel(), x.shape[1])
            dgate_pairs = (torch.empty(order.numel(), dtype=torch.promote_types(x.dtype, torch.float32),
                                       device=x.device) if ctx.needs_input_grad[1] else None)
            xin = x.new_empty(ctx.buffer_rows, x.shape[1]) if not kept else None
            dout = dout.to(x.dtype).contiguous()
            dy = dout.new_empty(ctx.buffer_rows, dout.shape[1])
            for rnd in _rounds(order, expert_ends, ctx.buffer_rows, _host_offsets(x, ctx.backend)):
                _round_backward(x, gate_pairs, *weights, ctx.k, xin, dy, dout, dx_pairs, dgate_pairs, grads,
                                rnd, ctx.backend, kept=kept or None)
        dx = dx_pairs.view(-1, ctx.k, x.shape[1]).sum(1)                          # slot order: deterministic
        dgate = dgate_pairs.view(gate.shape).to(gate.dtype) if dgate_pairs is not None else None
        dwg, dwu, dwd = (_weight_grad(g, w, held.grad_into(i) if held is not None else None)
                         for i, (g, w) in enumerate(zip(grads, (w_gate, w_up, w_down))))
        return dx, dgate, dwg, dwu, dwd, None, None, None, None, None, None, None


def _weight_grad(grad: Tensor | None, w: Tensor, into: Tensor | None = None) -> Tensor | None:
    # No pairs at all (an empty batch): no round ran. `into` (held weights): the parameter's existing
    # .grad; this gradient is added into it in place and autograd is given None (nothing more to add).
    if into is not None and grad is not None:
        into.add_(grad)
        return None
    return torch.zeros_like(w) if grad is None else grad.to(w.dtype)


def _check_expert_idx(flat: Tensor, n_experts: int) -> None:
    """Indices outside [0, n_experts): MoEConfigError on the CPU; on an accelerator a device-side
    assert (`torch._assert_async`), so that checking never waits for the device."""
    if not flat.numel():
        return
    try:
        torch._assert_async(((flat >= 0) & (flat < n_experts)).all(),
                            f"rungs.moe: expert_idx values must lie in [0, {n_experts})")
    except RuntimeError as err:
        raise MoEConfigError(f"expert_idx values must lie in [0, {n_experts}), got "
                             f"[{int(flat.min())}, {int(flat.max())}]") from err


class RoutedExperts(nn.Module):
    """E routed SwiGLU experts in the latent space: y_e(x) = w_down_e (silu(w_gate_e x) * (w_up_e x)).

    forward(x (T, latent), expert_idx (T, k) long, gate (T, k)) -> (T, latent) = sum_j gate_j y_{e_j}(x).
    capacity_per_expert=None: capacity is ceil(T*k / group_size) for each call, so one round always
    fits (plain dropless). capacity_factor f instead: ceil(f * T*k / E), f times the balanced load
    (the capacity expert parallelism sizes its rounds and exchanges by; here a buffer of
    min(E * capacity, T*k) rows). group_size=None: one group of all E experts. The buffer a round computes
    on has min(n_groups * group_size * capacity, T*k) rows (see the module docstring). backend:
    "grouped_mm" (one grouped matmul per projection and round; falls back per call to one mm per
    expert where grouped_mm's 16-byte alignment rule fails) or "loop". recompute: "multi_round" (keep
    a one-round step's activations, recompute when there are several rounds) or "always".
    `last_stats` (after a forward) = {rounds, computed_rounds, tokens_per_expert,
    capacity_per_expert, group_size, slab_rows, buffer_rows, max_group_load}: `rounds` is what the
    group plan (`plan_rounds`, expert parallelism) needs for this routing, ceil(max group load /
    slab); `computed_rounds` the static count this module ran. Reading it reads the device once;
    dropless: no token is ever dropped.
    """

    def __init__(self, n_experts: int, latent_dim: int, hidden: int, *, capacity_per_expert: int | None = None,
                 capacity_factor: float | None = None, group_size: int | None = None, backend: str = "grouped_mm",
                 recompute: str = "multi_round"):
        super().__init__()
        group_size = n_experts if group_size is None else group_size
        if min(n_experts, latent_dim, hidden) < 1:
            raise MoEConfigError(f"n_experts, latent_dim, hidden must be >= 1, got {n_experts}, {latent_dim}, {hidden}")
        if group_size < 1 or n_experts % group_size:
            raise MoEConfigError(f"group_size={group_size} must be >= 1 and divide n_experts={n_experts}")
        if capacity_per_expert is not None and capacity_per_expert < 1:
            raise MoEConfigError(f"capacity_per_expert must be >= 1 or None, got {capacity_per_expert}")
        if capacity_factor is not None and not (capacity_factor > 0 and math.isfinite(capacity_factor)):
            raise MoEConfigError(f"capacity_factor must be a finite number > 0 or None, got {capacity_factor}")
        if capacity_per_expert is not None and capacity_factor is not None:
            raise MoEConfigError(f"capacity_per_expert={capacity_per_expert} and capacity_factor={capacity_factor} "
                                 f"both size the rounds: set one")
        if backend not in ("grouped_mm", "loop"):
            raise MoEConfigError(f"backend must be 'grouped_mm' or 'loop', got {backend!r}")
        if recompute not in ("multi_round", "always"):
            raise MoEConfigError(f"recompute must be 'multi_round' or 'always', got {recompute!r}")
        self.recompute = recompute
        self.n_experts, self.latent_dim, self.hidden = n_experts, latent_dim, hidden
        self.capacity_per_expert, self.group_size, self.backend = capacity_per_expert, group_size, backend
        self.capacity_factor = capacity_factor
        self.w_gate = nn.Parameter(torch.empty(n_experts, hidden, latent_dim))
        self.w_up = nn.Parameter(torch.empty(n_experts, hidden, latent_dim))
        self.w_down = nn.Parameter(torch.empty(n_experts, latent_dim, hidden))
        self._stats: dict = {}            # the last forward's, device tensors included
        self._stats_host: dict | None = None
        self._held = None  # a rungs.held_weights.HeldWeights inside `held_expert_weights`
        if not self.w_gate.is_meta:  # on the meta device (the model's build) there is nothing to draw
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Stacks built on their own (tests, benchmarks) draw N(0, 1/fan_in). Inside the model they are
        built on the meta device, where this draws nothing: the model's one policy
        (`rungs.architecture.init_std`, applied by `Transformer.init_weights`) is their only init."""
        for w in (self.w_gate, self.w_up, self.w_down):
            nn.init.normal_(w, std=w.shape[-1] ** -0.5)

    @staticmethod
    def cast_stacks(w_gate: Tensor, w_up: Tensor, w_down: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The stacks in the compute dtype as forward and backward use them (what `rungs.held_weights`
        holds): gate and up as one stack, down."""
        return _compute_weights(w_gate, w_up, w_down, dtype)

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, latent_dim={self.latent_dim}, hidden={self.hidden}, "
                f"capacity_per_expert={self.capacity_per_expert}, capacity_factor={self.capacity_factor}, "
                f"group_size={self.group_size}")

    def capacity(self, n_pairs: int) -> int:
        """Per-expert rows a round for a call of `n_pairs` (token, slot) pairs."""
        if self.capacity_factor is not None:
            return max(1, math.ceil(self.capacity_factor * n_pairs / self.n_experts))
        return self.capacity_per_expert or max(1, math.ceil(n_pairs / self.group_size))

    @property
    def last_stats(self) -> dict:
        """The last forward's statistics (see the class docstring); the first read after a forward
        reads its max group load from the device, the only host read the statistics need."""
        if self._stats_host is None:
            stats = dict(self._stats)
            if stats:
                max_group_load = int(stats["max_group_load"])
                stats["max_group_load"] = max_group_load
                stats["rounds"] = -(-max_group_load // stats["slab_rows"])
            self._stats_host = stats
        return self._stats_host

    @property
    def last_rounds(self) -> Tensor:
        """`last_stats["rounds"]` as a 0-d device tensor, not read on the host: a training loop can
        stack every layer's and read them once per step instead of once per layer."""
        stats = self._stats
        if not stats:
            raise MoEConfigError("last_rounds is only defined after a forward")
        return torch.div(stats["max_group_load"] + stats["slab_rows"] - 1, stats["slab_rows"], rounding_mode="floor")

    def forward(self, x: Tensor, expert_idx: Tensor, gate: Tensor) -> Tensor:
        if x.ndim != 2 or x.shape[1] != self.latent_dim:
            raise MoEConfigError(f"x must be (T, {self.latent_dim}), got {tuple(x.shape)}")
        if expert_idx.ndim != 2 or expert_idx.shape[0] != x.shape[0] or gate.shape != expert_idx.shape:
            raise MoEConfigError(f"expert_idx and gate must both be (T={x.shape[0]}, k), got "
                                 f"{tuple(expert_idx.shape)} and {tuple(gate.shape)}")
        if expert_idx.dtype not in (torch.int32, torch.int64):
            raise MoEConfigError(f"expert_idx must be an integer tensor, got {expert_idx.dtype}")
        n_tokens, k = expert_idx.shape
        flat = expert_idx.reshape(-1).long()
        _check_expert_idx(flat, self.n_experts)
        n_pairs = flat.numel()
        counts = count_per_expert(flat, self.n_experts)
        capacity = self.capacity(n_pairs)
        slab_rows = self.group_size * capacity
        n_groups = self.n_experts // self.group_size
        # Never more than T*k rows can be in one round, so the buffer is capped there (still fixed).
        buffer_rows = min(n_groups * slab_rows, max(n_pairs, 1))
        buffer_rows = -(-buffer_rows // _ROW_ALIGN) * _ROW_ALIGN

        device_type = x.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        order = torch.argsort(flat, stable=True)                                 # pairs sorted by expert
        expert_ends = torch.cumsum(counts, 0)                                    # sorted end of each expert
        out = _RoundedExperts.apply(x.to(dtype), gate, self.w_gate, self.w_up, self.w_down, order, expert_ends, k,
                                    buffer_rows, self.backend, self.recompute, self._held)
        self._stats = {
            "computed_rounds": -(-n_pairs // buffer_rows),
            "tokens_per_expert": counts,
            "capacity_per_expert": capacity,
            "group_size": self.group_size,
            "slab_rows": slab_rows,
            "buffer_rows": buffer_rows,
            "max_group_load": counts.view(n_groups, self.group_size).sum(-1).max(),
        }
        self._stats_host = None
        return out
