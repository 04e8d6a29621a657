"""Expert-parallel multi-round dropless MoE equals the single-process RoutedExperts (real gloo ranks).

Each rank routes its own tokens; the reference runs `rungs.moe.RoutedExperts` with all experts on
the concatenation of every rank's tokens. Outputs, input gradients and expert weight gradients must
agree under random routing with a small capacity (several rounds) and under the worst routing
(every token of every rank to experts on rank 0), whose per-rank peak memory must stay within 10%
of balanced routing at the same calibrated capacity.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from rungs.parallel.expert_parallel import (ExpertParallelError, ExpertParallelExperts, build_rounds, check_layout,
                                   peak_allocated_bytes)
from rungs.moe import RoutedExperts
from tests.rungs.dist.spawn import run_ranks

E, LATENT, HIDDEN, K, TOKENS = 8, 32, 64, 2, 48


def _routing(kind: str, rank: int, world: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "random":
        return torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(TOKENS)])
    if kind == "balanced":  # global pair index modulo E: every expert gets exactly TOKENS*K*world/E pairs
        pairs = torch.arange(TOKENS * K) + rank * TOKENS * K
        return (pairs % E).view(TOKENS, K)
    return torch.tensor([[0, 1]] * TOKENS)  # worst: all pairs of all ranks on rank 0's experts


def _check(rank: int, world: int, kind: str, capacity: int, group_size: int) -> dict:
    gen = torch.Generator().manual_seed(7)  # same stream on every rank: build all ranks' inputs
    full = RoutedExperts(E, LATENT, HIDDEN, group_size=E)
    with torch.no_grad():
        for w in (full.w_gate, full.w_up, full.w_down):
            w.copy_(torch.randn(w.shape, generator=gen) * 0.2)
    xs = [torch.randn(TOKENS, LATENT, generator=gen) for _ in range(world)]
    idx = [_routing(kind, r, world, gen) for r in range(world)]
    gates = [torch.rand(TOKENS, K, generator=gen) for _ in range(world)]
    cots = [torch.randn(TOKENS, LATENT, generator=gen) for _ in range(world)]

    ep = ExpertParallelExperts(full, dist.group.WORLD, capacity_per_expert=capacity, group_size=group_size)
    x = xs[rank].clone().requires_grad_(True)

    def step():
        out = ep(x, idx[rank], gates[rank])
        (out * cots[rank]).sum().backward()
        return out

    out, peak = peak_allocated_bytes(step)

    xr = torch.cat(xs).requires_grad_(True)
    ref = full(xr, torch.cat(idx), torch.cat(gates))
    (ref * torch.cat(cots)).sum().backward()
    rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
    local = slice(rank * E // world, (rank + 1) * E // world)

    def close(a, b, what):
        rel = (a - b).norm() / b.norm().clamp_min(1e-30)
        assert rel < 1e-5, f"rank {rank} {kind}: {what} relative error {rel:.2e}"

    close(out, ref[rows], "output")
    close(x.grad, xr.grad[rows], "input gradient")
    for name in ("w_gate", "w_up", "w_down"):
        close(getattr(ep, name).grad, getattr(full, name).grad[local], f"{name} gradient")
    return {"rounds": ep.last_stats["rounds"], "peak": peak}


def _worker(rank: int, world: int) -> None:
    pairs = TOKENS * K * world
    balanced_capacity = pairs // E  # calibrated: balanced routing fits one round exactly
    _check(rank, world, "random", capacity=3, group_size=2)
    bal = _check(rank, world, "balanced", balanced_capacity, group_size=2)
    worst = _check(rank, world, "worst", balanced_capacity, group_size=2)
    assert bal["rounds"] == 1
    assert worst["rounds"] == math.ceil(pairs / (2 * balanced_capacity)), worst
    assert worst["peak"] <= 1.10 * bal["peak"], f"rank {rank}: worst-case peak {worst['peak']} vs balanced {bal['peak']}"
    assert bal["peak"] > 0


def test_expert_parallel_matches_single_process_and_memory_is_flat():
    """4 ranks, 8 experts (2 per rank): random routing in several rounds, then worst-case skew."""
    run_ranks(_worker, 4)


def test_round_plan_covers_every_pair_once():
    """The exchange plan, computed on each rank, sends every local pair exactly once over all rounds
    and every receiver gets exactly what the senders send it (checked for all ranks at once)."""
    gen = torch.Generator().manual_seed(3)
    world, n_exp = 3, 6
    idx = [torch.randint(0, n_exp, (20, 2), generator=gen).reshape(-1) for _ in range(world)]
    idx[1][:] = 4  # one hot expert
    counts = torch.stack([torch.bincount(i, minlength=n_exp) for i in idx])
    plans = [build_rounds(counts, torch.argsort(idx[r], stable=True), r, capacity=2, group_size=2)
             for r in range(world)]
    assert len({len(p) for p in plans}) == 1
    for r in range(world):
        sent = torch.cat([rnd.send_pairs for rnd in plans[r]])
        assert sorted(sent.tolist()) == list(range(idx[r].numel()))
        for rnd_i in range(len(plans[r])):
            for d in range(world):
                assert plans[r][rnd_i].send_splits[d] == plans[d][rnd_i].recv_splits[r]
            assert plans[r][rnd_i].recv_rows <= 2 * 2  # fixed receive buffer: local experts × capacity


def test_rejects_layouts_that_cannot_split():
    assert check_layout(8, 4, 2) == (2, 2)
    with pytest.raises(ExpertParallelError, match="divisible by the expert-parallel size 3"):
        check_layout(8, 3, 1)
    with pytest.raises(ExpertParallelError, match="group_size=3 must divide the 2 experts"):
        check_layout(8, 4, 3)
