"""The expert-parallel round plan on the device (`rungs.parallel.ep_plan`), every rank simulated in one
process: it is `rungs.moe.plan_rounds` (without a binding peer capacity), it sends every pair exactly
once, every receiver reads what the senders wrote, and no buffer exceeds the fixed sizes the shapes
give, whatever the skew, with or without a peer capacity.
"""

from __future__ import annotations

import pytest
import torch

from rungs.moe import count_per_expert, plan_rounds
from rungs.parallel.ep_plan import EPLayout, Plan, factor_capacities, round_take


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
    rounds: list[list] = [[] for _ in range(P)]
    for r, plan in enumerate(plans):  # every rank's plan, run until it leaves no pair
        for slices, left in plan.rounds():
            rounds[r].append(slices)
            if int(left) == 0:
                break
    n_rounds = len(rounds[0])
    assert {len(r) for r in rounds} == {n_rounds}, "every rank plans the same rounds"
    if not lay.peer_capped:  # the closed form, and exactly plan_rounds' rounds
        assert n_rounds == int(plans[0].n_rounds) <= lay.max_rounds
        assert n_rounds == len(plan_rounds(counts.sum(0).tolist(), lay.capacity, lay.group_size))
    sent = [[] for _ in range(P)]
    computed = [[] for _ in range(P)]  # per rank: (pair's source, pair id) in each compute row
    for rnd in range(n_rounds):
        rows_this_round = [0] * P
        block_this_round = torch.zeros(P, P, dtype=torch.long)  # rows source s sent destination d
        for h in range(lay.chunks):
            maps = [rounds[r][rnd][h] for r in range(P)]
            # what source s puts in the rows for peer d: (s, pair id), padding marked -1
            send = [torch.where(m.pair_slot < lay.local_pairs, m.send_pair, -1).view(P, S) for m in maps]
            for s, m in enumerate(maps):
                sent[s] += m.pair_slot[m.pair_slot < lay.local_pairs].tolist()
                block_this_round[s] += (m.pair_slot < lay.local_pairs).view(P, S).sum(1)
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
        assert int(block_this_round.max()) <= lay.block_rows
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


@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize("kind", ["random", "hot_expert", "all_to_rank_0"])
def test_a_peer_capacity_caps_every_block_and_still_sends_every_pair_once(kind, chunks):
    """Capacity factor 1.5: a source sends a peer at most 20 of its 40 pairs a round; a block or a
    rank over its share waits for another round, and the buffers are 1.5x the balanced share."""
    gen = torch.Generator().manual_seed(5)
    P, E, pairs = 3, 12, 40
    routes = [torch.randint(0, E, (pairs,), generator=gen) for _ in range(P)]
    if kind == "hot_expert":
        routes[1][:] = 4                       # all 40 of source 1 to one expert of rank 1
    elif kind == "all_to_rank_0":
        routes = [r % 4 for r in routes]       # 120 pairs to rank 0's 60 slots, 40-row blocks
    capacity, peer_capacity = factor_capacities(1.5, P, E, pairs)
    assert (capacity, peer_capacity) == (15, 20)
    lay = EPLayout(P, E, group_size=4, capacity=capacity, local_pairs=pairs, chunks=chunks, peer_capacity=peer_capacity)
    assert lay.peer_capped and lay.block_rows == 20 and lay.peer_rows == -(-20 // chunks)
    rounds = _simulate(lay, routes)["rounds"]
    assert rounds == {"random": 1, "hot_expert": 2, "all_to_rank_0": 2}[kind], rounds


@pytest.mark.parametrize("seed", range(3))
def test_a_tight_peer_capacity_with_lending_terminates_and_sends_every_pair_once(seed):
    """Both caps binding at once (3-row blocks, 3 slots per expert lent in pairs): many rounds."""
    gen = torch.Generator().manual_seed(seed)
    P, E, pairs = 3, 12, 30
    routes = [torch.randint(0, E, (pairs,), generator=gen) for _ in range(P)]
    routes[seed][: pairs // 2] = 5
    lay = EPLayout(P, E, group_size=2, capacity=3, local_pairs=pairs, chunks=2, peer_capacity=3)
    counts = torch.stack([count_per_expert(r, E) for r in routes])
    blocks, groups = counts.view(P, P, 4).sum(-1), counts.sum(0).view(-1, 2).sum(-1)
    fewest = max(-(-int(blocks.max()) // 3), -(-int(groups.max()) // 6))  # no plan can do with fewer
    assert _simulate(lay, routes)["rounds"] >= fewest >= 5


def test_a_capacity_factor_sizes_the_exchange_by_the_balanced_load_at_l18():
    """The same L18 call at capacity factor 1.5: a round sends 1.5x the 28,672 routed rows, where the
    default capacity (one round always fits: every source's pairs could go to one peer) sends 8x."""
    n = 4096 * 7
    default = EPLayout(n_ranks=8, n_experts=512, group_size=64, capacity=8 * n // 64, local_pairs=n, chunks=2)
    assert default.max_rounds == 1 and 8 * default.peer_rows * default.chunks == 229_376
    capacity, peer_capacity = factor_capacities(1.5, 8, 512, n)
    assert (capacity, peer_capacity) == (672, 5376)       # 1.5 x 448 per expert, 1.5 x 3584 per peer
    lay = EPLayout(8, 512, 64, capacity, n, chunks=2, peer_capacity=peer_capacity)
    assert lay.peer_rows == 2688 and 8 * lay.peer_rows * lay.chunks == 43_008 == 1.5 * n
    assert lay.compute_rows == 21504                      # min((43008 + 8) // 2, 8 * 2688)
    assert lay.max_rounds == 6                            # all of a group's pairs on one rank (or peer)
