"""The expert-parallel round plan on the device (`rungs.parallel.ep_plan`), every rank simulated in one
process: it is `rungs.moe.plan_rounds`, it sends every pair exactly once, every receiver reads what
the senders wrote, and no buffer exceeds the fixed sizes the shapes give, whatever the skew.
"""

from __future__ import annotations

import pytest
import torch

from rungs.moe import count_per_expert, plan_rounds
from rungs.parallel.ep_plan import EPLayout, Plan, round_take


@pytest.mark.parametrize("seed", range(6))
def test_round_take_is_plan_rounds(seed):
    gen = torch.Generator().manual_seed(seed)
    group_size = [1, 2, 3, 4, 6, 12][seed]
    loads = torch.randint(0, 30, (12,), generator=gen) * torch.randint(0, 2, (12,), generator=gen)
    loads[seed] += 60  # one hot expert: several rounds, lending in every group
    capacity = 1 + seed
    want = plan_rounds(loads.tolist(), capacity, group_size)
    done, got = torch.zeros_like(loads), []
    for r in range(len(want)):
        take = round_take(loads - done, r, capacity, group_size)
        got.append(take.tolist())
        done += take
    assert got == want and done.tolist() == loads.tolist()


def _simulate(lay: EPLayout, routes: list[torch.Tensor]) -> dict:
    """Run every rank's plan and the exchange by hand; return what each rank's experts computed."""
    P, L, S = lay.n_ranks, lay.local_experts, lay.peer_rows
    counts = torch.stack([count_per_expert(r, lay.n_experts) for r in routes])          # (P, E)
    plans = [Plan(lay, counts, torch.argsort(routes[r], stable=True), r) for r in range(P)]
    n_rounds = int(plans[0].n_rounds)
    assert n_rounds == len(plan_rounds(counts.sum(0).tolist(), lay.capacity, lay.group_size)) <= lay.max_rounds
    sent = [[] for _ in range(P)]
    computed = [[] for _ in range(P)]  # per rank: (pair's source, pair id) in each compute row
    rounds = [list(p.rounds(lambda: n_rounds)) for p in plans]
    assert {len(r) for r in rounds} == {n_rounds}
    for rnd in range(n_rounds):
        rows_this_round = [0] * P
        for h in range(lay.chunks):
            maps = [rounds[r][rnd][h] for r in range(P)]
            # what source s puts in the rows for peer d: (s, pair id), padding marked -1
            send = [torch.where(m.pair_slot < lay.local_pairs, m.send_pair, -1).view(P, S) for m in maps]
            for s, m in enumerate(maps):
                sent[s] += m.pair_slot[m.pair_slot < lay.local_pairs].tolist()
            for d, m in enumerate(maps):
                recv = torch.stack([send[s][d] for s in range(P)])                  # (P, S) from each source
                source = torch.arange(P)[:, None].expand(P, S)
                buffer = torch.full((lay.compute_rows + 1, 2), -2)
                buffer.index_copy_(0, m.recv_row, torch.stack([source.reshape(-1), recv.reshape(-1)], 1))
                used = int(m.offs[-1])
                assert used <= lay.compute_rows
                rows = buffer[:used]
                assert (rows[:, 1] >= 0).all(), "a compute row below the last offset holds no pair"
                assert ((m.recv_row < lay.compute_rows) == (recv.reshape(-1) >= 0)).all()
                # each compute row's pair routes to the local expert the offsets give it
                expert = torch.searchsorted(m.offs.long(), torch.arange(used), right=True) + d * L
                routed = torch.stack([routes[s][p] for s, p in rows.tolist()]) if used else expert
                assert torch.equal(routed, expert)
                # the return path reads the compute row each received row was put in
                valid = m.recv_row < lay.compute_rows
                assert torch.equal(m.compute_row[valid], m.recv_row[valid])
                computed[d] += [tuple(x) for x in rows.tolist()]
                rows_this_round[d] += used
        assert max(rows_this_round) <= lay.local_experts * lay.capacity
    for s in range(P):
        assert sorted(sent[s]) == list(range(lay.local_pairs)), "every pair is sent exactly once"
    assert sorted(sum(computed, [])) == sorted((s, p) for s in range(P) for p in range(lay.local_pairs))
    return {"rounds": n_rounds}


@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("kind", ["random", "hot_expert", "all_to_rank_0"])
def test_every_pair_goes_once_to_its_expert_within_fixed_buffers(kind, chunks):
    gen = torch.Generator().manual_seed(5)
    P, E, pairs = 3, 12, 40
    routes = [torch.randint(0, E, (pairs,), generator=gen) for _ in range(P)]
    if kind == "hot_expert":
        routes[1][:] = 4
    elif kind == "all_to_rank_0":
        routes = [r % 4 for r in routes]
    lay = EPLayout(P, E, group_size=2, capacity=3, local_pairs=pairs, chunks=chunks)
    got = _simulate(lay, routes)
    assert got["rounds"] > 1
    one_round = EPLayout(P, E, group_size=4, capacity=P * pairs // 4, local_pairs=pairs, chunks=chunks)
    assert one_round.max_rounds == 1 and _simulate(one_round, routes)["rounds"] == 1


def test_fixed_sizes_at_an_l18_like_shape():
    """ep=8, 512 experts (64 per rank, one lending group each), one 4096-token sequence, top-7, a
    capacity of 1024 rows per expert: the sizes every rank allocates, whatever the routing."""
    lay = EPLayout(n_ranks=8, n_experts=512, group_size=64, capacity=1024, local_pairs=4096 * 7, chunks=2)
    assert lay.peer_rows == 14336            # min(64 * 1024, 28672) / 2: a source's pairs, half per slice
    assert lay.round_rows == 65536           # the rank's slabs: 64 experts x 1024
    assert lay.compute_rows == 32776         # (65536 + 8 * 1) // 2 = 32772, aligned up to 8
    assert lay.max_rounds == 4               # ceil(8 * 28672 / 65536): all pairs of the group on one rank
