"""A sweep spec's grid knobs (lr, weight_decay, dropout, tpp, seed) are checked where they are written, a spec's
or block's override is never silently replaced by the grid, seeds are in torch's range, and a trial's label
and coordinates are the values it runs with (an arm's pinned seed, TPP or dropout included)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from ladder.cli import main
from ladder.errors import LadderInputError
from ladder.plan.resolve import resolve_train_config
from rungs.config import TrainConfig
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec


def write_spec(path, block=None, **fields):
    spec = {"name": "t", "recipe": "cpu-demo", "max_steps": 2, **fields,
            "blocks": [{"name": "b", "rungs": [3], **(block or {})}]}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def refused(tmp_path, capsys, field, block=None, **fields):
    """`ladder sweep plan` exits 2 with one line naming the field, and writes nothing."""
    spec = write_spec(tmp_path / "s.yaml", block, **fields)
    before = sorted(tmp_path.rglob("*"))
    rc = main(["sweep", "plan", str(spec)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"{spec}: {field}:" in err, err
    assert sorted(tmp_path.rglob("*")) == before
    return err


@pytest.mark.parametrize("arm,key", [({"lr": "fast"}, "lr"), ({"lr": None}, "lr"), ({"weight_decay": "x"}, "weight_decay"),
                                     ({"lr": True}, "lr"), ({"lr": -1}, "lr"), ({"seed": -3}, "seed"),
                                     ({"seed": 2**32}, "seed"), ({"seed": True}, "seed"), ({"seed": 1.5}, "seed"),
                                     ({"tpp": 0}, "tpp"), ({"dropout": 1.0}, "dropout")])
def test_a_bad_arm_value_names_the_arms_field(tmp_path, capsys, arm, key):
    refused(tmp_path, capsys, f"blocks.b.arms.a.{key}", {"arms": {"a": arm}})


def test_an_unknown_arm_key_names_the_arm(tmp_path, capsys):
    refused(tmp_path, capsys, "blocks.b.arms.a.bogus", {"arms": {"a": {"bogus": 1}}})


@pytest.mark.parametrize("where", ["spec", "block"])
@pytest.mark.parametrize("values,key", [({"lr": -1}, "lr"), ({"weight_decay": "x"}, "weight_decay"),
                                        ({"lr": True}, "lr"), ({"seed": 3}, "seed")])
def test_spec_and_block_overrides_are_checked(tmp_path, capsys, where, values, key):
    if where == "spec":
        err = refused(tmp_path, capsys, f"overrides.{key}", overrides=values)
    else:
        err = refused(tmp_path, capsys, f"blocks.b.overrides.{key}", {"overrides": values})
    if key == "seed":
        assert "seeds" in err


@pytest.mark.parametrize("block,key", [({"lr_wd": {"log_lr": {"points": 3, "spacing": 0.5}}}, "lr"),
                                       ({"lr_wd": {"centre": {"lr": 0.1, "weight_decay": 0.1}}}, "weight_decay"),
                                       ({"tpp": [10]}, "tpp"), ({"dropout": [0.1]}, "dropout")])
def test_an_override_beside_the_blocks_own_grid_is_refused(tmp_path, capsys, block, key):
    value = {"lr": 0.01, "weight_decay": 0.1, "tpp": 5, "dropout": 0.2}[key]
    refused(tmp_path, capsys, f"overrides.{key}", block, overrides={key: value})
    refused(tmp_path, capsys, f"blocks.b.overrides.{key}", {**block, "overrides": {key: value}})


@pytest.mark.parametrize("where", ["spec", "block"])
def test_an_lr_wd_override_replaces_the_laws_centre(tmp_path, where):
    values = {"lr": 0.01, "weight_decay": 0.5}
    fields = {"overrides": values} if where == "spec" else {}
    block = {"overrides": values} if where == "block" else {}
    [planned] = plan_sweep(load_spec(write_spec(tmp_path / "s.yaml", block, **fields)))
    assert (planned.config["lr"], planned.config["weight_decay"]) == (0.01, 0.5)
    assert (planned.trial.lr, planned.trial.weight_decay) == (0.01, 0.5)
    assert "lr0.01 wd0.5" in planned.label


@pytest.mark.parametrize("fields,field", [({"seeds": [2**32]}, "seeds.0"), ({"seeds": [-1]}, "seeds.0"),
                                          ({"seeds": [True]}, "seeds.0"), ({"max_steps": True}, "max_steps")])
def test_spec_seeds_and_types_are_checked(tmp_path, capsys, fields, field):
    refused(tmp_path, capsys, field, **fields)


@pytest.mark.parametrize("block,field", [({"seeds": [2**32]}, "blocks.b.seeds.0"), ({"rungs": [True]}, "blocks.b.rungs.0"),
                                         ({"max_steps": True}, "blocks.b.max_steps"), ({"arms": {"": {}}}, "blocks.b.arms"),
                                         ({"arms": {"a/b c": {}}}, "blocks.b.arms")])
def test_block_seeds_types_and_arm_names_are_checked(tmp_path, capsys, block, field):
    refused(tmp_path, capsys, field, block)


def test_the_largest_seed_plans(tmp_path):
    [planned] = plan_sweep(load_spec(write_spec(tmp_path / "s.yaml", seeds=[2**32 - 1])))
    assert planned.config["seed"] == planned.trial.seed == 2**32 - 1


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_train_config_seed_is_bounded(seed):
    config = resolve_train_config("cpu-demo", 3, {})
    with pytest.raises(ValidationError):
        TrainConfig.model_validate({**config, "seed": seed})
    with pytest.raises(LadderInputError) as err:
        resolve_train_config("cpu-demo", 3, {"seed": seed})
    assert err.value.field == "seed"
    assert TrainConfig.model_validate({**config, "seed": 2**32 - 1}).seed == 2**32 - 1


def test_train_refuses_an_out_of_range_seed_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["train", "cpu-demo", "--rung", "3", "--set", "seed=-1"])
    err = capsys.readouterr().err
    assert rc == 2 and "seed" in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_an_arms_pinned_seed_tpp_and_dropout_are_its_coordinates(tmp_path):
    arms = {"base": {}, "s5": {"seed": 5}, "t10": {"tpp": 10}, "d1": {"dropout": 0.1}, "lr": {"lr": 0.002}}
    planned = {p.trial.arm: p for p in plan_sweep(load_spec(write_spec(tmp_path / "s.yaml", {"arms": arms})))}
    base = planned["base"].trial.coordinates()
    for arm, key, value in [("s5", "seed", 5), ("t10", "tpp", 10.0), ("d1", "dropout", 0.1), ("lr", "lr", 0.002)]:
        trial = planned[arm].trial
        coords = trial.coordinates()
        assert coords[key] == value == planned[arm].config[key], arm
        assert {k: v for k, v in coords.items() if k not in (key, "arm")} == \
            {k: v for k, v in base.items() if k not in (key, "arm")}, arm
    assert planned["s5"].label.endswith(" s5 s5")
    assert " p0.1 " in planned["d1"].label
    assert " lr0.002 " in planned["lr"].label
    assert planned["base"].label.endswith(" s0")


def test_a_block_of_several_tpps_names_each_trials_tpp_in_its_label(tmp_path):
    # An explicit centre gives every TPP the same LR and WD: without the TPP the two trials shared a label,
    # and the demo's time-left estimate (keyed by label) counted one of them twice.
    block = {"tpp": [5, 20], "lr_wd": {"centre": {"lr": 0.01, "weight_decay": 0.1}}}
    planned = plan_sweep(load_spec(write_spec(tmp_path / "s.yaml", block)))
    assert sorted(p.label for p in planned) == ["b L3 tpp20 lr0.01 wd0.1 s0", "b L3 tpp5 lr0.01 wd0.1 s0"]
    assert [p.config["tpp"] for p in planned] == [5.0, 20.0]
    single = plan_sweep(load_spec(write_spec(tmp_path / "one.yaml", {"tpp": [5]})))
    assert "tpp" not in single[0].label  # one TPP a block: the labels every single-TPP sweep already had


def test_two_trials_a_label_cannot_tell_apart_are_refused(tmp_path, capsys):
    # LRs 0.01% apart print alike at three significant digits.
    err = refused(tmp_path, capsys, "blocks.b", {"lr_wd": {"log_lr": {"offsets": [0, 0.0001]}}})
    assert "labelled" in err and "space the grid points" in err



def test_a_grid_value_the_config_refuses_names_the_blocks_lr_wd(tmp_path, capsys):
    """An explicit centre 20 natural logs below an lr of 1e300 is an infinite lr: the grid made it, so the field
    is the block's `lr_wd` (it was `blocks.b.lr`, a field no spec has)."""
    refused(tmp_path, capsys, "blocks.b.lr_wd", {"lr_wd": {"centre": {"lr": 1e300, "weight_decay": 1e300},
                                                            "log_lr": {"offsets": [20]}}})


def test_an_architecture_override_the_config_refuses_names_the_arms_field(tmp_path, capsys):
    """`n_experts: 0` gave `blocks.b: ... integer division or modulo by zero`, Python's words, no field."""
    err = refused(tmp_path, capsys, "blocks.b.arms.a.n_experts", {"arms": {"a": {"n_experts": 0}}})
    assert "division" not in err and "greater than 0" in err
