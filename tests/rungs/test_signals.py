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
