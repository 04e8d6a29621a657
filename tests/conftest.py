"""Suite-wide: the collection runs longest file first (see tests/file_seconds.py for why); JAX compiles
under the suite's XLA flags (tests/xla_flags.py) in this process and every process it starts."""

from __future__ import annotations

import os
import subprocess
from collections import Counter

import pytest

from tests.file_seconds import load_file_seconds
from tests.threads import one_thread_per_process
from tests.xla_flags import with_suite_flags


def longest_file_first(items: list[pytest.Item], rootpath, file_seconds: dict[str, float]) -> list[pytest.Item]:
    """A stable sort: by the file's measured seconds, then (for files the table does not list) by its
    number of slow-marked tests; files stay contiguous and keep their own order."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    return sorted(items, key=lambda item: (-file_seconds.get(item.path.relative_to(rootpath).as_posix(), 0.0),
                                           -slow[item.path]))


# The test modules this run collected, before any deselection (tests/test_collection.py reads them).
COLLECTED_MODULES = pytest.StashKey[set]()


def pytest_itemcollected(item: pytest.Item) -> None:
    item.config.stash.setdefault(COLLECTED_MODULES, set()).add(item.path)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = longest_file_first(items, config.rootpath, load_file_seconds())


# Test processes start children with fork, not vfork. A fresh-clone run (2026-12-03) failed once with
# `OSError: [Errno 14] Bad address` from execve of sys.executable in a vfork child
# (tests/ladder/test_tracking_server.py, 4 writers started at once). A vfork child runs on its
# parent's memory, and with env=None execve reads the parent's shared `environ` while the parent's
# other threads keep running (JAX, MLflow, Ray threads live in these workers); a fork child has its
# own copy. Cost: copying the worker's page tables per child (20 children of a 2 GB process: no more wall
# time than vfork). The cause was not reproduced; this removes the mechanism suspected, not a proven one.
# (`subprocess._USE_VFORK` is the documented switch, Python 3.11+.)
subprocess._USE_VFORK = False

# Before any test imports jax (XLA reads its flags once, at backend start-up); children inherit it.
os.environ["XLA_FLAGS"] = with_suite_flags(os.environ.get("XLA_FLAGS", ""))

# One BLAS and one OpenMP thread per process (tests/threads.py says why and what it measured).
one_thread_per_process()


# Every test sees the CLI's output as a pipe does (tables 200 columns wide): pytest-xdist's workers have
# COLUMNS=80 in their environment, which rich reads as a terminal's width and wraps table cells to. A
# test of the terminal case sets COLUMNS itself.
os.environ.pop("COLUMNS", None)
