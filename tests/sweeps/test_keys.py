"""Trial keys: stable across processes and dict order, sensitive to every value."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sweeps.keys import canonical_json, trial_key

CONFIG = {"recipe": "cpu-demo", "L": 3, "optimizer": {"lr": 0.0147, "weight_decay": 6.25, "betas": [0.9, 0.95]},
          "max_steps": 40, "deterministic": False, "data": None}


def test_key_ignores_dict_order_and_container_type():
    shuffled = {"max_steps": 40, "data": None, "deterministic": False,
                "optimizer": {"betas": (0.9, 0.95), "weight_decay": 6.25, "lr": 0.0147}, "L": 3, "recipe": "cpu-demo"}
    assert trial_key(shuffled) == trial_key(CONFIG)


@pytest.mark.parametrize("path, value", [
    (("optimizer", "lr"), 0.0147000001), (("L",), 4), (("deterministic",), True), (("data",), "x"),
    (("optimizer", "betas"), [0.9, 0.99]), (("max_steps",), 41),
])
def test_any_change_changes_the_key(path, value):
    changed = json.loads(json.dumps(CONFIG))
    target = changed
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    assert trial_key(changed) != trial_key(CONFIG)


def test_key_is_the_same_in_another_process_with_another_hash_seed():
    code = ("import json,sys; from sweeps.keys import trial_key; "
            "print(trial_key(json.loads(sys.argv[1])))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(CONFIG)], capture_output=True, text=True,
                         env=env, check=True).stdout.strip()
    assert out == trial_key(CONFIG)


def test_unkeyable_values_are_refused():
    with pytest.raises(TypeError):
        trial_key({"f": object()})
    assert "NaN" not in canonical_json({"x": float("nan")})


def test_where_a_run_is_tracked_is_not_part_of_its_identity():
    moved = {**CONFIG, "tracking_uri": "http://127.0.0.1:5000", "experiment_name": "x", "trial_key": "abc",
             "threads": 4, "data_cache_root": "/elsewhere", "checkpoint_interval": 7}
    assert trial_key(moved) == trial_key(CONFIG)


def test_a_field_at_the_value_runs_had_before_it_existed_keeps_their_key():
    # `subset` arrived after runs trained with the plain prefix rule: "prefix" keeps their keys,
    # the new default names new trials.
    assert trial_key({**CONFIG, "subset": "prefix"}) == trial_key(CONFIG)
    assert trial_key({**CONFIG, "subset": "stratified"}) != trial_key(CONFIG)



def test_an_old_config_that_sets_the_removed_log_interval_loads_with_the_same_keys():
    from ladder.plan.generator import plan_rung
    from ladder.plan.recipe import load_recipe
    from rungs.config import TrainConfig, parse_config

    config = {**plan_rung(load_recipe("cpu-demo"), 3).to_dict(), "tracking_uri": None}
    old = {**config, "log_interval": 10}
    assert "log_interval" not in TrainConfig.model_fields  # nothing read it
    assert parse_config(old) == parse_config(config)
    assert parse_config(old).key() == parse_config(config).key()
    assert trial_key(old) == trial_key(config)
