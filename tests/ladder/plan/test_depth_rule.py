"""The recipe's optional depth rule: n_layers fixed at every rung, width and heads still from L, and
recipes without the rule planning L layers exactly as before."""

from __future__ import annotations

import pytest
import yaml

from ladder.errors import LadderInputError
from ladder.plan.generator import plan_ladder, plan_rung
from ladder.plan.recipe import RECIPES_DIR, load_recipe, parse_recipe


def cpu_demo_data() -> dict:
    return yaml.safe_load((RECIPES_DIR / "cpu-demo.yaml").read_text())


def test_a_fixed_depth_sets_every_rungs_layers_and_leaves_width_and_heads_to_L():
    recipe = parse_recipe({**cpu_demo_data(), "depth": {"layers": 3}}, "test")
    for spec in plan_ladder(recipe, [4, 6, 9, 13]):
        assert spec.arch.n_layers == 3
        assert spec.arch.d_model == 16 * spec.L and spec.arch.n_heads == spec.L


def test_without_a_depth_rule_a_rung_has_L_layers():
    assert [s.arch.n_layers for s in plan_ladder(load_recipe("cpu-demo"), [2, 5, 8])] == [2, 5, 8]
    assert plan_rung(load_recipe("mai-base-2"), 102).arch.n_layers == 102


def test_at_fixed_depth_compute_grows_as_the_fourth_power_of_L_not_the_sixth():
    # FLOPs per token ∝ d² per layer and tokens ∝ d² at fixed TPP: C ∝ L⁴ at fixed depth, L⁶ when
    # depth = L. Only approximately (the LM head, attention context, batch rounding), hence the bands.
    fixed = parse_recipe({**cpu_demo_data(), "depth": {"layers": 2}, "tpp": 4}, "test")
    scaling = parse_recipe({**cpu_demo_data(), "tpp": 4}, "test")
    ratio_fixed = plan_rung(fixed, 12).train_flops / plan_rung(fixed, 6).train_flops
    ratio_scaling = plan_rung(scaling, 8).train_flops / plan_rung(scaling, 4).train_flops
    assert 2**3.5 < ratio_fixed < 2**4.5
    assert 2**5.5 < ratio_scaling < 2**6.5


@pytest.mark.parametrize("depth", [{"layers": 0}, {"layers": -2}, {"layers": 2, "every": 3}, {"layers": 2.5}])
def test_an_invalid_depth_rule_is_refused_naming_the_field(depth):
    with pytest.raises(LadderInputError, match="depth"):
        parse_recipe({**cpu_demo_data(), "depth": depth}, "test")
