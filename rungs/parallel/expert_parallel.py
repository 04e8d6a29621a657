"""Expert parallelism with multi-round dropless dispatch (the report's MoE systems work).

`ExpertParallelExperts` replaces a `rungs.moe.RoutedExperts` from outside (the model is unchanged):
the E experts are split across the P ranks of an expert-parallel (EP) group, rank r holding experts
[r·E/P, (r+1)·E/P) with the same parameter names. Per forward:

1. each rank counts its (token, slot) pairs per expert; ONE all-gather gives every rank the
   (P, E) count matrix, from which every rank derives the same round plan (`rungs.moe.plan_rounds`
   on the global per-expert loads: an expert is guaranteed `capacity` rows a round, its group mates'
   unused slots go to overloaded experts, the rest waits for the next round). The number of rounds
   R is therefore the same on every rank of the group without another collective (the gathered
   matrix is the all-reduce MAX of the issue, plus every source's send plan);
2. per round, each source packs the rows it sends into a flat buffer and ONE `all_to_all_single`
   delivers them; each rank's experts run one grouped matmul over a receive buffer of fixed size
   `E/P · capacity` rows (a hot expert costs rounds, never memory); a second `all_to_all_single`
   returns the outputs; ranks whose experts have nothing left in a round skip the compute. In the
   forward pass the next round's dispatch is issued asynchronously before this round's GEMMs (two
   fixed receive buffers), so communication overlaps expert compute;
3. backward recomputes each round (re-dispatching x together with the output gradient in one
   exchange), so saved activations do not grow with the number of rounds.

Expert weight gradients are the sum over all sources of the EP group; under DP×EP the caller
reduces them over the data-parallel replicas (`rungs.parallel.distributed`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from rungs.moe import RoutedExperts, grouped_mm, plan_rounds


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


class _Round:
    """One round's exchange, seen from this rank (all counts derived from the shared plan)."""

    def __init__(self, send_pairs: Tensor, send_splits: list[int], recv_splits: list[int],
                 recv_perm: Tensor, expert_ends: list[int]):
        self.send_pairs = send_pairs      # pair ids this rank sends, in (dest rank, expert) order
        self.send_splits = send_splits    # rows to each rank
        self.recv_splits = recv_splits    # rows from each rank
        self.recv_perm = recv_perm        # received (src, expert) order -> (expert, src) order
        self.expert_ends = expert_ends    # cumulative rows per local expert in (expert, src) order

    def to(self, device: torch.device) -> _Round:
        self.send_pairs, self.recv_perm = self.send_pairs.to(device), self.recv_perm.to(device)
        return self

    @property
    def recv_rows(self) -> int:
        return self.expert_ends[-1] if self.expert_ends else 0


def build_rounds(counts: Tensor, order: Tensor, rank: int, capacity: int, group_size: int) -> list[_Round]:
    """The per-round exchange of `rank` from the (P, E) matrix of pairs per (source rank, expert).

    Expert e's pairs are ordered source-major (source 0's first), each source's in its local
    (stable, by-expert) `order`; round r takes the next `plan[r][e]` of them.
    """
    n_ranks, n_experts = counts.shape
    local = n_experts // n_ranks
    mine = slice(rank * local, (rank + 1) * local)
    plan = torch.tensor(plan_rounds(counts.sum(0).tolist(), capacity, group_size), dtype=torch.long)
    plan = plan.reshape(-1, n_experts)
    done = torch.cat([torch.zeros(1, n_experts, dtype=torch.long), plan.cumsum(0)])    # (R+1, E)
    src_lo = torch.cat([torch.zeros(1, n_experts, dtype=torch.long), counts.cumsum(0)[:-1]])  # (P, E)
    src_hi = src_lo + counts
    my_start = torch.cat([torch.zeros(1, dtype=torch.long), counts[rank].cumsum(0)[:-1]])   # (E,)
    rounds = []
    for r in range(plan.shape[0]):
        lo = torch.maximum(done[r][None], src_lo)
        rows = (torch.minimum(done[r + 1][None], src_hi) - lo).clamp_min(0)                # (P, E)
        offset = (lo - src_lo).clamp_min(0)
        # what this rank sends: its rows for every expert, experts in order = destination-major
        take, first = rows[rank], my_start + offset[rank]
        total = int(take.sum())
        seg = take.cumsum(0) - take
        idx = torch.repeat_interleave(first - seg, take, output_size=total) + torch.arange(total)
        send_splits = take.view(n_ranks, local).sum(1).tolist()
        # what this rank receives: block per source, its local experts in order inside each
        got = rows[:, mine]                                                                # (P, local)
        recv_splits = got.sum(1).tolist()
        src_major = torch.arange(int(got.sum())).split(got.reshape(-1).tolist())           # (src, expert) blocks
        expert_major = [src_major[s * local + e] for e in range(local) for s in range(n_ranks)]
        recv_perm = torch.cat(expert_major) if expert_major else torch.zeros(0, dtype=torch.long)
        rounds.append(_Round(order[idx], send_splits, recv_splits, recv_perm, got.sum(0).cumsum(0).tolist()))
    return rounds


def _exchange(rows: Tensor, send_splits: list[int], recv_splits: list[int], out: Tensor, group: Any) -> Tensor:
    """All-to-all of rows into the head of the fixed buffer `out`."""
    recv = out[:sum(recv_splits)]
    dist.all_to_all_single(recv, rows.contiguous(), recv_splits, send_splits, group=group)
    return recv


class _EPExperts(torch.autograd.Function):
    """y_pairs[p] = expert(e_p)(x[p // k]) with experts spread over the EP group; rounds recomputed."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, rounds, k, buffer_rows, group, backend):
        ctx.save_for_backward(x, w_gate, w_up, w_down)
        ctx.rounds, ctx.k, ctx.buffer_rows, ctx.group, ctx.backend = rounds, k, buffer_rows, group, backend
        latent = x.shape[1]
        y_pairs = x.new_zeros(x.shape[0] * k, latent)
        # two fixed receive buffers: round r+1's dispatch is in flight while round r computes
        recv_bufs = [x.new_zeros(buffer_rows, latent), x.new_zeros(buffer_rows, latent)]
        out_buf = x.new_zeros(buffer_rows, latent)
        back_buf = x.new_zeros(x.shape[0] * k, latent)

        def dispatch(r: int):
            rnd = rounds[r]
            rows = x[rnd.send_pairs // k]
            recv = recv_bufs[r % 2][:sum(rnd.recv_splits)]
            handle = dist.all_to_all_single(recv, rows, rnd.recv_splits, rnd.send_splits, group=group, async_op=True)
            return handle, recv, rows  # rows must outlive the exchange

        pending = dispatch(0) if rounds else None
        for r, rnd in enumerate(rounds):
            upcoming = dispatch(r + 1) if r + 1 < len(rounds) else None
            handle, recv, _ = pending
            handle.wait()
            n = rnd.recv_rows
            if n:  # nothing left for this rank's experts: skip the compute, still join the exchange
                xin = recv[rnd.recv_perm]
                ends = rnd.expert_ends
                offs = torch.tensor(ends, dtype=torch.int32, device=x.device)
                h = F.silu(grouped_mm(xin, w_gate.mT, offs, ends, backend)) * grouped_mm(xin, w_up.mT, offs, ends, backend)
                out_buf[:n][rnd.recv_perm] = grouped_mm(h, w_down.mT, offs, ends, backend)
            back = _exchange(out_buf[:n], rnd.recv_splits, rnd.send_splits, back_buf, group)
            y_pairs.index_copy_(0, rnd.send_pairs, back)
            pending = upcoming
        return y_pairs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y_pairs):
        x, w_gate, w_up, w_down = ctx.saved_tensors
        k, group, backend = ctx.k, ctx.group, ctx.backend
        latent = x.shape[1]
        grads = [torch.zeros(w.shape, dtype=torch.float32 if w.dtype != torch.float64 else w.dtype, device=w.device) for w in
                 (w_gate, w_up, w_down)]
        dx_pairs = x.new_zeros(x.shape[0] * k, latent)
        pack_bufs = [x.new_zeros(ctx.buffer_rows, 2 * latent), x.new_zeros(ctx.buffer_rows, 2 * latent)]
        dxin_buf = x.new_zeros(ctx.buffer_rows, latent)
        back_buf = x.new_zeros(x.shape[0] * k, latent)
        grad_y_pairs = grad_y_pairs.contiguous()
        rounds = ctx.rounds

        def dispatch(r: int):
            # one exchange re-dispatches the inputs (recompute) together with the output gradients
            rnd = rounds[r]
            rows = torch.cat([x[rnd.send_pairs // k], grad_y_pairs[rnd.send_pairs]], dim=1)
            recv = pack_bufs[r % 2][:sum(rnd.recv_splits)]
            handle = dist.all_to_all_single(recv, rows, rnd.recv_splits, rnd.send_splits, group=group, async_op=True)
            return handle, recv, rows

        pending = dispatch(0) if rounds else None
        for r, rnd in enumerate(rounds):
            upcoming = dispatch(r + 1) if r + 1 < len(rounds) else None  # overlaps this round's GEMMs
            handle, recv, _ = pending
            handle.wait()
            pending = upcoming
            n = rnd.recv_rows
            if n:
                both = recv[rnd.recv_perm]
                xin, dy = both[:, :latent].contiguous(), both[:, latent:].contiguous()
                ends = rnd.expert_ends
                offs = torch.tensor(ends, dtype=torch.int32, device=x.device)
                hg = grouped_mm(xin, w_gate.mT, offs, ends, backend)
                hu = grouped_mm(xin, w_up.mT, offs, ends, backend)
                sig = torch.sigmoid(hg)
                silu = hg * sig
                grads[2] += grouped_mm(dy.mT.contiguous(), silu * hu, offs, ends, backend)
                dh = grouped_mm(dy, w_down, offs, ends, backend)
                dhu = dh * silu
                dhg = dh * hu * sig * (1 + hg * (1 - sig))
                grads[0] += grouped_mm(dhg.mT.contiguous(), xin, offs, ends, backend)
                grads[1] += grouped_mm(dhu.mT.contiguous(), xin, offs, ends, backend)
                dxin = grouped_mm(dhg, w_gate, offs, ends, backend) + grouped_mm(dhu, w_up, offs, ends, backend)
                dxin_buf[:n][rnd.recv_perm] = dxin
            back = _exchange(dxin_buf[:n], rnd.recv_splits, rnd.send_splits, back_buf, group)
            dx_pairs.index_copy_(0, rnd.send_pairs, back)
        dx = dx_pairs.view(-1, k, latent).sum(1)
        dwg, dwu, dwd = (g.to(w.dtype) for g, w in zip(grads, (w_gate, w_up, w_down)))
        return dx, dwg, dwu, dwd, None, None, None, None, None


class ExpertParallelExperts(nn.Module):
    """This rank's share of a `RoutedExperts`, exchanging tokens with the rest of the EP group.

    forward(x (T, latent), expert_idx (T, k), gate (T, k)) -> (T, latent), the same contract as
    `RoutedExperts`. `capacity_per_expert` None: one round always fits (capacity = all pairs of
    the group / group_size). `last_stats` = {rounds, tokens_per_expert (global), buffer_rows, ...}.
    """

    def __init__(self, experts: RoutedExperts, group: Any, *, capacity_per_expert: int | None = None,
                 group_size: int | None = None):
        super().__init__()
        self.group = group
        self.n_ranks, self.rank = dist.get_world_size(group), dist.get_rank(group)
        E = experts.n_experts
        self.local_experts, self.group_size = check_layout(E, self.n_ranks, group_size or min(
            experts.group_size, max(1, E // self.n_ranks)))
        self.n_experts = E
        self.latent_dim, self.hidden, self.backend = experts.latent_dim, experts.hidden, experts.backend
        self.capacity_per_expert = capacity_per_expert if capacity_per_expert is not None else experts.capacity_per_expert
        if self.capacity_per_expert is not None and self.capacity_per_expert < 1:
            raise ExpertParallelError(f"capacity_per_expert must be >= 1 or None, got {self.capacity_per_expert}")
        lo, hi = self.rank * self.local_experts, (self.rank + 1) * self.local_experts
        self.first_expert = lo  # this rank holds experts [lo, hi) of the stack
        for name in ("w_gate", "w_up", "w_down"):
            setattr(self, name, nn.Parameter(getattr(experts, name).detach()[lo:hi].clone()))
        self.last_stats: dict = {}

    def extra_repr(self) -> str:
        return (f"experts {self.rank * self.local_experts}..{(self.rank + 1) * self.local_experts - 1} of "
                f"{self.n_experts}, capacity_per_expert={self.capacity_per_expert}, group_size={self.group_size}")

    @property
    def last_rounds(self) -> Tensor:
        """`last_stats["rounds"]` as a 0-d tensor (as `RoutedExperts.last_rounds`); this path plans its
        rounds on the host, so it is a host value moved to the device."""
        return torch.tensor(self.last_stats["rounds"], device=self.w_gate.device)

    def forward(self, x: Tensor, expert_idx: Tensor, gate: Tensor) -> Tensor:
        n_tokens, k = expert_idx.shape
        if x.shape != (n_tokens, self.latent_dim) or gate.shape != expert_idx.shape:
            raise ExpertParallelError(f"x must be (T, {self.latent_dim}) and gate like expert_idx (T, k); got "
                                      f"{tuple(x.shape)}, {tuple(expert_idx.shape)}, {tuple(gate.shape)}")
        flat = expert_idx.reshape(-1).long()
        local_counts = torch.bincount(flat, minlength=self.n_experts)
        gathered = torch.empty(self.n_ranks * self.n_experts, dtype=torch.long, device=x.device)
        dist.all_gather_single(gathered, local_counts, group=self.group)    # the one count collective
        counts = gathered.view(self.n_ranks, self.n_experts).cpu()  # the plan is host-side bookkeeping
        pairs_in_group = n_tokens * k * self.n_ranks  # every rank routes the same number of tokens
        capacity = self.capacity_per_expert or max(1, math.ceil(pairs_in_group / self.group_size))
        buffer_rows = self.local_experts * capacity  # fixed: a round never brings more
        order = torch.argsort(flat, stable=True).cpu()
        rounds = build_rounds(counts, order, self.rank, capacity, self.group_size)
        rounds = [r.to(x.device) for r in rounds]
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled(x.device.type) else x.dtype
        weights = [w.to(dtype) for w in (self.w_gate, self.w_up, self.w_down)]
        y_pairs = _EPExperts.apply(x.to(dtype), *weights, rounds, k, buffer_rows, self.group, self.backend)
        out = torch.bmm(gate.to(dtype).unsqueeze(1), y_pairs.view(n_tokens, k, self.latent_dim)).squeeze(1)
        self.last_stats = {"rounds": len(rounds), "tokens_per_expert": counts.sum(0),
                           "capacity_per_expert": capacity, "group_size": self.group_size,
                           "buffer_rows": buffer_rows, "received_rows_max": max((r.recv_rows for r in rounds), default=0)}
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
