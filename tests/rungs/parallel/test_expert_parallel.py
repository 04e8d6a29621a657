"""Expert-parallel multi-round dropless MoE equals the single-process RoutedExperts (real gloo ranks).

Each rank routes its own tokens; the reference runs `rungs.moe.RoutedExperts` with all experts on
the concatenation of every rank's tokens. Outputs, input gradients and expert weight gradients must
agree under random routing with a small capacity (several rounds) and under the worst routing
(every token of every rank to experts on rank 0), whose per-rank peak memory must stay within 10%
of balanced routing at the same calibrated capacity; with one slice per round and with two; and the
overlapped exchange (asynchronous, slice i+1's dispatch and slice i's return in flight during the
GEMMs) must give exactly what the same exchanges give blocking. Forward and backward read the host
never when the layout admits one round, once per forward when the capacity allows several, and
once per round under a capacity factor (whose per-peer cap leaves no closed-form round count).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from rungs.host_sync import HostSyncCounter
from rungs.moe import RoutedExperts
from rungs.parallel.expert_parallel import ExpertParallelError, ExpertParallelExperts, check_layout, peak_allocated_bytes
from tests.rungs.parallel.spawn import run_ranks

E, LATENT, HIDDEN, K, TOKENS = 8, 32, 64, 2, 48


def _routing(kind: str, rank: int, world: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "random":
        return torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(TOKENS)])
    if kind == "balanced":  # global pair index modulo E: every expert gets exactly TOKENS*K*world/E pairs
        pairs = torch.arange(TOKENS * K) + rank * TOKENS * K
        return (pairs % E).view(TOKENS, K)
    return torch.tensor([[0, 1]] * TOKENS)  # worst: all pairs of all ranks on rank 0's experts


def _inputs(rank: int, world: int, kind: str):
    gen = torch.Generator().manual_seed(7)  # same stream on every rank: build all ranks' inputs
    full = RoutedExperts(E, LATENT, HIDDEN, group_size=E)
    with torch.no_grad():
        for w in (full.w_gate, full.w_up, full.w_down):
            w.copy_(torch.randn(w.shape, generator=gen) * 0.2)
    xs = [torch.randn(TOKENS, LATENT, generator=gen) for _ in range(world)]
    idx = [_routing(kind, r, world, gen) for r in range(world)]
    gates = [torch.rand(TOKENS, K, generator=gen) for _ in range(world)]
    cots = [torch.randn(TOKENS, LATENT, generator=gen) for _ in range(world)]
    return full, xs, idx, gates, cots


def _ep_step(rank: int, world: int, kind: str, capacity: int | None, group_size: int, **ep_kwargs) -> dict:
    full, xs, idx, gates, cots = _inputs(rank, world, kind)
    ep = ExpertParallelExperts(full, dist.group.WORLD, capacity_per_expert=capacity, group_size=group_size,
                               **ep_kwargs)
    x = xs[rank].clone().requires_grad_(True)

    def step():
        out = ep(x, idx[rank], gates[rank])
        (out * cots[rank]).sum().backward()
        return out

    out, peak = peak_allocated_bytes(step)
    return {"out": out.detach(), "x": x.grad, **{n: getattr(ep, n).grad for n in ("w_gate", "w_up", "w_down")},
            "rounds": ep.last_stats["rounds"], "peak": peak, "full": full, "xs": xs, "idx": idx, "gates": gates,
            "cots": cots}


def _check(rank: int, world: int, kind: str, capacity: int | None, group_size: int, chunks: int = 2, **ep_kwargs) -> dict:
    got = _ep_step(rank, world, kind, capacity, group_size, chunks_per_round=chunks, **ep_kwargs)
    full = got["full"]
    xr = torch.cat(got["xs"]).requires_grad_(True)
    ref = full(xr, torch.cat(got["idx"]), torch.cat(got["gates"]))
    (ref * torch.cat(got["cots"])).sum().backward()
    rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
    local = slice(rank * E // world, (rank + 1) * E // world)

    def close(a, b, what):
        rel = (a - b).norm() / b.norm().clamp_min(1e-30)
        assert rel < 1e-5, f"rank {rank} {kind} chunks={chunks}: {what} relative error {rel:.2e}"

    close(got["out"], ref[rows], "output")
    close(got["x"], xr.grad[rows], "input gradient")
    for name in ("w_gate", "w_up", "w_down"):
        close(got[name], getattr(full, name).grad[local], f"{name} gradient")
    return got


def _worker(rank: int, world: int) -> None:
    pairs = TOKENS * K * world
    balanced_capacity = pairs // E  # calibrated: balanced routing fits one round exactly
    for chunks in (1, 2):
        _check(rank, world, "random", capacity=3, group_size=2, chunks=chunks)
    bal = _check(rank, world, "balanced", balanced_capacity, group_size=2)
    worst = _check(rank, world, "worst", balanced_capacity, group_size=2)
    assert bal["rounds"] == 1
    assert worst["rounds"] == math.ceil(pairs / (2 * balanced_capacity)), worst["rounds"]
    assert worst["peak"] <= 1.10 * bal["peak"], f"rank {rank}: worst-case peak {worst['peak']} vs balanced {bal['peak']}"
    assert bal["peak"] > 0
    # capacity factor 1.5: 72 slots per expert, 36 rows per peer a round (96 pairs per rank): balanced
    # routing in one round; the worst sends rank 0 96-row blocks, 3 rounds of the 36-row cap
    bal = _check(rank, world, "balanced", None, group_size=2, capacity_factor=1.5)
    worst = _check(rank, world, "worst", None, group_size=2, capacity_factor=1.5)
    assert (bal["rounds"], worst["rounds"]) == (1, 3), (bal["rounds"], worst["rounds"])
    assert worst["peak"] <= 1.10 * bal["peak"], f"rank {rank}: factor 1.5, worst {worst['peak']} vs {bal['peak']}"


def test_expert_parallel_matches_single_process_and_memory_is_flat():
    """4 ranks, 8 experts (2 per rank): random routing in several rounds, then worst-case skew."""
    run_ranks(_worker, 4)


def _overlap_worker(rank: int, world: int) -> None:
    for kind, capacity in (("random", None), ("random", 3), ("worst", 12)):
        a, b = (_ep_step(rank, world, kind, capacity, 2, chunks_per_round=2, overlap=o) for o in (True, False))
        assert a["rounds"] == b["rounds"] and (capacity is None) == (a["rounds"] == 1), (kind, a["rounds"])
        for name in ("out", "x", "w_gate", "w_up", "w_down"):
            assert torch.equal(a[name], b[name]), f"rank {rank} {kind} capacity={capacity}: {name} differs"


def test_overlapped_exchange_equals_the_blocking_one_exactly():
    """Two slices per round, 4 ranks: one round (capacity None) and several (random, worst skew)."""
    run_ranks(_overlap_worker, 4)


def _reads_worker(rank: int, world: int, out) -> None:
    result = {}
    for label, kind, capacity, factor in (("one round", "random", None, None), ("one round, skewed", "worst", None, None),
                                          ("rounds from the routing", "worst", 6, None),
                                          ("factor, balanced", "balanced", None, 1.5),
                                          ("factor, skewed", "worst", None, 1.5)):
        full, xs, idx, gates, cots = _inputs(rank, world, kind)
        ep = ExpertParallelExperts(full, dist.group.WORLD, capacity_per_expert=capacity, capacity_factor=factor,
                                   group_size=2)
        x = xs[rank].clone().requires_grad_(True)
        ep(x, idx[rank], gates[rank])                                          # warm-up: first-call set-up
        with HostSyncCounter() as forward:
            outs = [ep(x, idx[rank], gates[rank]) for _ in range(2)]          # two layer calls
        with HostSyncCounter() as backward:
            (sum(outs) * cots[rank]).sum().backward()
        result[label] = {"forward": dict(forward.counts), "where": dict(forward.where),
                         "backward": dict(backward.counts), "rounds": ep.last_stats["rounds"],
                         "max_rounds": ep.last_stats["max_rounds"]}
    out[rank] = result


def test_expert_parallel_forward_and_backward_read_the_host_only_for_a_routing_dependent_round_count():
    import torch.multiprocessing as mp

    out = mp.Manager().dict()
    run_ranks(_reads_worker, 2, out)
    for rank in range(2):
        got = out[rank]
        for label in ("one round", "one round, skewed"):
            assert got[label]["max_rounds"] == 1 and got[label]["rounds"] == 1
            assert got[label]["forward"] == {} and got[label]["backward"] == {}, (rank, label, got[label])
        multi = got["rounds from the routing"]
        assert multi["max_rounds"] > 1 and multi["rounds"] > 1, multi
        assert multi["forward"] == {"aten::_local_scalar_dense (read)": 2}, multi  # one per layer call
        assert "rungs/parallel/expert_parallel.py" in multi["where"]["aten::_local_scalar_dense (read)"], multi
        assert multi["backward"] == {}, multi
        # a capacity factor's per-peer cap has no closed round count: one read per round a call runs
        for label, rounds in (("factor, balanced", 1), ("factor, skewed", 3)):
            got_f = got[label]
            assert got_f["rounds"] == rounds and got_f["max_rounds"] > 1, (label, got_f)
            assert got_f["forward"] == {"aten::_local_scalar_dense (read)": 2 * rounds}, (label, got_f)
            assert got_f["backward"] == {}, (label, got_f)


def test_rejects_layouts_that_cannot_split():
    assert check_layout(8, 4, 2) == (2, 2)
    with pytest.raises(ExpertParallelError, match="divisible by the expert-parallel size 3"):
        check_layout(8, 3, 1)
    with pytest.raises(ExpertParallelError, match="group_size=3 must divide the 2 experts"):
        check_layout(8, 4, 3)


def _held_worker(rank: int, world: int) -> None:
    """Three micro-batches under bf16 autocast, the stacks held across them or cast in each forward and
    backward: the same outputs and sums of weight gradients bit for bit, one cast a step instead of two
    a micro-batch, and fp32 gradients (they were rounded to bf16 before autograd widened them)."""
    import contextlib

    import rungs.parallel.expert_parallel as expert_parallel
    from rungs.held_weights import held_expert_weights

    casts = []
    real = expert_parallel._cast_each
    expert_parallel._cast_each = lambda *a: casts.append(1) or real(*a)
    try:
        got = {}
        for hold in (False, True):
            full, xs, idx, gates, cots = _inputs(rank, world, "random")
            ep = ExpertParallelExperts(full, dist.group.WORLD, capacity_per_expert=3, group_size=2)
            casts.clear()
            outs = []
            with held_expert_weights(ep) if hold else contextlib.nullcontext():
                for m in range(3):
                    x = (xs[rank] * (m + 1)).requires_grad_(True)
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        out = ep(x, idx[rank], gates[rank])
                    (out.float() * cots[rank]).sum().backward()
                    outs.append(out.detach())
                    if m == 0:
                        first = [getattr(ep, n).grad.clone() for n in ("w_gate", "w_up", "w_down")]
            got[hold] = (outs, [getattr(ep, n).grad.clone() for n in ("w_gate", "w_up", "w_down")], len(casts))
    finally:
        expert_parallel._cast_each = real
    (plain_outs, plain_grads, plain_casts), (held_outs, held_grads, held_casts) = got[False], got[True]
    assert all(torch.equal(a, b) for a, b in zip(plain_outs, held_outs)), f"rank {rank}: outputs differ"
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, held_grads)), f"rank {rank}: gradients differ"
    assert (plain_casts, held_casts) == (2 * 3, 1), (plain_casts, held_casts)
    # one micro-batch's gradient is an fp32 sum over slices, not a bf16 value widened
    assert all(g.dtype == torch.float32 and not torch.equal(g, g.bfloat16().float()) for g in first)


def test_held_stacks_give_the_same_values_with_one_cast_a_step():
    run_ranks(_held_worker, 2)
