"""The demo's time left (ladder.analysis.sweep_eta): weighed by each trial's FLOPs, from the orchestrator's
own trial-end messages; a clock passed in, so nothing here depends on how fast the machine is."""

from __future__ import annotations

import pytest

from ladder.analysis.demo import _trial_flops
from ladder.analysis.sweep_eta import SweepEta
from sweeps.spec import load_spec


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_time_left_is_elapsed_times_flops_left_over_flops_done():
    clock, seen = Clock(), []
    eta = SweepEta({"ladder L3 s0": 3.0, "ladder L2 s0": 1.0, "grid L2 s0": 1.0}, seen.append, clock=clock)
    eta.start()
    eta("sweep demo: 3 trials, 0 already finished, 3 to run; tracking sqlite:///x")
    eta("start  ladder L3 s0")
    assert eta.seconds_left() is None and seen == ["sweep demo: 3 trials, 0 already finished, 3 to run; tracking "
                                                   "sqlite:///x", "start  ladder L3 s0"]  # passed through
    clock.now = 160.0
    eta("[1/3] done     ladder L3 s0 bpb 2.8961 (60 s)")
    assert eta.seconds_left() == pytest.approx(60.0 * 2.0 / 3.0)
    assert seen[-1] == "[1/3] done     ladder L3 s0 bpb 2.8961 (60 s); elapsed 1.0 min, about 40 s left"
    clock.now = 190.0
    eta("[2/3] failed   grid L2 s0  (30 s)")  # not trained, and not to train: neither side of the ratio
    assert eta.seconds_left() == pytest.approx(90.0 * 1.0 / 3.0)  # it counted as trained: 90 · 1/4
    clock.now = 200.0
    eta("[3/3] done     ladder L2 s0 bpb 3.1 (10 s)")
    assert seen[-1] == "[3/3] done     ladder L2 s0 bpb 3.1 (10 s); elapsed 1.7 min"  # the last: nothing left


def test_trials_finished_before_this_run_are_not_left_to_train():
    """A rerun of a sweep whose 13 of 14 trials had finished said "[1/1] done ...; about 81.4 min left": the
    finished trials never end in this run, so they counted as still to train."""
    clock, seen = Clock(), []
    eta = SweepEta({"ladder L7 s0": 10.0, "ladder L6 s0": 5.0, "grid L2 s0": 1.0, "grid L2 s1": 1.0}, seen.append,
                   clock=clock)
    eta.start()
    eta.todo(["grid L2 s0", "grid L2 s1"])
    clock.now = 130.0
    eta("[1/2] done     grid L2 s0 bpb 3.1 (30 s)")
    assert eta.seconds_left() == pytest.approx(30.0)


def test_every_demo_trial_has_its_flops():
    flops = _trial_flops(load_spec("demo"))
    assert len(flops) == 14 and min(flops.values()) > 0  # six ladder rungs, the 3×3 grid on L2 (its centre is L2)
    assert max(flops, key=flops.get).startswith("ladder L7")
