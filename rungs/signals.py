"""SIGTERM as an exception, so a preempted job closes its MLflow run as Ctrl-C does.

Kubernetes, Slurm and Ray stop a process with SIGTERM. Python's default for it ends the process at once:
no `except`/`finally` runs, so the job's MLflow run stayed RUNNING with no end time until the job was
resumed. Inside `sigterm_raises()` a SIGTERM raises `Terminated` (a `SystemExit` with the shell's code for
the signal, 143) at the point the main thread is running, the job's crash path marks the run FAILED, and
the process exits 143 as before. Only the main thread can install a handler: elsewhere (a Ray Tune trial's
thread) the context does nothing and the process keeps its own handling. A multi-rank job keeps the default:
a rank blocked in a collective would run the handler only when the collective returns (gloo's timeout is
minutes), where the default ends it at once and the launcher stops the others.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


class Terminated(SystemExit):
    """The process received SIGTERM."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(SIGTERM_EXIT_CODE)


@contextmanager
def sigterm_raises(enabled: bool = True) -> Iterator[None]:
    """Within the block (main thread only, and `enabled`), SIGTERM raises `Terminated`; the previous handler is
    restored after."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
