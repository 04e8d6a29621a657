"""Sweep specs from a notebook: values checked where they are written, trials that train alike keyed
alike, and trials that train differently never merged."""

from __future__ import annotations

import pytest

from ladder.errors import LadderInputError
from sweeps.plan import plan_sweep
from sweeps.spec import parse_spec


def _spec(**fields) -> dict:
    return {"name": "t", "recipe": "cpu-demo", **fields}


def _planned(**fields):
    return plan_sweep(parse_spec(_spec(**fields), "t"), where="t")


def test_a_block_without_dropout_keeps_the_recipes_beside_a_block_that_sets_it():
    """Trials differing only in grid knobs share one resolution; one that leaves dropout to the recipe
    must not take the dropout of a trial resolved before it (and so vanish into that trial's key)."""
    both = _planned(blocks=[{"name": "drop", "rungs": [3], "dropout": [0.1]}, {"name": "plain", "rungs": [3]}])
    alone = _planned(blocks=[{"name": "plain", "rungs": [3]}])
    assert [(p.trial.block, p.config["dropout"]) for p in both] == [("drop", 0.1), ("plain", 0.0)]
    assert both[1].key == alone[0].key
    arms = _planned(blocks=[{"name": "b", "rungs": [3], "arms": {"drop": {"dropout": 0.1}, "base": {}}}])
    assert [p.config["dropout"] for p in arms] == [0.1, 0.0]
    assert arms[1].key == alone[0].key


@pytest.mark.parametrize("written", [
    {"overrides": {"tpp": 20}, "blocks": [{"name": "b", "rungs": [3]}]},
    {"blocks": [{"name": "b", "rungs": [3], "overrides": {"tpp": 20.0}}]},
], ids=["spec-override", "block-override"])
def test_a_tpp_override_centres_lr_and_wd_on_the_law_at_that_tpp(written):
    """The law's LR and WD read the rung's steps, which TPP sets: a spec's or block's `tpp` override trains
    the same trial as the block's `tpp: [20]`, not TPP 20 at the LR of the recipe's TPP."""
    (listed,) = _planned(blocks=[{"name": "b", "rungs": [3], "tpp": [20]}])
    planned = _planned(**written)
    assert [p.key for p in planned] == [listed.key]
    assert planned[0].trial.lr == planned[0].config["lr"] == listed.config["lr"]


def test_equal_configs_written_differently_share_a_key_and_different_ones_do_not():
    one = _planned(blocks=[{"name": "b", "rungs": [3], "arms": {"base": {"lr": 1, "weight_decay": 0, "tpp": 5}}}])
    other = _planned(blocks=[{"name": "b", "rungs": [3], "arms": {"base": {"tpp": 5.0, "weight_decay": 0.0,
                                                                           "lr": 1.0}}}])
    assert one[0].key == other[0].key
    changed = _planned(blocks=[{"name": "b", "rungs": [3], "arms": {"base": {"lr": 1.0, "weight_decay": 0.0,
                                                                             "tpp": 5.0, "seed": 1}}}])
    assert changed[0].key != one[0].key


@pytest.mark.parametrize("field, block, top", [
    ("blocks.b.tpp.0", {"tpp": [True]}, {}),
    ("blocks.b.dropout.0", {"dropout": [False]}, {}),
    ("blocks.b.lr_wd.centre.lr", {"lr_wd": {"centre": {"lr": True, "weight_decay": 0.1}}}, {}),
    ("blocks.b.lr_wd.log_lr.spacing", {"lr_wd": {"log_lr": {"spacing": True, "points": 3}}}, {}),
    ("blocks.b.lr_wd.log_lr.offsets.0", {"lr_wd": {"log_lr": {"offsets": [True]}}}, {}),
    ("resources.workers", {}, {"resources": {"workers": True}}),
    ("resources.cpus", {}, {"resources": {"cpus": True}}),
    ("max_failures", {}, {"max_failures": False}),
])
def test_a_boolean_where_a_number_is_due_is_refused_naming_the_field(field, block, top):
    """pydantic reads true as 1: `tpp: [yes]` planned TPP 1 and `centre: {lr: true}` an LR of 1."""
    with pytest.raises(LadderInputError) as err:
        parse_spec(_spec(blocks=[{"name": "b", "rungs": [3], **block}], **top), "t")
    assert err.value.field == field and "number" in err.value.detail


def test_a_number_yaml_read_as_text_is_refused_with_how_to_write_it():
    with pytest.raises(LadderInputError) as err:
        parse_spec(_spec(blocks=[{"name": "b", "rungs": [3], "arms": {"a": {"lr": "1e-3"}}}]), "t")
    assert err.value.field == "blocks.b.arms.a.lr" and "write 0.001" in err.value.detail


@pytest.mark.parametrize("data", ["", "   "])
def test_an_empty_spec_data_path_is_refused_not_read_as_the_specs_folder(tmp_path, data):
    from sweeps.spec import load_spec

    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nrecipe: cpu-demo\ndata: '{data}'\nblocks: [{{name: b, rungs: [3]}}]\n")
    with pytest.raises(LadderInputError, match="data.*empty string"):
        load_spec(path)


@pytest.mark.parametrize("where", ["overrides", "arms"])
def test_a_list_as_an_override_value_is_refused_as_one_value_expected(where):
    """It read "Input should be a valid boolean" (the first member of the value's union)."""
    block = {"name": "b", "rungs": [3], **({"overrides": {"lr": [1, 2]}} if where == "overrides" else
                                           {"arms": {"a": {"lr": [1, 2]}}})}
    with pytest.raises(LadderInputError, match=r"lr: an override sets one config value .* got list \[1, 2\]$") as err:
        parse_spec({"name": "s", "recipe": "cpu-demo", "blocks": [block]}, "s.yaml")
    assert "Value error" not in str(err.value) and "boolean" not in str(err.value)
