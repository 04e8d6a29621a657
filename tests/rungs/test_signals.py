"""rungs.signals: SIGTERM raises `Terminated` (exit 143) under `sigterm_raises`, and waits for the end of a
`deferred()` block: a checkpoint half written by torch.save, whose zip writer then raised over the Terminated,
ended the job with exit 1 and a traceback."""

from __future__ import annotations

import os
import signal

import pytest

from rungs.signals import SIGTERM_EXIT_CODE, Terminated, deferred, sigterm_raises


def test_a_sigterm_inside_a_deferred_block_raises_at_its_end_and_not_before():
    reached = []
    with sigterm_raises():
        with pytest.raises(Terminated) as stop:
            with deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                reached.append("after the signal")
                with deferred():  # nested: the outermost end raises
                    reached.append("inner")
                reached.append("end of the write")
        assert stop.value.code == SIGTERM_EXIT_CODE
        with deferred():  # nothing pending after it was raised
            reached.append("a later write")
    assert reached == ["after the signal", "inner", "end of the write", "a later write"]


def test_without_a_deferred_block_a_sigterm_raises_where_it_lands():
    with sigterm_raises():
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000_000):  # the handler runs at the next bytecode boundary
                pass


def test_a_sigterm_inside_a_tracker_write_lets_it_finish_and_the_run_can_be_marked_failed(tmp_path):
    """A SIGTERM landing inside an MLflow write to SQLite cut the transaction with its write lock held: marking
    the run FAILED then hit "database is locked" and the run stayed RUNNING (seen in the suite). Every tracker
    write is deferred: the batch lands, Terminated follows, and the crash path closes the run."""
    from mlflow import MlflowClient

    from rungs.tracking import Tracker

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(store, "signals", tmp_path, run_name="r", tags={}, params={"a": 1})
    real = tracker.client.log_batch

    def log_batch_interrupted(*args, **kwargs):  # the signal arrives while the write runs
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # bytecode boundaries at which an undeferred handler would raise
            pass
        return real(*args, **kwargs)

    tracker.client.log_batch = log_batch_interrupted
    with sigterm_raises():
        with pytest.raises(Terminated):
            tracker.log_metrics({"loss": 2.5}, step=7, flush=True)
    tracker.client.log_batch = real
    tracker.finish("FAILED", failing=True)
    run = MlflowClient(store).get_run(tracker.run_id)
    assert run.info.status == "FAILED" and run.data.metrics["loss"] == 2.5
