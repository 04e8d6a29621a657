"""The mesh a JAX trial trains on (`rungs.jaxjob.train.trial_mesh`): the expert axis from the config's
`jax_mesh_expert` (or the default rule), refused with the field's name when it does not fit, and no
trial or checkpoint key changed by the field at its default. That a trial on 4 devices trains on
that mesh and equals one device is in test_sharding.py (it needs a 4-device subprocess)."""

from __future__ import annotations

import pytest

from ladder.cli import main
from rungs.config import TrainConfigError, parse_config
from rungs.jaxjob.sharding import default_expert_axis
from rungs.jaxjob.train import trial_mesh
from sweeps.keys import trial_key
from tests.rungs.train_helpers import tiny_config


def test_the_default_expert_axis_is_the_largest_that_divides_the_devices_and_the_experts():
    assert default_expert_axis(1, 8) == 1
    assert default_expert_axis(4, 8) == 4
    assert default_expert_axis(6, 8) == 2      # 6 devices, 8 experts: 2 divides both, 3 and 6 do not
    assert default_expert_axis(8, 4) == 4      # never more than the experts
    assert default_expert_axis(3, 8) == 1      # nothing above 1 divides both: pure data parallel
    # 8 experts in groups of 4 on 4 devices: 2 experts a device, one whole (clamped) group each
    assert default_expert_axis(4, 8, group_size=4) == 4
    # groups of 3 over 12 experts on 4 devices: 3 a device works (4 | 12, 3 % 3 == 0)
    assert default_expert_axis(4, 12, group_size=3) == 4
    # groups of 2 over 12 experts on 4 devices: 3 a device, 3 % 2 != 0: 2 devices (6 a device)
    assert default_expert_axis(4, 12, group_size=2) == 2


def test_an_expert_axis_that_does_not_divide_the_devices_or_the_experts_is_refused_naming_the_field():
    devices = [object()] * 4  # only the count is read before the mesh is built
    with pytest.raises(TrainConfigError, match=r"jax_mesh_expert: .*4 device\(s\).*n_experts=8.*\[1, 2, 4\]"):
        trial_mesh(parse_config(tiny_config(backend="jax", jax_mesh_expert=3)), devices)
    with pytest.raises(TrainConfigError, match="jax_mesh_expert") as err:
        trial_mesh(parse_config(tiny_config(backend="jax", jax_mesh_expert=16)), [object()] * 16)
    assert err.value.key == "jax_mesh_expert"      # 16 devices, but only 8 experts
    with pytest.raises(TrainConfigError, match="jax_mesh_expert"):
        parse_config({**tiny_config(backend="jax"), "jax_mesh_expert": 0})
    assert trial_mesh(parse_config(tiny_config(backend="jax")), [object()]) is None  # one device: unsharded


def test_ladder_train_with_a_mesh_that_does_not_fit_exits_2_naming_the_field(tmp_path, capsys):
    code = main(["train", "cpu-demo", "--rung", "3", "--set", "backend=jax", "--set", "jax_mesh_expert=3",
                 "--max-steps", "1", "--run-dir", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err
    assert "jax_mesh_expert" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before the job touched its directory


def test_the_mesh_field_at_its_default_changes_no_key_and_set_it_is_another_trial():
    base = tiny_config(backend="jax")
    default = {**base, "jax_mesh_expert": None}
    assert trial_key(default) == trial_key(base)
    assert parse_config(default).key() == parse_config(base).key()
    assert "jax_mesh_expert" in parse_config(base).to_dict()  # still an MLflow param of every run
    assert trial_key({**base, "jax_mesh_expert": 2}) != trial_key(base)


def test_a_mesh_on_a_torch_trial_is_refused_instead_of_ignored():
    """The field shapes only the JAX job's mesh: on a torch trial it would make a new trial key that
    trains exactly as the old one."""
    with pytest.raises(TrainConfigError, match="jax_mesh_expert=2.*backend is 'torch'"):
        parse_config({**tiny_config(backend="jax", jax_mesh_expert=2), "backend": "torch"})
    assert parse_config(tiny_config(backend="jax", jax_mesh_expert=2)).jax_mesh_expert == 2
