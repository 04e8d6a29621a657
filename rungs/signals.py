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


# `deferred()` blocks: a SIGTERM inside one waits for its end (a checkpoint half written by torch.save, its zip
# writer then raising over the Terminated, ended the job with exit 1 and a traceback instead of 143).
_deferring = 0
_pending = False


def _raise_terminated(signum: int, frame: object) -> None:
    global _pending
    if _deferring:
        _pending = True
        return
    raise Terminated(SIGTERM_EXIT_CODE)


@contextmanager
def deferred() -> Iterator[None]:
    """A write that must not be cut halfway: a SIGTERM within the block (under `sigterm_raises`) raises
    `Terminated` when the block ends, not inside it. Nested blocks raise at the outermost end."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring and _pending:
        _pending = False
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
