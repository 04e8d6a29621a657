"""The memory planner's arithmetic, its layout search and its input checks, and the sweep's ep resolution
(no measurement: tests/ladder/plan/test_memory.py measures the byte model against real allocations)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ladder.errors import LadderInputError
from ladder.plan import expert_memory
from ladder.plan.memory import Layout, memory_breakdown
from tests.ladder.plan.test_memory import ARCH  # the measured shapes


def test_states_are_the_parameter_count_in_fp32_master_grads_and_optimizer():
    from ladder.plan.counting import count_parameters

    layout = Layout(dp=1, ep=1, micro_batch_sequences=1, precision="bf16")
    mem = memory_breakdown(ARCH, layout)
    total = count_parameters(ARCH).total
    assert mem.params == mem.grads == 4 * total
    # AdamW's two moments for embedding, head, norms and router; Muon's one for the rest
    adamw = ARCH.vocab_size * ARCH.d_model * 2 + ARCH.n_layers * (2 * ARCH.d_model + ARCH.n_experts * ARCH.d_model) \
        + ARCH.d_model
    assert mem.optimizer == 4 * (total + adamw)
    # sharding over 2 ranks halves every state (the test shapes have even rows everywhere)
    half = memory_breakdown(ARCH, Layout(dp=2, ep=1, micro_batch_sequences=1, precision="bf16"))
    assert (half.params, half.optimizer) == (mem.params // 2, mem.optimizer // 2)


def test_activations_grow_with_the_micro_batch_and_shrink_with_checkpointing():
    one, two = (memory_breakdown(ARCH, Layout(dp=1, ep=1, micro_batch_sequences=m)) for m in (1, 2))
    assert 1.9 < (two.details["activations_layers"] / one.details["activations_layers"]) < 2.1
    by_mode = [memory_breakdown(ARCH, Layout(dp=1, ep=1, micro_batch_sequences=2, checkpointing=c)).activations
               for c in ("none", "selective", "full")]
    assert by_mode[0] > by_mode[1] > by_mode[2]


def _budget_one_gpu_cannot_hold() -> int:
    """A device memory below ARCH's smallest one-GPU layout, with its loss chunked for that device (the
    chunk shrinks with the device's memory, as the job's does, so the budget is lowered until it holds)."""
    smallest = Layout(dp=1, ep=1, micro_batch_sequences=1, checkpointing="full")
    budget = int(memory_breakdown(ARCH, smallest).total * 0.9)
    while memory_breakdown(ARCH, smallest, device_memory_bytes=budget).total <= budget:
        budget = int(budget * 0.9)
    return budget


def test_choose_layout_picks_the_fewest_gpus_that_fit():
    from ladder.plan.memory import candidate_worlds, choose_layout

    budget = _budget_one_gpu_cannot_hold()
    choice = choose_layout(ARCH, batch_sequences=16, gpu_memory_bytes=budget, gpus_per_node=8, headroom=0.0)
    assert choice.memory.total <= budget
    assert choice.layout.world > 1 and 16 % choice.layout.world == 0
    smaller = [w for w in candidate_worlds(16, 8, 4096) if w < choice.layout.world]
    for world in smaller:  # no layout on fewer GPUs fits
        for ep in (e for e in (1, 2, 4, 8) if world % e == 0):
            for micro in (m for m in (1, 2, 4, 8, 16) if (16 // world) % m == 0):
                for ckpt in ("none", "selective", "full"):
                    lay = Layout(dp=world // ep, ep=ep, micro_batch_sequences=micro, checkpointing=ckpt)
                    assert memory_breakdown(ARCH, lay, device_memory_bytes=budget).total > budget
    assert choose_layout(ARCH, batch_sequences=16, gpu_memory_bytes=10**12).layout == Layout(
        dp=1, ep=1, micro_batch_sequences=16, checkpointing="none", precision="bf16")


def test_choose_layout_says_why_nothing_fits():
    from ladder.plan.memory import choose_layout

    with pytest.raises(LadderInputError, match=r"no layout up to 8 GPUs fits .*params .*activations"):
        choose_layout(ARCH, batch_sequences=16, gpu_memory_bytes=10**5, max_gpus=8)


@pytest.mark.parametrize("text,expected", [("141GB", 141 * 10**9), ("80 GiB", 80 * 2**30), ("2.5TB", 2.5e12),
                                           ("512MiB", 512 * 2**20)])
def test_parse_bytes(text, expected):
    from ladder.plan.memory import parse_bytes

    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["141XB", "141", "", "GB", "-3GB", "1e3GB", "0.1B"])
def test_parse_bytes_refuses_bad_sizes(text):
    from ladder.plan.memory import parse_bytes

    with pytest.raises(LadderInputError, match="--gpu-memory"):
        parse_bytes(text)


def test_a_capacity_factor_shrinks_only_the_expert_parallel_buffers():
    """At L18's real shapes (ep=8, one sequence a rank) the exchange buffers follow the factor: the
    forward's 8 exchange buffers hold 8·ceil(n/2) rows by default and 1.5x the balanced share at 1.5."""
    from ladder.plan.generator import plan_ladder
    from ladder.plan.recipe import load_recipe

    arch = plan_ladder(load_recipe("mai-base-2"), [18], None)[0].arch
    default, factor = (memory_breakdown(arch, Layout(dp=1, ep=8, micro_batch_sequences=1, capacity_factor=f))
                       for f in (None, 1.5))
    assert factor.states == default.states and factor.activations < default.activations
    rows = 4096 * 7                                   # pairs a rank routes
    saved = 8 * (8 * rows // 2 - 8 * math.ceil(1.5 * rows / 8 / 2)) * arch.latent_dim * 2   # bf16 rows
    exchange = default.details["buffers_forward"] - factor.details["buffers_forward"]
    assert exchange > saved  # the compute buffer and index maps shrink too
    assert default.buffers > 1.8 * factor.buffers
    one = Layout(dp=8, ep=1, micro_batch_sequences=1)
    assert memory_breakdown(arch, one).total == memory_breakdown(arch, dataclasses.replace(one, capacity_factor=1.5)).total


def test_choose_layout_gives_expert_parallel_layouts_the_planned_factor():
    from ladder.plan.expert_memory import PLANNED_CAPACITY_FACTOR, planned_capacity_factor
    from ladder.plan.memory import choose_layout

    choice = choose_layout(ARCH, batch_sequences=16, gpu_memory_bytes=10**12)
    assert choice.layout.ep == 1 and choice.layout.capacity_factor is None
    spread = choose_layout(ARCH, batch_sequences=16, gpu_memory_bytes=_budget_one_gpu_cannot_hold(), headroom=0.0)
    assert spread.layout.ep > 1 and spread.layout.capacity_factor == planned_capacity_factor(spread.layout.ep) == 1.5
    assert spread.to_dict()["train_config"]["capacity_factor"] == spread.layout.capacity_factor
    assert planned_capacity_factor(8) == PLANNED_CAPACITY_FACTOR == 1.5
    assert planned_capacity_factor(1) is None            # no exchange to size
    assert planned_capacity_factor(8, capacity_per_expert=64) is None and planned_capacity_factor(8, capacity_factor=2.0) == 2.0


@pytest.mark.parametrize("kwargs,field", [({"dp": 0}, "dp"), ({"ep": 1.5}, "ep"), ({"checkpointing": "some"}, "checkpointing"),
                                          ({"precision": "fp8"}, "precision"), ({"micro_batch_sequences": True}, "micro"),
                                          ({"capacity_factor": 0.0}, "capacity_factor"),
                                          ({"capacity_factor": float("inf")}, "capacity_factor")])
def test_layout_refuses_bad_values(kwargs, field):
    base = {"dp": 1, "ep": 1, "micro_batch_sequences": 1}
    with pytest.raises(LadderInputError, match=field):
        Layout(**(base | kwargs))


def test_mirrored_constants_match_the_job():
    """The planner cannot import torch code; the two sizes it copies must stay the job's."""
    import inspect

    import rungs.loss
    import rungs.moe
    from ladder.plan import memory
    from rungs.parallel import ep_plan
    from rungs.parallel.expert_parallel import ExpertParallelExperts

    assert memory.LOGITS_PER_CHUNK == rungs.loss.LOGITS_PER_CHUNK
    assert expert_memory.EXPERT_ROW_ALIGN == rungs.moe._ROW_ALIGN == ep_plan.ROW_ALIGN
    chunks = inspect.signature(ExpertParallelExperts.__init__).parameters["chunks_per_round"].default
    assert expert_memory.EP_CHUNKS == chunks


@pytest.mark.parametrize("experts,ep,pairs", [(8, 2, 256), (512, 8, 4096 * 7), (512, 4, 8 * 4096 * 7), (12, 3, 40),
                                              (512, 64, 2 * 4096 * 7)])
@pytest.mark.parametrize("factor", [None, 0.7, 1.5, 3.0])
def test_the_planners_exchange_sizes_are_the_jobs(experts, ep, pairs, factor):
    """ladder.plan.expert_memory mirrors EPLayout's buffer rows (it cannot import torch code)."""
    from rungs.parallel.ep_plan import EPLayout, factor_capacities

    if factor is None:  # ExpertParallelExperts' default: one group per rank, every pair fits one round
        local = experts // ep
        capacity, peer = math.ceil(pairs * ep / local), None
    else:
        capacity, peer = factor_capacities(factor, ep, experts, pairs)
        assert (capacity, peer) == expert_memory.factor_capacities(factor, ep, experts, pairs)
    lay = EPLayout(ep, experts, experts // ep, capacity, pairs, chunks=expert_memory.EP_CHUNKS, peer_capacity=peer)
    assert expert_memory.ep_rows(experts, ep, pairs, factor) == (ep * lay.peer_rows, lay.compute_rows)


def test_a_wall_clock_budget_sets_the_fewest_gpus_the_search_starts_from():
    from ladder.plan.memory import candidate_worlds, choose_layout, gpus_for_days

    flops, peak, mfu, goodput = 1.0e21, 2.5e15, 0.21, 0.89
    need = gpus_for_days(flops, 7, peak_flops_per_gpu=peak, mfu=mfu, goodput=goodput)
    per_gpu_days = flops / (peak * mfu * goodput) / 86_400
    assert need == math.ceil(per_gpu_days / 7) and per_gpu_days / need <= 7 < per_gpu_days / (need - 1)
    roomy = choose_layout(ARCH, batch_sequences=16, gpu_memory_bytes=10**12, min_gpus=3)
    assert roomy.layout.world == min(w for w in candidate_worlds(16, 8, 4096) if w >= 3) == 4
    with pytest.raises(LadderInputError, match="min_gpus"):
        choose_layout(ARCH, batch_sequences=16, gpu_memory_bytes=10**12, min_gpus=0)
    with pytest.raises(LadderInputError, match="days"):
        gpus_for_days(flops, 0, peak_flops_per_gpu=peak, mfu=mfu, goodput=goodput)


def test_a_trials_memory_is_the_byte_model_of_the_layout_it_launches_with():
    from ladder.plan.memory import planned_expert_parallel, trial_memory

    config = {**dataclasses.asdict(ARCH), "batch_sequences": 16, "micro_batch_sequences": 8, "precision": "bf16",
              "lb_loss_coef": 0.01, "z_loss_coef": 0.0, "activation_checkpointing": "none"}
    layout, mem = trial_memory(config, workers=4, gpu=True)
    assert layout.ep == planned_expert_parallel(config, workers=4, gpu=True) and layout.world == 4
    assert layout.micro_batch_sequences == 2  # the job's 8-sequence micro-batch over 4 ranks
    assert mem == memory_breakdown(ARCH, layout, accumulation_steps=2)
    fixed, _ = trial_memory(config, workers=4, gpu=True, ep=2)
    assert (fixed.dp, fixed.ep) == (2, 2)
