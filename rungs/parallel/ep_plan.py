"""The expert-parallel round plan on the device: fixed sizes from shapes, every index from the counts.

`rungs.parallel.expert_parallel` exchanges (token, slot) pairs between the P ranks of an EP group.
Every rank holds the same (P, E) matrix of pairs per (source rank, expert) after one all-gather, and
derives from it, with tensor ops only (no host read, no op whose output size depends on the data):

- the round plan of `rungs.moe.plan_rounds` over the group's per-expert loads (`round_take`, its
  closed form): expert e is guaranteed `capacity` rows a round, its group mates' unused slots go to
  overloaded experts, the rest waits. Expert e's pairs are taken source-major (source 0's first),
  each source's in its stable by-expert order, so every rank knows which of its pairs go where;
- with a `peer_capacity` (a capacity factor, `rungs.parallel.expert_parallel`), first a cap on each
  (source, destination) block a round: a source offers each destination at most peer_capacity rows,
  that destination's experts in order, and the experts' capacities apply to what is offered. The
  fixed send buffers then follow the balanced load, not the worst case (a source can route all its
  n pairs to one peer, so without it every peer's buffer holds n rows: P times the routed volume);
- per round, each (source, destination) block of t rows is cut into `chunks` slices (its first
  t/chunks rows, then the next...), so that one slice's exchange overlaps another slice's GEMMs even
  in a one-round step;
- per slice, the index maps (`SliceMaps`): which pair fills each row of the fixed send buffer,
  which compute row each received row lands in (grouped by local expert, then source), and the
  grouped-matmul offsets.

Sizes are fixed by the shapes (`EPLayout`): each slice sends every peer exactly `peer_rows` rows
(padded), so `all_to_all_single` runs with equal splits and needs no split sizes on the host; a
round never brings a rank's experts more than `local_experts · capacity` rows, so the compute
buffer is fixed too. Skew costs rounds, never memory.

Without a binding peer capacity the number of rounds has a closed form, ceil(max group load /
slab) (`Plan.n_rounds`); with one it depends on how the two caps interact, and is known only by
running the plan: `Plan.rounds` yields, with each round, the pairs still left after it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["EPLayout", "Plan", "SliceMaps", "factor_capacities", "round_take"]

ROW_ALIGN = 8  # grouped_mm's 16-byte rule on row strides; buffers' row counts are padded to it


def _align(rows: int) -> int:
    return -(-max(rows, 1) // ROW_ALIGN) * ROW_ALIGN


@dataclass(frozen=True)
class EPLayout:
    """Static sizes of one call, the same on every rank of the group (every rank routes n pairs)."""

    n_ranks: int        # P
    n_experts: int      # E, over the whole group
    group_size: int     # experts that lend each other unused slots (divides E / P)
    capacity: int       # guaranteed rows per expert per round
    local_pairs: int    # n = T·k, this rank's (token, slot) pairs
    chunks: int = 2     # slices per round
    peer_capacity: int | None = None  # rows a source sends one destination per round (None: no cap)

    @property
    def local_experts(self) -> int:
        return self.n_experts // self.n_ranks

    @property
    def slab_rows(self) -> int:
        return self.group_size * self.capacity

    @property
    def block_rows(self) -> int:
        """Rows one source sends one destination in a round, at most: the destination's slabs, the
        source's n pairs, and the peer capacity."""
        rows = min(self.local_experts * self.capacity, self.local_pairs)
        return rows if self.peer_capacity is None else min(rows, self.peer_capacity)

    @property
    def peer_capped(self) -> bool:
        """Whether the peer capacity can bind (some routing sends a block more than it): the round
        count then has no closed form (`Plan.rounds`)."""
        return self.block_rows < min(self.local_experts * self.capacity, self.local_pairs)

    @property
    def max_rounds(self) -> int:
        """Rounds of the worst routing: every pair of the group in one group of experts, or every
        pair of a source to one peer. Exact without a binding peer capacity; with one a lower bound
        (the greedy plan can waste an expert's slots on a round whose offers went elsewhere). 1
        means every step is one round, known without reading the counts."""
        return max(math.ceil(self.n_ranks * self.local_pairs / self.slab_rows),
                   math.ceil(self.local_pairs / self.block_rows))

    @property
    def round_rows(self) -> int:
        """Rows a rank's experts compute in one round, at most: their slabs, or every pair."""
        return min(self.local_experts * self.capacity, self.n_ranks * self.local_pairs)

    @property
    def peer_rows(self) -> int:
        """Rows each rank sends each peer per slice: a slice carries ceil(1/chunks) of a block."""
        return math.ceil(self.block_rows / self.chunks)

    @property
    def compute_rows(self) -> int:
        """Rows of one slice's compute buffer: a slice takes at most ceil(t/chunks) of each
        source's t rows, so at most (round rows + P·(chunks - 1)) / chunks, and what was received."""
        per_slice = (self.round_rows + self.n_ranks * (self.chunks - 1)) // self.chunks
        return _align(min(per_slice, self.n_ranks * self.peer_rows))


def factor_capacities(factor: float, n_ranks: int, n_experts: int, local_pairs: int) -> tuple[int, int]:
    """(capacity per expert, peer capacity) at `factor` times the balanced load: an expert's share of
    the group's P·n pairs, and a destination's share of a source's n (ladder.plan.memory mirrors it)."""
    return (max(1, math.ceil(factor * n_ranks * local_pairs / n_experts)),
            max(1, math.ceil(factor * local_pairs / n_ranks)))


def round_take(remaining: Tensor, r: int, capacity: int, group_size: int) -> Tensor:
    """(E,) rows each expert computes in round r given the (E,) rows it still has: one round of
    `rungs.moe.plan_rounds`, closed form. In each group, lending starts at member r mod group_size;
    the sequential loop (each member in turn takes min(its need, what is left of the spare slots))
    is: member j of that order gets min(need_j, max(0, spare - the needs before it))."""
    shift = r % group_size
    rem = torch.roll(remaining.view(-1, group_size), -shift, dims=1)      # (groups, gs), lending order
    take = rem.clamp(max=capacity)
    spare = group_size * capacity - take.sum(1, keepdim=True)             # (groups, 1)
    need = rem - take
    before = torch.cumsum(need, 1) - need
    take = take + torch.minimum(need, (spare - before).clamp(min=0))
    return torch.roll(take, shift, dims=1).reshape(-1)


@dataclass
class SliceMaps:
    """One slice of one round, seen from this rank. All tensors on the device, sizes fixed."""

    send_pair: Tensor    # (P·peer_rows,) pair id of each send row (any valid id on padding rows)
    pair_slot: Tensor    # (P·peer_rows,) where each returned row goes: its pair id, n on padding
    recv_row: Tensor     # (P·peer_rows,) compute row of each received row, compute_rows on padding
    compute_row: Tensor  # (P·peer_rows,) the compute row each returned row is read from (clamped)
    offs: Tensor         # (E/P,) int32: end row of each local expert in the compute buffer


class Plan:
    """Everything a rank derives from the gathered (P, E) counts, shared by forward and backward."""

    def __init__(self, lay: EPLayout, counts: Tensor, order: Tensor, rank: int):
        self.lay, self.rank = lay, rank
        self.order = order                                                    # my pairs sorted by expert (stable)
        self.counts = counts                                                  # (P, E)
        self.total = counts.sum(0)                                            # (E,) the group's load per expert
        mine = counts[rank]
        self.my_start = torch.cumsum(mine, 0) - mine                          # (E,) start in my sorted order
        loads = self.total.view(-1, lay.group_size).sum(1)                    # (groups,)
        # the closed form; under a binding peer capacity the caller replaces it by the rounds it ran
        self.n_rounds = torch.div(loads.max() + lay.slab_rows - 1, lay.slab_rows, rounding_mode="floor")
        dev = counts.device
        self._slot = torch.arange(lay.peer_rows, device=dev).repeat(lay.n_ranks, 1)  # (P, peer_rows)

    def take(self, remaining: Tensor, r: int) -> Tensor:
        """(P, E) rows of each (source, expert) that round r takes, given the (P, E) rows left: each
        source offers each destination at most the peer capacity (that destination's experts in
        order), each expert takes its `round_take` of what it is offered, source-major."""
        lay = self.lay
        offer = remaining
        if lay.peer_capped:
            blocks = remaining.view(lay.n_ranks, lay.n_ranks, lay.local_experts)   # (src, dst, local expert)
            before = torch.cumsum(blocks, -1) - blocks
            offer = torch.minimum(blocks, (lay.block_rows - before).clamp(min=0)).view_as(remaining)
        taken = round_take(offer.sum(0), r, lay.capacity, lay.group_size)      # (E,)
        lo = torch.cumsum(offer, 0) - offer                                    # (P, E) offered by earlier sources
        return (taken[None] - lo).clamp(min=0).minimum(offer)

    def rounds(self) -> Iterator[tuple[list[SliceMaps], Tensor]]:
        """Round after round, without end: its slices, and the pairs of the group still left after it
        (a 0-d device tensor). The caller stops: after `n_rounds`, or at the first round that leaves
        none. Each pass (forward, then backward) recomputes the plan from the counts, so nothing of a
        round outlives it."""
        done = torch.zeros_like(self.counts)   # (P, E) pairs of each (source, expert) earlier rounds took
        r = 0
        while True:
            take = self.take(self.counts - done, r)
            left = (self.counts - done - take).sum()
            yield [self.slice(done, take, h) for h in range(self.lay.chunks)], left
            done, r = done + take, r + 1

    def slice(self, done: Tensor, take: Tensor, h: int) -> SliceMaps:
        """Index maps of slice h (of `chunks`) of the round that takes rows [done, done + take) of each
        (source, expert), (P, E) each."""
        lay, me = self.lay, self.rank
        P, L, C = lay.n_ranks, lay.local_experts, lay.chunks
        rows3 = take.view(P, P, L)                                            # (src, dst, local expert)
        block = rows3.sum(-1, keepdim=True)                                   # (P, P, 1) rows per (src, dst)
        cut_lo, cut_hi = (h * block) // C, ((h + 1) * block) // C             # this slice of each block
        at = torch.cumsum(rows3, -1) - rows3                                  # expert's start in the block
        first = torch.maximum(at, cut_lo)
        u = (torch.minimum(at + rows3, cut_hi) - first).clamp(min=0)          # (P, P, L) the slice's rows
        skip = done.view(P, P, L) + (first - at)                              # the source's rows of e before

        # Send: my block to each destination d, experts in order; slot i -> one of my pairs.
        mine = u[me]                                                          # (P, L) by destination
        ends = torch.cumsum(mine, -1)
        e = torch.searchsorted(ends, self._slot, right=True).clamp(max=L - 1)   # (P, peer_rows) local expert
        valid = self._slot < ends[:, -1:]
        start_in_slice = torch.gather(ends - mine, 1, e)
        expert = e + torch.arange(P, device=e.device)[:, None] * L            # global expert id
        sorted_at = self.my_start[expert] + torch.gather(skip[me], 1, e) + self._slot - start_in_slice
        n = self.order.numel()
        send_pair = self.order[sorted_at.clamp(0, max(n - 1, 0)).reshape(-1)]
        pair_slot = torch.where(valid.reshape(-1), send_pair, n)

        # Receive: source s's block for my experts, slot i -> a compute row grouped by (expert, source).
        got = u[:, me]                                                        # (P, L) by source
        ends = torch.cumsum(got, -1)
        e = torch.searchsorted(ends, self._slot, right=True).clamp(max=L - 1)   # (P, peer_rows)
        valid = self._slot < ends[:, -1:]
        per_expert = got.sum(0)                                               # (L,)
        offs = torch.cumsum(per_expert, 0)
        by_source = torch.cumsum(got, 0) - got                                # (P, L) sources before s
        row = (offs - per_expert)[e] + torch.gather(by_source, 1, e) + self._slot - torch.gather(ends - got, 1, e)
        recv_row = torch.where(valid, row, lay.compute_rows).reshape(-1)
        return SliceMaps(send_pair, pair_slot, recv_row, recv_row.clamp(max=lay.compute_rows - 1),
                         offs.to(torch.int32))
