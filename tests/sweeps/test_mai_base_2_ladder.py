"""The shipped mai-base-2 ladder spec: L18-L42 at the recipe's TPP, and every block's GPUs, ep and
micro-batch the memory planner's layout for the fewest GPUs that hold the rung and train it in a week."""

from __future__ import annotations

import math

import pytest

from ladder.plan.generator import plan_ladder
from ladder.plan.memory import choose_layout, gpus_for_days, parse_bytes
from ladder.plan.recipe import load_recipe
from sweeps.cost import cost_sweep
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec

SPEC = load_spec("mai_base_2_ladder")
RECIPE = load_recipe("mai-base-2")
DAYS, GPUS_PER_NODE = 7, 4  # the spec's rule: a week per trial, on Azure ND GB200 v6 nodes of 4 GPUs
PLANNED = plan_sweep(SPEC)


def test_the_spec_is_the_recipes_ladder():
    assert sorted({p.trial.L for p in PLANNED}) == RECIPE.ladder_rungs == [18, 24, 30, 36, 42]
    assert {p.config["tpp"] for p in PLANNED} == {RECIPE.tpp}
    assert len(PLANNED) == 5 * len(RECIPE.ladder_rungs)  # a 5-point LR/WD cross per rung


@pytest.mark.parametrize("rung", plan_ladder(RECIPE, None, None), ids=lambda r: f"L{r.L}")
def test_each_rungs_resources_are_the_memory_planners(rung):
    (block,) = [b for b in SPEC.blocks if b.rungs == [rung.L]]
    res = block.resources
    pool = RECIPE.gpu_pool
    need = gpus_for_days(rung.train_flops, DAYS, peak_flops_per_gpu=pool.peak_bf16_flops_per_gpu, mfu=pool.default_mfu,
                         goodput=pool.default_goodput)
    choice = choose_layout(rung.arch, batch_sequences=rung.batch_sequences, gpu_memory_bytes=parse_bytes(res.gpu_memory),
                           gpus_per_node=GPUS_PER_NODE, min_gpus=need)
    layout = choice.layout
    assert (res.gpus, res.workers, res.ep) == (1, layout.world, layout.ep)
    assert res.workers % GPUS_PER_NODE == 0 and rung.batch_sequences % res.workers == 0
    trial = next(p for p in PLANNED if p.trial.L == rung.L)
    assert (trial.config["micro_batch_sequences"] or rung.batch_sequences) == layout.micro_batch_sequences * layout.world
    assert trial.config["activation_checkpointing"] == layout.checkpointing
    # within a week at the pool's MFU and goodput, and one GPU fewer than `need` would not be
    def days(gpus: int) -> float:
        return rung.train_flops / (gpus * pool.peak_bf16_flops_per_gpu * pool.default_mfu * pool.default_goodput) / 86_400

    assert days(res.workers) <= days(need) <= DAYS < (days(need - 1) if need > 1 else math.inf)


def test_every_trial_fits_its_gpu_as_launched():
    cost = cost_sweep(PLANNED, RECIPE)
    assert all(t.fits for t in cost.trials)
    assert all(t.usable_bytes == math.floor(186e9 * 0.9) for t in cost.trials)
