"""Sweep specs and their expansion: the grid geometry, counts, precedence and validation."""

from __future__ import annotations

import math

import pytest

from ladder.errors import LadderInputError
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from sweeps.expand import expand
from sweeps.spec import available_specs, load_spec, parse_spec

SHIPPED = ["smoke", "demo", "lr_wd", "dropout", "agc_ablation", "nightly"]


def spec_of(**blocks_and_top):
    data = {"name": "t", "recipe": "cpu-demo", "blocks": [{"name": "b", "rungs": [3]}]}
    data.update(blocks_and_top)
    return parse_spec(data, "test.yaml")


def test_every_shipped_spec_loads_and_expands():
    assert set(SHIPPED) <= set(available_specs())
    for name in SHIPPED:
        trials = expand(load_spec(name))
        assert trials, name
        assert all(t.lr > 0 and t.weight_decay > 0 for t in trials)


def test_grid_is_centred_on_the_law_in_log_lr_and_log_lr_wd_coordinates():
    spec = spec_of(blocks=[{"name": "g", "rungs": [3, 5], "lr_wd": {
        "log_lr": {"spacing": 0.5, "points": 3}, "log_lr_wd": {"spacing": 0.7, "points": 3}}}])
    trials = expand(spec)
    assert len(trials) == 2 * 9
    recipe = load_recipe("cpu-demo")
    for t in trials:
        rung = plan_rung(recipe, t.L)
        # Independent check in the report's coordinates (natural logs).
        assert math.log(t.lr) - math.log(rung.lr) == pytest.approx(t.log_lr_offset, abs=1e-12)
        assert math.log(t.lr * t.weight_decay) - math.log(rung.lr * rung.weight_decay) == pytest.approx(
            t.log_lr_wd_offset, abs=1e-12)
    offsets = sorted({(t.log_lr_offset, t.log_lr_wd_offset) for t in trials if t.L == 3})
    assert offsets == sorted((a, b) for a in (-0.5, 0.0, 0.5) for b in (-0.7, 0.0, 0.7))
    centre = [t for t in trials if t.L == 5 and t.log_lr_offset == 0 and t.log_lr_wd_offset == 0][0]
    assert centre.lr == plan_rung(recipe, 5).lr  # exactly the law's value, not exp(log(x))
    assert centre.weight_decay == plan_rung(recipe, 5).weight_decay


def test_cross_layout_steps_each_axis_alone():
    spec = spec_of(blocks=[{"name": "c", "rungs": [3], "lr_wd": {
        "layout": "cross", "log_lr": {"spacing": 1.0, "points": 3}, "log_lr_wd": {"spacing": 1.0, "points": 5}}}])
    pts = [(t.log_lr_offset, t.log_lr_wd_offset) for t in expand(spec)]
    assert len(pts) == 3 + 5 - 1 and pts[0] == (0.0, 0.0)
    assert all(a == 0 or b == 0 for a, b in pts)


def test_explicit_centre_and_even_point_counts_straddle_it():
    spec = spec_of(blocks=[{"name": "e", "rungs": [4], "lr_wd": {
        "centre": {"lr": 1e-3, "weight_decay": 0.1}, "log_lr": {"spacing": 1.0, "points": 2}}}])
    lrs = sorted(t.lr for t in expand(spec))
    assert lrs == pytest.approx([1e-3 * math.exp(-0.5), 1e-3 * math.exp(0.5)])


def test_cross_product_counts_and_precedence():
    spec = spec_of(seeds=[0, 1], overrides={"x": 1, "lr": 9.0}, blocks=[{
        "name": "p", "rungs": [3, 4], "tpp": [None, 10], "dropout": [0.0, 0.1],
        "overrides": {"x": 2}, "arms": {"a": {}, "hot": {"lr": 5.0}}}])
    trials = expand(spec)
    assert len(trials) == 2 * 2 * 2 * 2 * 2
    for t in trials:
        assert t.overrides["x"] == 2  # block beats spec
        assert t.overrides["lr"] == (5.0 if t.arm == "hot" else t.lr)  # grid beats spec, arm beats grid
        assert ("tpp" in t.overrides) == (t.tpp == 10)
        assert t.overrides["dropout"] == t.dropout
    assert {t.tpp for t in trials} == {5.0, 10.0}


def test_duplicate_points_across_blocks_appear_once():
    spec = load_spec("demo")
    trials = expand(spec)
    # The ladder's rungs + a 3x3 grid on some of them whose centres are the ladder's own points.
    ladder, grids = spec.blocks[0], [b for b in spec.blocks[1:] if len(b.lr_wd.offsets()) > 1]
    assert len(trials) == len(ladder.rungs) + sum(len(b.rungs) * (len(b.lr_wd.offsets()) - 1) for b in grids)
    assert [t.block for t in trials[:len(ladder.rungs)]] == ["ladder"] * len(ladder.rungs)


@pytest.mark.parametrize("bad, field", [
    ({"blocks": []}, "blocks"),
    ({"blocks": [{"name": "b", "rungs": []}]}, "blocks.b.rungs"),
    ({"blocks": [{"name": "b", "rungs": [3], "lr_wd": {"log_lr": {"offsets": []}}}]}, "blocks.b.lr_wd.log_lr"),
    ({"blocks": [{"name": "b", "rungs": [3], "lr_wd": {"centre": {"lr": -1e-3, "weight_decay": 0.1}}}]},
     "blocks.b.lr_wd.centre"),
    ({"blocks": [{"name": "b", "rungs": [3], "dropout": [1.5]}]}, "blocks.b.dropout"),
    ({"blocks": [{"name": "a", "rungs": [3]}, {"name": "b", "rungs": [3], "tpp": [-1]}]}, "blocks.b.tpp"),
    ({"blocks": [{"rungs": [3], "tpp": [-1]}]}, "blocks.0."),  # no name to call it by: its position
    ({"resources": {"cpus": 0}}, "resources.cpus"),
    ({"resources": {"gpus": 4, "workers": 2}}, "gpus: 1, workers: 8"),
    ({"seeds": []}, "seeds"),
    ({"colour": "red"}, "colour"),
    ({"blocks": [{"name": "b", "rungs": [3]}, {"name": "b", "rungs": [4]}]}, ""),
])
def test_bad_specs_name_the_field(bad, field):
    with pytest.raises(LadderInputError) as err:
        spec_of(**bad)
    assert "test.yaml" in str(err.value)
    assert field in str(err.value)


def test_unknown_recipe_is_an_input_error():
    spec = spec_of(recipe="no-such-recipe")
    with pytest.raises(LadderInputError, match="no recipe named"):
        expand(spec)


def test_missing_spec_file_lists_the_shipped_ones(tmp_path):
    with pytest.raises(LadderInputError, match="smoke"):
        load_spec(tmp_path / "nope.yaml")


def test_the_science_check_ladder_has_five_rungs_over_30x_compute_at_one_tpp():
    from sweeps.plan import plan_sweep

    planned = plan_sweep(load_spec("backtest"))
    rungs = {p.config["L"] for p in planned}
    flops = {p.config["L"]: p.config["flops_per_token"] * p.config["steps"] * p.config["batch_sequences"]
             * p.config["seq_len"] for p in planned}
    assert len(rungs) >= 5
    assert max(flops.values()) / min(flops.values()) >= 30
    assert len({p.config["tpp"] for p in planned}) == 1
    assert min(p.config["d_model"] for p in planned) >= 64  # pre-asymptotic rungs stay out (docs/backtest_diagnosis)


@pytest.mark.parametrize("top, block", [({"max_steps": 20}, {}), ({}, {"max_steps": 20}),
                                        ({"overrides": {"max_steps": 20}}, {}), ({}, {"overrides": {"max_steps": 20}})],
                         ids=["spec", "block", "spec-overrides", "block-overrides"])
def test_an_arms_max_steps_beats_the_blocks_and_the_specs(top, block):
    """docs/sweeps.md: later ones win, spec, then block, then arm. The spec's cap used to replace the arm's, so
    the arm resolved to the base arm's config and vanished from the plan as a duplicate."""
    from sweeps.plan import plan_sweep

    spec = spec_of(**top, blocks=[{"name": "b", "rungs": [3], **block,
                                   "arms": {"base": {}, "short": {"max_steps": 5}, "full": {"max_steps": None}}}])
    planned = {p.trial.arm: p for p in plan_sweep(spec, where="test.yaml")}
    assert set(planned) == {"base", "short", "full"}
    assert planned["base"].config["max_steps"] == 20 and planned["short"].config["max_steps"] == 5
    assert planned["full"].config.get("max_steps") is None  # null lifts the cap: the uncapped rung
    assert [planned[a].trial.max_steps for a in ("base", "short", "full")] == [20, 5, None]
    assert all("max_steps" not in p.trial.overrides for p in planned.values())
    # A block's cap beats the spec's, as an arm's beats both.
    both = spec_of(max_steps=20, blocks=[{"name": "b", "rungs": [3], "max_steps": 10}])
    assert [t.max_steps for t in expand(both)] == [10]


@pytest.mark.parametrize("bad, field", [
    ({"max_steps": 20, "overrides": {"max_steps": 5}}, "overrides.max_steps"),
    ({"blocks": [{"name": "b", "rungs": [3], "max_steps": 20, "overrides": {"max_steps": 5}}]},
     "blocks.b.overrides.max_steps"),
    ({"blocks": [{"name": "b", "rungs": [3], "arms": {"a": {"max_steps": 0}}}]}, "blocks.b.arms.a.max_steps"),
    ({"blocks": [{"name": "b", "rungs": [3], "arms": {"a": {"max_steps": "5"}}}]}, "blocks.b.arms.a.max_steps"),
])
def test_a_max_steps_written_twice_at_one_level_or_not_a_cap_is_refused(bad, field):
    with pytest.raises(LadderInputError) as err:
        spec_of(**bad)
    assert err.value.field == field


def test_a_blocks_resources_inherit_the_fields_it_leaves_out():
    """The Block docstring: fields left out inherit the spec's. A block's `resources` used to replace the spec's
    whole, dropping its gpu_memory (so no memory check ran) and its cpus."""
    spec = spec_of(resources={"cpus": 4, "gpus": 1, "workers": 2, "gpu_memory": "80GB"},
                   blocks=[{"name": "own", "rungs": [3], "resources": {"workers": 4}}, {"name": "plain", "rungs": [4]}])
    own, plain = expand(spec)
    assert (own.resources.cpus, own.resources.gpus, own.resources.workers, own.resources.gpu_memory) == \
        (4, 1, 4, "80GB")
    assert plain.resources == spec.resources
    # The merged resources are checked as a whole: the spec's ep must divide the block's workers.
    with pytest.raises(LadderInputError) as err:
        spec_of(resources={"gpus": 1, "workers": 8, "ep": 8}, blocks=[{"name": "b", "rungs": [3],
                                                                       "resources": {"workers": 4}}])
    assert err.value.field == "blocks.b.resources" and "ep=8" in err.value.detail


@pytest.mark.parametrize("axis, says", [
    ({"spacing": 0.5, "points": 3, "offsets": [0.0]}, "`spacing` is ignored beside `offsets`"),
    ({"points": 3, "offsets": [0.0, 0.5]}, "`points` is ignored beside `offsets`"),
    ({"spacing": 0.5}, "`spacing` 0.5 does nothing with `points: 1`"),
    ({"spacing": 0.7, "points": 1}, "`spacing` 0.7 does nothing with `points: 1`"),
])
def test_an_axis_field_that_would_be_ignored_is_refused(axis, says):
    with pytest.raises(LadderInputError) as err:
        spec_of(blocks=[{"name": "b", "rungs": [3], "lr_wd": {"log_lr_wd": axis}}])
    assert err.value.field == "blocks.b.lr_wd.log_lr_wd" and says in err.value.detail
    assert "\n" not in str(err.value)
    # What is meant is still written: offsets alone, or spacing with points, or a zero spacing.
    for fine in ({"offsets": [0.0, 0.5]}, {"spacing": 0.5, "points": 3}, {"spacing": 0.0}):
        spec_of(blocks=[{"name": "b", "rungs": [3], "lr_wd": {"log_lr_wd": fine}}])


def test_every_shipped_spec_still_loads():
    for name in available_specs():
        assert load_spec(name).blocks, name


def test_cross_layout_with_an_even_point_count_is_refused_and_grid_counts_are_as_documented():
    """An even axis straddles the centre: its cross would be a+b+1 points (5 for 2×2, more than the grid's 4)."""
    with pytest.raises(LadderInputError) as err:
        spec_of(blocks=[{"name": "c", "rungs": [3], "lr_wd": {
            "layout": "cross", "log_lr": {"spacing": 0.5, "points": 2}, "log_lr_wd": {"spacing": 0.7, "points": 3}}}])
    assert err.value.field == "blocks.c.lr_wd" and "`log_lr` has 2 points" in err.value.detail
    grid = spec_of(blocks=[{"name": "g", "rungs": [3], "lr_wd": {
        "log_lr": {"spacing": 0.5, "points": 2}, "log_lr_wd": {"spacing": 0.7, "points": 2}}}])
    assert len(expand(grid)) == 2 * 2
    # Explicit offsets without 0: the centre is added, one more point than a+b-1.
    offsets = spec_of(blocks=[{"name": "o", "rungs": [3], "lr_wd": {
        "layout": "cross", "log_lr": {"offsets": [0.5, 1.0]}, "log_lr_wd": {"spacing": 0.7, "points": 3}}}])
    assert len(expand(offsets)) == 2 + 3 - 1 + 1
