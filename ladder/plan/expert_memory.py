"""The routed experts' bytes per rank for `ladder.plan.memory`: one process (`rungs.moe`) or expert
parallel (`rungs.parallel.expert_parallel`), with or without a capacity factor. Pure arithmetic, no
torch: the sizes of `rungs.parallel.ep_plan.EPLayout` are mirrored here (a test holds them equal).

Expert parallelism, per layer call, P ranks, n = T·k pairs per rank, L = E/P experts per rank, two
slices a round (`chunks_per_round`), latent width `lat`, hidden `hid`, compute dtype bytes `a`:

- capacity per expert `cap` (default: every pair of the group fits one round; with a capacity factor
  f: ceil(f·P·n / E)) and peer capacity (default none; with f: ceil(f·n / P));
- S = ceil(min(L·cap, n, peer capacity) / 2) rows to every peer per slice; every exchange buffer is
  P·S rows; the compute buffer B = align8(min((min(L·cap, P·n) + P) // 2, P·S)) rows;
- forward: 8 buffers of P·S × lat (send, receive, return, collect; two sets), the compute buffer's
  input rows, 3 × B × hid at the SwiGLU's worst moment, and the slices' int64 index maps;
- backward: 4 dispatch buffers of P·S × 2·lat (inputs re-sent with the output gradients) and 4
  return buffers of P·S × lat, the compute buffer's inputs and gradients (2 × B × lat), the per-pair
  input gradients and the incoming output gradient (n × lat each), the tokens' input gradient,
  9 × B × hid at the SwiGLU backward's worst moment (or 7 and a weight-gradient partial, whichever
  is more), and the fp32 weight-gradient accumulators of the L local experts.

Without a factor a peer's block is sized for all of a source's n pairs, so each buffer holds P·n/2
rows: P times the balanced share. A factor sizes them by the balanced load (see PLANNED_CAPACITY_FACTOR).
"""

from __future__ import annotations

import math

__all__ = ["EP_CHUNKS", "PLANNED_CAPACITY_FACTOR", "ep_rows", "expert_activations", "expert_backward",
           "expert_forward", "factor_capacities", "planned_capacity_factor"]

FP32_BYTES, INT64_BYTES = 4, 8
# grouped_mm pads the experts' row buffers to this many rows (rungs.moe._ROW_ALIGN, ep_plan.ROW_ALIGN).
EXPERT_ROW_ALIGN = 8
# Slices per round of ExpertParallelExperts (its chunks_per_round default; a test holds them equal).
EP_CHUNKS = 2
# The capacity factor the planner gives an expert-parallel layout: slots and per-peer rows at 1.5x the
# balanced load. Measured on mai-base-2 L18's shapes (ep=8, 512 experts, top-7, one 4096-token
# sequence per rank) with a router whose logits add an expert bias the balancing loss leaves, a
# per-sequence expert affinity and per-token noise (N(0,1) each, scaled): balanced routing needs
# 1.06 (p99 of calls); an aux-loss-like imbalance (max expert 1.6-2.3x its mean over the batch, up to
# 4x within one sequence) needs 1.16-1.27 at p99, the largest seen 1.27; a router 3x as skewed (per-
# sequence max 6x) 1.42. The per-peer cap binds first (one sequence's pairs to one rank's 64
# experts pool no other rank's), and the needed factor is narrow (sd ~0.03), so at 1.5 a one-round
# call is the rule even over the 18 layers x 64 micro-batches of a step; at 1.25 the aux-loss cases
# would overflow in a few calls per thousand, i.e. most steps. 1.5 moves 1.5x the routed rows per
# exchange instead of P x.
PLANNED_CAPACITY_FACTOR = 1.5


def _align(rows: int) -> int:
    return -(-max(rows, 1) // EXPERT_ROW_ALIGN) * EXPERT_ROW_ALIGN


def factor_capacities(factor: float, n_ranks: int, n_experts: int, local_pairs: int) -> tuple[int, int]:
    """(capacity per expert, peer capacity) at `factor` x the balanced load
    (`rungs.parallel.ep_plan.factor_capacities`)."""
    return (max(1, math.ceil(factor * n_ranks * local_pairs / n_experts)),
            max(1, math.ceil(factor * local_pairs / n_ranks)))


def ep_rows(n_experts: int, ep: int, pairs: int, capacity_factor: float | None) -> tuple[int, int]:
    """(P·S rows of every exchange buffer, B rows of the compute buffer) of one call with `pairs`
    (token, slot) pairs per rank: `EPLayout`'s P·peer_rows and compute_rows."""
    local = n_experts // ep
    if capacity_factor is None:  # one round always fits: capacity = every pair of the group / group
        capacity, peer = math.ceil(pairs * ep / local), None
    else:
        capacity, peer = factor_capacities(capacity_factor, ep, n_experts, pairs)
    block = min(local * capacity, pairs, peer if peer is not None else pairs)
    peer_rows = math.ceil(block / EP_CHUNKS)
    round_rows = min(local * capacity, ep * pairs)
    per_slice = (round_rows + ep * (EP_CHUNKS - 1)) // EP_CHUNKS
    return ep * peer_rows, _align(min(per_slice, ep * peer_rows))


def _index_bytes(send_rows: int) -> int:
    # a round's slices' maps (send_pair, pair_slot, recv_row, compute_row per slice) and the
    # temporaries one slice's planning makes (local expert, starts, global expert, sorted position)
    return (EP_CHUNKS * 4 + 4) * send_rows * INT64_BYTES


def _single_rows(n_experts: int, pairs: int, capacity_factor: float | None) -> int:
    """`rungs.moe.RoutedExperts`' round buffer: min(E·capacity, T·k) rows, aligned."""
    capacity_rows = pairs if capacity_factor is None else n_experts * math.ceil(capacity_factor * pairs / n_experts)
    return _align(min(capacity_rows, pairs))


def expert_activations(n_experts: int, top_k: int, latent: int, hidden: int, tokens: int, ep: int, a: int,
                       capacity_factor: float | None) -> int:
    """What one layer's routed experts keep for backward: their input rows (compute dtype), the gates
    (fp32) and indices, the counts; one process: the kept one-round slab (xin, hg, hu), nothing when
    the call takes several rounds (each is recomputed); under ep: the per-pair outputs the gate's bmm
    saves, and the plan (the sorted pair order, the slot table, the gathered (P, E) counts)."""
    pairs = tokens * top_k
    kept = tokens * latent * a + pairs * (FP32_BYTES + INT64_BYTES) + n_experts * INT64_BYTES
    if ep > 1:
        send_rows, _ = ep_rows(n_experts, ep, pairs, capacity_factor)
        return kept + pairs * latent * a + pairs * INT64_BYTES + (send_rows + ep * n_experts) * INT64_BYTES
    rows = _single_rows(n_experts, pairs, capacity_factor)
    return kept + (rows * (latent + 2 * hidden) * a if rows >= pairs else 0)


def expert_forward(n_experts: int, top_k: int, latent: int, hidden: int, tokens: int, ep: int, a: int,
                   capacity_factor: float | None) -> int:
    """ExpertParallelExperts' forward transients (0 on one process: its slab is an activation)."""
    if ep == 1:
        return 0
    send_rows, compute_rows = ep_rows(n_experts, ep, tokens * top_k, capacity_factor)
    buffers = 8 * send_rows * latent * a
    compute = (compute_rows + 1) * latent * a + 3 * compute_rows * hidden * a
    return buffers + compute + _index_bytes(send_rows)


def expert_backward(n_experts: int, top_k: int, latent: int, hidden: int, tokens: int, ep: int, a: int,
                    capacity_factor: float | None) -> int:
    """One layer's expert backward on top of the saved tensors (`rungs.moe` / `expert_parallel`)."""
    local = n_experts // ep
    accumulators = 3 * local * hidden * latent * FP32_BYTES  # fp32 weight-gradient sums over rounds
    pairs = tokens * top_k
    if ep > 1:
        send_rows, rows = ep_rows(n_experts, ep, pairs, capacity_factor)
        buffers = (4 * 2 * latent + 4 * latent) * send_rows * a
        # d out and d x per pair, d x per token; the compute buffer's xin and dy
        rows_in = ((2 * pairs + 1 + tokens) + 2 * (rows + 1)) * latent * a
        # the SwiGLU backward: 9 (rows, hidden) tensors while d gate-pre-activation is formed, or 7 and
        # a weight-gradient partial
        work = max(9 * rows * hidden, 7 * rows * hidden + local * hidden * latent) * a
        return accumulators + buffers + rows_in + work + _index_bytes(send_rows)
    rows = _single_rows(n_experts, pairs, capacity_factor)
    return accumulators + (rows * latent + pairs * latent + rows * 4 * hidden + rows * latent) * a + pairs * FP32_BYTES


def planned_capacity_factor(ep: int, *, capacity_per_expert: int | None = None,
                            capacity_factor: float | None = None) -> float | None:
    """The capacity factor a layout of `ep` runs with: the one configured, none when a fixed capacity
    is configured or on one process (the factor only resizes the exchange), else
    PLANNED_CAPACITY_FACTOR when it saves anything (below ep: at f >= P the capped buffers are the
    default's)."""
    if capacity_factor is not None or capacity_per_expert is not None or ep == 1:
        return capacity_factor
    return PLANNED_CAPACITY_FACTOR if PLANNED_CAPACITY_FACTOR < ep else None
