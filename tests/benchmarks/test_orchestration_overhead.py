"""The orchestration benchmark's overhead per trial: the Tune experiment's wall time less the trials'
train() calls, over trials that all finished (a failed one's time would be counted as overhead)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.orchestration import finished_rows, overhead_per_trial


def row(label: str, state: str = "finished", train: float | None = 10.0) -> SimpleNamespace:
    return SimpleNamespace(label=label, state=state, error=None if state == "finished" else "boom",
                           wall_seconds=None if train is None else train + 1.0, train_call_seconds=train)


def test_the_overhead_is_the_tune_time_less_the_train_calls_per_trial():
    rows = finished_rows([row("a", train=10.0), row("b", train=12.0)])
    assert overhead_per_trial(rows, tune_seconds=26.0) == pytest.approx(2.0)


@pytest.mark.parametrize("bad", [row("b", state="failed", train=None), row("b", state="finished", train=None)])
def test_a_trial_that_did_not_finish_with_its_timings_is_refused_not_counted_as_overhead(bad):
    with pytest.raises(RuntimeError, match="finished trials only") as err:
        finished_rows([row("a"), bad])
    assert "'b'" in str(err.value)
    with pytest.raises(RuntimeError, match="no trial ran"):
        finished_rows([])
