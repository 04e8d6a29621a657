"""A multi-worker trial's expert parallelism: the spec's `resources.ep`, else the memory planner's
(so multi-worker trials get expert parallelism), never part of the trial key; and under expert
parallelism the planner's MoE capacity factor unless the spec sets the capacity."""

from __future__ import annotations

import pytest

from ladder.errors import LadderInputError
from ladder.plan.memory import planned_expert_parallel
from ladder.run.trial import expert_parallel_size, launch_config
from rungs.config import parse_config
from sweeps.plan import plan_sweep
from sweeps.spec import parse_spec


def _planned(resources: dict, overrides: dict | None = None):
    spec = parse_spec({"name": "ep", "recipe": "cpu-demo", "max_steps": 2,
                       "overrides": {"batch_sequences": 8} | (overrides or {}),
                       "resources": resources, "blocks": [{"name": "b", "rungs": [3]}]}, "test spec")
    (planned,) = plan_sweep(spec)
    return planned


def _payload(planned) -> dict:  # the two fields of ladder.run.orchestrate's trial payload it reads
    return {"config": planned.config, "resources": planned.trial.resources.model_dump()}


def test_multi_worker_trial_takes_the_planners_expert_parallelism():
    planned = _planned({"cpus": 1, "workers": 2})
    ep = expert_parallel_size(_payload(planned))
    assert ep == planned_expert_parallel(planned.config, workers=2, gpu=False) == 2
    # a launch detail: the trial key is the one-worker trial's
    assert planned.key == _planned({"cpus": 1}).key
    assert expert_parallel_size(_payload(_planned({"cpus": 1}))) == 1


def test_the_spec_says_otherwise():
    planned = _planned({"cpus": 1, "workers": 2, "ep": 1})
    assert expert_parallel_size(_payload(planned)) == 1
    assert planned.key == _planned({"cpus": 1, "workers": 2}).key


def test_ep_must_divide_the_workers():
    with pytest.raises(LadderInputError, match="ep=3 must divide workers=2"):
        _planned({"cpus": 1, "workers": 2, "ep": 3})


def test_planner_keeps_experts_whole_and_groups_valid():
    planned = _planned({"cpus": 1, "workers": 2})
    config = dict(planned.config)
    # 8 experts over 16 workers: ep can be at most 8 (whole experts per rank)
    assert planned_expert_parallel(config | {"batch_sequences": 16}, workers=16, gpu=True) in (1, 2, 4, 8)
    with pytest.raises(LadderInputError, match="workers"):
        planned_expert_parallel(config, workers=0, gpu=False)


def test_an_expert_parallel_trial_launches_at_the_planners_capacity_factor_under_its_own_key():
    planned = _planned({"cpus": 1, "workers": 2})
    payload = _payload(planned)
    config = launch_config(payload, expert_parallel_size(payload))
    assert config["capacity_factor"] == 1.5 and payload["config"]["capacity_factor"] is None
    assert parse_config(config).capacity_factor == 1.5  # the job accepts it
    assert launch_config(payload, 1) is payload["config"]  # no exchange to size on dp alone
    assert planned.key == _planned({"cpus": 1}).key     # the trial key is the one-worker trial's


@pytest.mark.parametrize("overrides", [{"capacity_factor": 2.0}, {"capacity_per_expert": 64}])
def test_a_spec_that_sets_the_capacity_keeps_it(overrides):
    planned = _planned({"cpus": 1, "workers": 2, "ep": 2}, overrides)
    config = launch_config(_payload(planned), 2)
    assert {k: config[k] for k in overrides} == overrides
    assert config["capacity_factor"] == overrides.get("capacity_factor")
