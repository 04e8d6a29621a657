"""Planning from a notebook: a rung's numbers recomputed by hand, and bad values refused as one
LadderInputError naming the field instead of a TypeError deep in the arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ladder.errors import LadderInputError
from ladder.plan import load_recipe, plan_compute, plan_ladder, plan_rung
from ladder.plan.memory import choose_layout
from ladder.plan.recipe import Source
from ladder.plan.sources import plan_sources

DEMO = load_recipe("cpu-demo")


def test_cpu_demo_l3_counts_match_a_hand_count():
    """d=48, 3 query heads of 16, 1 KV head, latent 24, expert and shared hidden 48, 8 experts top-2,
    vocab 512 untied; layers 0-1 window 32 of seq 128, layer 2 global."""
    s = plan_rung(DEMO, 3)
    layer = 48 + 48 * 48 + 2 * 16 * 48 + 48 * 48 + 48 + 8 * 48 + 3 * 8 * 48 * 24 + 3 * 48 * 48 + 2 * 24 * 48
    routed = 3 * 8 * 48 * 24
    embedding = 2 * 512 * 48
    assert s.params_total == 3 * layer + embedding + 48
    assert s.params_active == 3 * (layer - routed + routed * 2 // 8) + 48
    local_keys, global_keys = (32 * 33 / 2 + 96 * 32) / 128, 129 / 2
    forward = (3 * 2 * 48 * (2 * 48 + 2 * 16) + 4 * 3 * 16 * (2 * local_keys + global_keys) + 3 * 2 * 48 * 8
               + 3 * 2 * 3 * 48 * 48 + 3 * 2 * 2 * 48 * 24 + 3 * 2 * 3 * 24 * 48 * 2 + 2 * 48 * 512)
    assert s.flops_per_token_forward == forward and s.flops_per_token == 3 * forward
    assert s.tokens == s.steps * s.batch_tokens >= 5 * s.params_active
    assert s.train_flops == s.flops_per_token * s.tokens


def test_source_scaling_keeps_full_scale_epochs_for_a_small_mixture():
    mixture = [Source(name="a", share=0.5, unique_tokens=100.0), Source(name="b", share=0.5, unique_tokens=50.0)]
    plan = plan_sources(mixture, 100.0, 1000.0)
    assert {n: (s.tokens, s.unique_tokens, s.epochs) for n, s in plan.items()} == \
        {"a": (50.0, 10.0, 5.0), "b": (50.0, 5.0, 10.0)}


@pytest.mark.parametrize("tpp", ["20", True, False, [20]])
def test_plan_rung_refuses_a_tpp_that_is_not_a_number(tpp):
    with pytest.raises(LadderInputError) as err:
        plan_rung(DEMO, 3, tpp)
    assert err.value.field == "--tpp" and repr(tpp) in err.value.detail


def test_a_recipe_card_with_a_tpp_as_text_is_a_ladder_input_error():
    from ladder.analysis.recipe_card import build_card

    with pytest.raises(LadderInputError) as err:
        build_card("cpu-demo", 3, {}, tpp="20")
    assert err.value.field == "--tpp"


@pytest.mark.parametrize("tpp", [np.int64(20), np.float32(20.0), 20])
def test_a_numpy_or_int_tpp_plans_as_the_float_and_serialises(tpp):
    spec = plan_rung(DEMO, 3, tpp)
    assert type(spec.tpp) is float and spec.to_dict() == plan_rung(DEMO, 3, 20.0).to_dict()
    json.dumps(spec.to_dict())


def test_plan_ladder_of_no_rungs_is_empty_not_the_recipes_ladder():
    assert plan_ladder(DEMO, []) == []
    assert [r.L for r in plan_ladder(DEMO)] == DEMO.ladder_rungs


@pytest.mark.parametrize("change, field", [
    ({"mfu": True}, "--mfu"), ({"goodput": True}, "--goodput"), ({"mfu": "0.4"}, "--mfu"),
    ({"gpus": True}, "--gpus"), ({"gpus": 2.5}, "--gpus"),
    ({"train_flops": float("nan")}, "gpu_pool"), ({"train_flops": "1e20"}, "gpu_pool"),
    ({"peak_flops_per_gpu": float("inf")}, "gpu_pool"),
])
def test_plan_compute_refuses_what_is_not_a_valid_number(change, field):
    args = {"train_flops": 1e20, "gpus": 8, "peak_flops_per_gpu": 1e15, "mfu": 0.4, "goodput": 0.9, **change}
    with pytest.raises(LadderInputError) as err:
        plan_compute(args.pop("train_flops"), **args)
    assert err.value.field == field


def test_choose_layout_reads_a_memory_size_as_text_and_one_checkpointing_policy():
    s = plan_rung(DEMO, 3)
    by_text = choose_layout(s.arch, batch_sequences=s.batch_sequences, gpu_memory_bytes="80GB")
    assert by_text == choose_layout(s.arch, batch_sequences=s.batch_sequences, gpu_memory_bytes=80 * 10**9)
    full = choose_layout(s.arch, batch_sequences=s.batch_sequences, gpu_memory_bytes=80 * 10**9, checkpointing="full")
    assert full.layout.checkpointing == "full"
    for bad, field in (({"gpu_memory_bytes": float("nan")}, "gpu_memory_bytes"),
                       ({"gpu_memory_bytes": 80 * 10**9, "headroom": "0.1"}, "headroom")):
        with pytest.raises(LadderInputError) as err:
            choose_layout(s.arch, batch_sequences=s.batch_sequences, **bad)
        assert err.value.field == field


def test_a_step_cap_at_or_above_the_planned_steps_is_the_uncapped_config():
    """A cap that stops nothing keys as the plain rung (a finished full run is found by a sweep that caps
    above it); a cap below the plan is kept and keys apart."""
    from ladder.plan.resolve import resolve_train_config
    from sweeps.keys import trial_key

    plain = resolve_train_config("cpu-demo", 3)
    steps = plain["steps"]
    assert "max_steps" not in plain or plain["max_steps"] is None
    for cap in (steps, steps + 1, 10 * steps):
        assert resolve_train_config("cpu-demo", 3, max_steps=cap) == plain
        assert resolve_train_config("cpu-demo", 3, {"max_steps": cap}) == plain
    capped = resolve_train_config("cpu-demo", 3, max_steps=steps - 1)
    assert capped["max_steps"] == steps - 1 and trial_key(capped) != trial_key(plain)
