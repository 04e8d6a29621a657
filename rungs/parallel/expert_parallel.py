"""Expert parallelism with multi-round dropless dispatch and no host synchronisation.

`ExpertParallelExperts` replaces a `rungs.moe.RoutedExperts` from outside (the model is unchanged):
the E experts are split across the P ranks of an expert-parallel (EP) group, rank r holding experts
[r·E/P, (r+1)·E/P) with the same parameter names. Per forward:

1. each rank counts its (token, slot) pairs per expert (a scatter-add); ONE all-gather gives every
   rank the (P, E) count matrix, from which every rank derives, on the device, the same round plan
   and every index of the exchange (`rungs.parallel.ep_plan`): an expert is guaranteed `capacity`
   rows a round, its group mates' unused slots go to overloaded experts, the rest waits for the next
   round (`rungs.moe.plan_rounds`);
2. each round is cut into `chunks_per_round` slices; per slice ONE `all_to_all_single` with equal,
   fixed splits (`EPLayout.peer_rows` rows to every peer, padded) delivers the rows, each rank's
   experts run one grouped matmul per projection over a compute buffer of fixed size (a hot expert
   costs rounds, never memory), and a second `all_to_all_single` of the same size returns the
   outputs. The exchange buffers (two sets, P·peer_rows rows each) are allocated once per call and
   reused by every slice. With `overlap` (the default, two slices a round) slice i+1's dispatch is
   in flight during slice i's GEMMs and slice i's return during slice i+1's, so communication
   overlaps expert compute in a one-round step too (rounds are not prefetched across, so a
   multi-round step holds one round's buffers);
3. backward recomputes each slice (re-dispatching x together with the output gradient in one
   exchange), so saved activations do not grow with the number of rounds.

Host reads: none when the layout admits one round only (`EPLayout.max_rounds == 1`: capacity None,
the default, or a capacity that holds the worst routing). With a smaller capacity the number of
rounds depends on the routing and eager PyTorch has no loop on the device, so the forward reads the
round count once per call, after round 0 is issued (on CUDA from a copy made as soon as the counts
arrive, so the device is busy with round 0 while the host waits); backward reuses it. Running the
worst-case count every step instead would cost `max_rounds` exchanges of padded buffers each time.
Under a capacity factor (a binding per-peer cap, no closed form) the forward reads instead, after
each round is issued, whether pairs are left: once in a one-round step, as before.

The price of equal splits: each slice moves P·peer_rows rows per rank whatever the routing. With
the default capacity (one round always fits) a peer's block is sized for a source's n pairs, so a
round moves P·n rows, P times the n it routes (mai-base-2 L18 at ep=8: 229,376 rows for 28,672,
352 MB per direction per layer in bf16). A `capacity_factor` f caps the blocks at f times the
balanced share: f·n rows a round (f=1.5: 43,008 rows, 66 MB), skew beyond it costing rounds.

Expert weight gradients are the sum over all sources of the EP group; under DP×EP the caller
reduces them over the data-parallel replicas (`rungs.parallel.distributed`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from rungs.moe import RoutedExperts, count_per_expert, grouped_mm
from rungs.parallel.ep_plan import EPLayout, Plan, SliceMaps, factor_capacities


class ExpertParallelError(ValueError):
    """An expert-parallel layout that cannot run (experts not divisible by ranks, bad capacity)."""


def check_layout(n_experts: int, n_ranks: int, group_size: int) -> tuple[int, int]:
    """(experts per rank, group size) or ExpertParallelError saying what would be valid."""
    if n_ranks < 1 or n_experts % n_ranks:
        raise ExpertParallelError(f"n_experts={n_experts} must be divisible by the expert-parallel size {n_ranks}")
    local = n_experts // n_ranks
    if group_size < 1 or local % group_size:
        raise ExpertParallelError(f"group_size={group_size} must divide the {local} experts per rank")
    return local, group_size


class _RoundCount:
    """The plan's number of rounds on the host: static when the layout admits one round only; else
    read once from the closed form, or, under a binding peer capacity (no closed form), once a round
    from the pairs that round leaves (see the module docstring). On CUDA each copy is queued right
    after the plan it reads, so waiting for it does not wait for the round's work queued after it."""

    def __init__(self, lay: EPLayout, plan: Plan):
        self._static = lay.max_rounds <= 1
        self._per_round = lay.peer_capped and not self._static
        self._total: int | None = 1 if self._static else None
        self._pending: tuple[Tensor, Any] | None = None
        self.ran = 0
        if not self._static and not self._per_round:
            self._pending = self._queue(plan.n_rounds)

    @staticmethod
    def _queue(value: Tensor) -> tuple[Tensor, Any]:
        if value.device.type != "cuda":
            return value, None
        host = torch.empty((), dtype=value.dtype, pin_memory=True)
        host.copy_(value, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return host, event

    @staticmethod
    def _read(pending: tuple[Tensor, Any]) -> int:
        value, event = pending
        if event is not None:
            event.synchronize()
        return int(value)                                                   # the host read

    def planned(self, left: Tensor) -> None:
        """Round `self.ran` is planned and leaves `left` pairs: queue its copy when it is what decides."""
        if self._per_round:
            self._pending = self._queue(left)

    def more(self) -> bool:
        """After the round's work is issued: whether another round follows."""
        self.ran += 1
        if self._per_round:
            return self._read(self._pending) > 0
        if self._total is None:
            self._total = self._read(self._pending)
        return self.ran < self._total


class _Buffers:
    """The exchange buffers of one forward or backward, allocated once and reused by every slice of
    every round (fixed memory whatever the skew, no allocator churn): for slice i, set i mod 2 of the
    dispatch pair (rows sent, rows received) and of the return pair. Two sets let slice i+1's
    dispatch and slice i's return be in flight while the other set is in use."""

    def __init__(self, like: Tensor, rows: int, dispatch_width: int, return_width: int, sets: int):
        def make(width: int) -> list[Tensor]:
            return [like.new_empty(rows, width) for _ in range(sets)]

        self.send, self.recv = make(dispatch_width), make(dispatch_width)   # (P·peer_rows, width) each
        self.ret, self.back = make(return_width), make(return_width)
        self.sets = sets


class _Exchange:
    """One `all_to_all_single` with equal splits into a fixed buffer, asynchronous when overlapping."""

    def __init__(self, out: Tensor, rows: Tensor, group: Any, overlap: bool):
        self._out = out
        self._handle = dist.all_to_all_single(out, rows, group=group, async_op=overlap)

    def result(self) -> Tensor:
        if self._handle is not None:
            self._handle.wait()  # on CUDA: the current stream waits; the buffers may then be reused
            self._handle = None
        return self._out


def _run_round(slices: list[SliceMaps], buf: _Buffers, send: Callable[[SliceMaps, Tensor], None],
               receive: Callable[[SliceMaps, Tensor], None], compute: Callable[[SliceMaps, Tensor], None],
               collect: Callable[[SliceMaps, Tensor], None], group: Any, overlap: bool) -> None:
    """One round, slice by slice: dispatch (send fills the rows to send), receive them into the compute
    buffer, compute (fills the rows to return), return exchange, collect. The collectives are issued
    in the same order with or without `overlap`; with it they are asynchronous: slice i+1's dispatch
    is issued before slice i's compute and slice i's return is waited for after slice i+1's compute,
    so the results are the same bit for bit and only the waits move. A buffer set is reused two
    slices later, after its exchanges were waited for. The pipeline ends with the round (round r+1
    is not prefetched), so the live buffers are those of `buf` whatever the number of rounds."""
    def dispatch(i: int) -> _Exchange:
        send(slices[i], buf.send[i % buf.sets])
        return _Exchange(buf.recv[i % buf.sets], buf.send[i % buf.sets], group, overlap)

    pending = dispatch(0)
    returning: tuple[SliceMaps, _Exchange] | None = None
    for i, maps in enumerate(slices):
        upcoming = dispatch(i + 1) if i + 1 < len(slices) else None
        receive(maps, pending.result())
        pending = upcoming
        compute(maps, buf.ret[i % buf.sets])
        back = _Exchange(buf.back[i % buf.sets], buf.ret[i % buf.sets], group, overlap)  # in flight: next compute
        if returning is not None:
            collect(returning[0], returning[1].result())
        returning = (maps, back)
    collect(returning[0], returning[1].result())


def _swiglu_forward(xin: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor, offs: Tensor, backend: str) -> Tensor:
    h = F.silu(grouped_mm(xin, w_gate.mT, offs, None, backend)) * grouped_mm(xin, w_up.mT, offs, None, backend)
    return grouped_mm(h, w_down.mT, offs, None, backend)                   # (rows, latent)


def _cast_each(w_gate: Tensor, w_up: Tensor, w_down: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    return w_gate.to(dtype), w_up.to(dtype), w_down.to(dtype)


class _EPExperts(torch.autograd.Function):
    """y_pairs[p] = expert(e_p)(x[p // k]) with experts spread over the EP group; slices recomputed.

    The local stacks come in as the (fp32) parameters and are cast to x's dtype in forward and again
    in backward (no copy saved in between), or taken from `held` (`rungs.held_weights`);
    weight gradients are summed over the slices in fp32 and returned in the parameters' dtype (never
    rounded to the compute dtype)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, plan: Plan, k: int, group, backend: str, overlap: bool,
                held):
        lay = plan.lay
        latent, n = x.shape[1], plan.order.numel()
        count = _RoundCount(lay, plan)
        ctx.save_for_backward(x, w_gate, w_up, w_down)
        with torch.autocast(x.device.type, enabled=False):
            w_gate, w_up, w_down = held.weights(x.dtype) if held is not None else _cast_each(w_gate, w_up, w_down,
                                                                                              x.dtype)
            y_pairs = x.new_zeros(n + 1, latent)                              # row n: padding rows' sink
            xin = x.new_zeros(lay.compute_rows + 1, latent)                    # row compute_rows: padding's sink

            buf = _Buffers(x, lay.n_ranks * lay.peer_rows, latent, latent, min(2, lay.chunks))

            def compute(maps: SliceMaps, out: Tensor) -> None:
                y = _swiglu_forward(xin[:-1], w_gate, w_up, w_down, maps.offs, backend)    # (compute_rows, latent)
                torch.index_select(y, 0, maps.compute_row, out=out)                           # (P·peer_rows, latent)

            for slices, left in plan.rounds():
                count.planned(left)
                _run_round(slices, buf, lambda maps, out: torch.index_select(x, 0, maps.send_pair // k, out=out),
                           lambda maps, recv: xin.index_copy_(0, maps.recv_row, recv), compute,
                           lambda maps, back: y_pairs.index_copy_(0, maps.pair_slot, back), group, overlap)
                if not count.more():
                    break
        if lay.peer_capped:  # no closed form: the statistic is the rounds run (a fill, not a copy)
            plan.n_rounds = torch.full_like(plan.n_rounds, count.ran)
        ctx.plan, ctx.n_rounds, ctx.k, ctx.group, ctx.backend, ctx.overlap = plan, count.ran, k, group, backend, overlap
        ctx.held = held
        return y_pairs[:n]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y_pairs):
        x, *params = ctx.saved_tensors
        plan, k, backend, held = ctx.plan, ctx.k, ctx.backend, ctx.held
        lay, latent, n = plan.lay, x.shape[1], plan.order.numel()
        acc = torch.promote_types(params[0].dtype, torch.float32)
        grads = [torch.zeros(w.shape, dtype=acc, device=w.device) for w in params]   # fp32 sums over slices
        with torch.autocast(x.device.type, enabled=False):
            w_gate, w_up, w_down = held.weights(x.dtype) if held is not None else _cast_each(*params, x.dtype)
            grad_y_pairs = grad_y_pairs.to(x.dtype).contiguous()
            dx_pairs = x.new_zeros(n + 1, latent)
            xin = x.new_zeros(lay.compute_rows + 1, latent)
            dy = x.new_zeros(lay.compute_rows + 1, latent)

            buf = _Buffers(x, lay.n_ranks * lay.peer_rows, 2 * latent, latent, min(2, lay.chunks))

            def send(maps: SliceMaps, out: Tensor) -> None:
                # one exchange re-dispatches the inputs (recompute) together with the output gradients
                torch.index_select(x, 0, maps.send_pair // k, out=out[:, :latent])
                torch.index_select(grad_y_pairs, 0, maps.send_pair, out=out[:, latent:])

            def receive(maps: SliceMaps, recv: Tensor) -> None:
                xin.index_copy_(0, maps.recv_row, recv[:, :latent])
                dy.index_copy_(0, maps.recv_row, recv[:, latent:])

            def compute(maps: SliceMaps, out: Tensor) -> None:
                a, g, offs = xin[:-1], dy[:-1], maps.offs
                hg = grouped_mm(a, w_gate.mT, offs, None, backend)
                hu = grouped_mm(a, w_up.mT, offs, None, backend)
                sig = torch.sigmoid(hg)
                silu = hg * sig
                grads[2] += grouped_mm(g.mT, silu * hu, offs, None, backend)   # (E/P, latent, hidden)
                dh = grouped_mm(g, w_down, offs, None, backend)                 # (rows, hidden)
                dhu = dh * silu
                dhg = dh * hu * sig * (1 + hg * (1 - sig))
                grads[0] += grouped_mm(dhg.mT, a, offs, None, backend)
                grads[1] += grouped_mm(dhu.mT, a, offs, None, backend)
                dxin = grouped_mm(dhg, w_gate, offs, None, backend) + grouped_mm(dhu, w_up, offs, None, backend)
                torch.index_select(dxin, 0, maps.compute_row, out=out)

            for r, (slices, _) in enumerate(plan.rounds()):
                _run_round(slices, buf, send, receive, compute,
                           lambda maps, back: dx_pairs.index_copy_(0, maps.pair_slot, back), ctx.group, ctx.overlap)
                if r + 1 == ctx.n_rounds:
                    break
        dx = dx_pairs[:n].view(-1, k, latent).sum(1)                            # slot order: deterministic
        # fp32 sums, which autograd adds into .grad (held or not: the same order)
        dwg, dwu, dwd = (g.to(w.dtype) for g, w in zip(grads, params))
        return dx, dwg, dwu, dwd, None, None, None, None, None, None


class ExpertParallelExperts(nn.Module):
    """This rank's share of a `RoutedExperts`, exchanging tokens with the rest of the EP group.

    forward(x (T, latent), expert_idx (T, k), gate (T, k)) -> (T, latent), the same contract as
    `RoutedExperts`. `capacity_per_expert` None: one round always fits (capacity = all pairs of
    the group / group_size). `capacity_factor` f instead: capacity ceil(f·P·n / E), f times the
    balanced load, and each source sends each peer at most ceil(f·n / P) rows a round, so the
    exchanges move f times the routed rows instead of P times (overflow waits for another round).
    Both default to the `experts`' own. `chunks_per_round`: slices per round (2: communication overlaps
    compute in a one-round step); `overlap` False issues the same exchanges blocking (a reference).
    `last_stats` = {rounds, tokens_per_expert (global), buffer_rows, peer_rows, ...}: reading it
    reads the device once; `last_rounds` is the round count as a 0-d device tensor.
    """

    def __init__(self, experts: RoutedExperts, group: Any, *, capacity_per_expert: int | None = None,
                 capacity_factor: float | None = None, group_size: int | None = None, chunks_per_round: int = 2,
                 overlap: bool = True):
        super().__init__()
        self.group = group
        self.n_ranks, self.rank = dist.get_world_size(group), dist.get_rank(group)
        E = experts.n_experts
        self.local_experts, self.group_size = check_layout(E, self.n_ranks, group_size or min(
            experts.group_size, max(1, E // self.n_ranks)))
        self.n_experts = E
        self.latent_dim, self.hidden, self.backend = experts.latent_dim, experts.hidden, experts.backend
        if capacity_per_expert is None and capacity_factor is None:
            capacity_per_expert, capacity_factor = experts.capacity_per_expert, experts.capacity_factor
        self.capacity_per_expert, self.capacity_factor = capacity_per_expert, capacity_factor
        if capacity_per_expert is not None and capacity_per_expert < 1:
            raise ExpertParallelError(f"capacity_per_expert must be >= 1 or None, got {capacity_per_expert}")
        if capacity_factor is not None and not (capacity_factor > 0 and math.isfinite(capacity_factor)):
            raise ExpertParallelError(f"capacity_factor must be a finite number > 0 or None, got {capacity_factor}")
        if capacity_per_expert is not None and capacity_factor is not None:
            raise ExpertParallelError(f"capacity_per_expert={capacity_per_expert} and capacity_factor="
                                      f"{capacity_factor} both size the rounds: set one")
        if chunks_per_round < 1:
            raise ExpertParallelError(f"chunks_per_round must be >= 1, got {chunks_per_round}")
        self.chunks_per_round, self.overlap = chunks_per_round, overlap
        lo, hi = self.rank * self.local_experts, (self.rank + 1) * self.local_experts
        self.first_expert = lo  # this rank holds experts [lo, hi) of the stack
        for name in ("w_gate", "w_up", "w_down"):
            setattr(self, name, nn.Parameter(getattr(experts, name).detach()[lo:hi].clone()))
        self._stats: dict = {}
        self._stats_host: dict | None = None
        self._held = None  # a rungs.held_weights.HeldWeights inside `held_expert_weights`

    @staticmethod
    def cast_stacks(w_gate: Tensor, w_up: Tensor, w_down: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """The local stacks in the compute dtype, as forward and backward use them (what
        `rungs.held_weights` holds)."""
        return _cast_each(w_gate, w_up, w_down, dtype)

    def extra_repr(self) -> str:
        return (f"experts {self.rank * self.local_experts}..{(self.rank + 1) * self.local_experts - 1} of "
                f"{self.n_experts}, capacity_per_expert={self.capacity_per_expert}, capacity_factor="
                f"{self.capacity_factor}, group_size={self.group_size}, "
                f"chunks_per_round={self.chunks_per_round}")

    def layout(self, n_pairs: int) -> EPLayout:
        """The static sizes of a call with `n_pairs` (token, slot) pairs on every rank."""
        peer_capacity = None
        if self.capacity_factor is not None:
            capacity, peer_capacity = factor_capacities(self.capacity_factor, self.n_ranks, self.n_experts, n_pairs)
        else:
            capacity = self.capacity_per_expert or max(1, math.ceil(n_pairs * self.n_ranks / self.group_size))
        return EPLayout(self.n_ranks, self.n_experts, self.group_size, capacity, n_pairs, self.chunks_per_round,
                        peer_capacity)

    @property
    def last_stats(self) -> dict:
        if self._stats_host is None:
            stats = dict(self._stats)
            if stats:
                stats["rounds"] = int(stats["rounds"])
            self._stats_host = stats
        return self._stats_host

    @property
    def last_rounds(self) -> Tensor:
        """`last_stats["rounds"]` as a 0-d device tensor, not read on the host (as `RoutedExperts`)."""
        if not self._stats:
            raise ExpertParallelError("last_rounds is only defined after a forward")
        return self._stats["rounds"]

    def forward(self, x: Tensor, expert_idx: Tensor, gate: Tensor) -> Tensor:
        n_tokens, k = expert_idx.shape
        if x.shape != (n_tokens, self.latent_dim) or gate.shape != expert_idx.shape:
            raise ExpertParallelError(f"x must be (T, {self.latent_dim}) and gate like expert_idx (T, k); got "
                                      f"{tuple(x.shape)}, {tuple(expert_idx.shape)}, {tuple(gate.shape)}")
        flat = expert_idx.reshape(-1).long()
        lay = self.layout(flat.numel())  # every rank routes the same number of tokens
        gathered = torch.empty(self.n_ranks * self.n_experts, dtype=torch.long, device=x.device)
        dist.all_gather_single(gathered, count_per_expert(flat, self.n_experts), group=self.group)
        plan = Plan(lay, gathered.view(self.n_ranks, self.n_experts), torch.argsort(flat, stable=True), self.rank)
        device_type = x.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        if flat.numel():
            y_pairs = _EPExperts.apply(x.to(dtype), self.w_gate, self.w_up, self.w_down, plan, k, self.group,
                                       self.backend, self.overlap, self._held)
        else:
            y_pairs = x.new_zeros(0, self.latent_dim, dtype=dtype)
        out = torch.bmm(gate.to(dtype).unsqueeze(1), y_pairs.view(n_tokens, k, self.latent_dim)).squeeze(1)
        self._stats = {"rounds": plan.n_rounds, "tokens_per_expert": plan.total, "capacity_per_expert": lay.capacity,
                       "peer_capacity": lay.peer_capacity, "group_size": self.group_size,
                       "buffer_rows": lay.compute_rows, "peer_rows": lay.peer_rows,
                       "chunks_per_round": lay.chunks, "max_rounds": lay.max_rounds}
        self._stats_host = None
        return out


def peak_allocated_bytes(fn) -> tuple[Any, int]:
    """(fn(), peak bytes of tensors live at once while it ran, above what was live before): CUDA's
    counter on GPU; on CPU torch's MemTracker, which follows every tensor storage an op creates and
    frees (a dispatch mode, so it sees forward, the custom backward and the collectives' buffers)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        return out, torch.cuda.max_memory_allocated() - base
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        out = fn()
    peak = tracker.get_tracker_snapshot("peak")
    return out, int(sum(v["Total"] for v in peak.values()))
