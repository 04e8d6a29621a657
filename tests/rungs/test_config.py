"""TrainConfig's capacity_factor: validated at the edge, carried to the model, and no key changed at its
default (a legacy value: runs made before the field keep their trial and checkpoint keys)."""

from __future__ import annotations

import pytest

from rungs.config import TrainConfigError, parse_config
from sweeps.keys import trial_key
from tests.rungs.train_helpers import tiny_config


def test_capacity_factor_at_its_default_changes_no_key_and_set_it_is_another_trial():
    base = tiny_config()
    default = {**base, "capacity_factor": None}
    assert trial_key(default) == trial_key(base)
    assert parse_config(default).key() == parse_config(base).key()
    assert "capacity_factor" in parse_config(base).to_dict()
    assert trial_key({**base, "capacity_factor": 1.5}) != trial_key(base)
    assert parse_config({**base, "capacity_factor": 1.5}).key() != parse_config(base).key()


def test_capacity_factor_reaches_the_routed_experts():
    from rungs.model import Transformer

    cfg = parse_config({**tiny_config(), "capacity_factor": 1.5})
    model = Transformer(cfg.architecture())
    assert {layer.moe.experts.capacity_factor for layer in model.layers} == {1.5}


@pytest.mark.parametrize("extra,match", [
    ({"capacity_factor": 0}, "capacity_factor"),
    ({"capacity_factor": -1.0}, "capacity_factor"),
    ({"capacity_factor": float("inf")}, "capacity_factor"),
    ({"capacity_factor": 1.5, "capacity_per_expert": 8}, "capacity_factor=1.5 and capacity_per_expert=8"),
    ({"capacity_factor": 1.5, "backend": "jax"}, "JAX job does not read it"),
])
def test_a_capacity_factor_that_cannot_size_the_rounds_is_refused(extra, match):
    with pytest.raises(TrainConfigError, match=match):
        parse_config({**tiny_config(), **extra})


@pytest.mark.parametrize("key, value", [("lr", True), ("steps", False), ("grad_clip", True), ("seed", True),
                                        ("capacity_per_expert", True)])
def test_true_or_false_where_a_number_goes_is_refused_not_read_as_one_or_zero(key, value):
    """pydantic's lax mode reads true as 1 and false as 0: `--set lr=true` trained at lr = 1.0."""
    from ladder.errors import LadderInputError

    good = tiny_config()
    with pytest.raises(TrainConfigError, match=rf"{key}: takes (int|float)( or int)?, not true/false \(got {str(value).lower()}\)"):
        parse_config({**good, key: value})
    with pytest.raises(LadderInputError, match=f"{key}: takes"):  # as `ladder train --set` resolves it
        tiny_config(**{key: value})


def test_true_or_false_where_a_bool_goes_is_taken():
    cfg = parse_config(tiny_config(agc=False, deterministic=True))
    assert cfg.agc is False and cfg.deterministic is True


def test_agc_on_without_points_and_a_repeated_point_are_refused():
    """agc=true with no points trained as agc=false under another key; a repeated point clips once."""
    good = tiny_config()
    with pytest.raises(TrainConfigError, match="clips nothing"):
        parse_config({**good, "agc": True, "agc_points": []})
    with pytest.raises(TrainConfigError, match=r"\['residual'\] named more than once"):
        parse_config({**good, "agc_points": ["residual", "moe_input", "residual"]})
    assert parse_config({**good, "agc": False, "agc_points": []}).agc is False


@pytest.mark.parametrize("key", ["L", "params_total", "params_active"])
def test_a_rung_or_parameter_count_below_one_is_refused(key):
    with pytest.raises(TrainConfigError, match=key):
        parse_config({**tiny_config(), key: 0})
