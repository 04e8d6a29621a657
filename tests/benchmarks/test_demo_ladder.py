"""benchmarks/demo_ladder.py on a candidate spec (`--spec`): every rung a trial trains is measured, whatever its
blocks are called, and a spec with activation gradient clipping off steps without a clipper, as its job does."""

from __future__ import annotations

import pytest

from benchmarks import demo_ladder


@pytest.mark.slow
def test_a_spec_without_a_ladder_block_and_with_agc_off_is_measured_at_every_rung(tmp_path):
    spec = tmp_path / "noagc.yaml"
    spec.write_text("""\
name: noagc
recipe: cpu-demo-d2
experiment: sweep-noagc
seeds: [0]
resources: {cpus: 1, gpus: 0, workers: 1}
overrides: {agc: false}
blocks:
  - name: ablation
    rungs: [2, 3]
    arms:
      a: {}
      b: {dropout: 0.1}
""")
    results = demo_ladder.run(True, str(spec)).results
    assert sorted(results["rungs"]) == ["L2", "L3"] and results["trials"] == 4
    assert all(r["step_cpu_seconds"] > 0 and r["steps"] > 0 for r in results["rungs"].values())
    assert results["idle_training_seconds_estimate"] > 0


def test_a_stepper_with_agc_off_has_no_clipper():
    from ladder.plan.resolve import resolve_train_config

    stepper = demo_ladder.Stepper(resolve_train_config("cpu-demo-d2", 2, {"agc": False}))
    assert stepper.clipper is None and stepper.model.activation_clip.__name__ == "_no_clip"
    assert stepper.step() >= 0
