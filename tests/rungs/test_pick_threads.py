"""How many torch threads a job takes: the config's, said when it is more than the machine has."""

from __future__ import annotations

import logging
import os

from rungs.config import parse_config
from rungs.torch_engine import _pick_threads
from tests.rungs.train_helpers import tiny_config


def test_more_threads_than_cores_are_taken_and_said(caplog):
    cores = os.cpu_count() or 1
    with caplog.at_level(logging.WARNING, logger="rungs.torch_engine"):
        assert _pick_threads(parse_config(tiny_config(threads=cores + 3))) == cores + 3
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"threads {cores + 3} is more than this machine's {cores} cores")


def test_threads_within_the_cores_and_deterministic_runs_say_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="rungs.torch_engine"):
        assert _pick_threads(parse_config(tiny_config(threads=1))) == 1
        assert _pick_threads(parse_config(tiny_config(threads=None, deterministic=True))) == 1
    assert not caplog.records
