"""The rank harness's fork server: what it imports once must leave it with one thread, since every rank is a
fork of it (a fork copies no other thread, and a lock one held stays held in the child)."""

from __future__ import annotations

import subprocess
import sys

from tests.rungs.train_helpers import REPO


def test_the_fork_servers_preload_starts_no_thread():
    code = ("import importlib, threading; from tests.rungs.parallel.spawn import _PRELOAD; "
            "[importlib.import_module(m) for m in _PRELOAD]; "
            "print(threading.active_count(), [t.name for t in threading.enumerate()])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "1", out.stdout
