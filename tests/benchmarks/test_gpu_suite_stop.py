"""benchmarks/gpu_suite.py stopped while a child runs (SIGTERM, as `timeout` sends; SIGINT; an error in the
suite): the child's whole process group goes with it, none is left running under PID 1. The child here
is a real process of the suite's own `_run_child` that starts a process of its own and sleeps; the test
waits on events (the pid file, the exits), never on the speed of the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_suite

REPO = Path(__file__).resolve().parents[2]
GUARD_SECONDS = 60.0     # only stops a test that would otherwise hang; every wait ends on an event

# The child: starts a grandchild, writes both pids (atomically), sleeps far past any test.
SLEEPER = ("import os, subprocess, sys, time\n"
           "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
           "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {grandchild.pid}')\n"
           "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
           "time.sleep(600)\n")

# The suite's own main, its children's command made the sleeper.
DRIVER = ("import signal, sys\n"
          "from benchmarks import gpu_suite\n"
          "signal.signal(signal.SIGINT, signal.default_int_handler)   # even where SIGINT came in ignored\n"
          "SLEEPER, pid_file = sys.argv[1], sys.argv[2]\n"
          "gpu_suite.Child.command = lambda self, quick, limit, memory: [sys.executable, '-c', SLEEPER, pid_file]\n"
          "sys.exit(gpu_suite.main(sys.argv[3:]))\n")


def _alive(pid: int) -> bool:
    """Running (a zombie, killed and waiting for a reaper, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + GUARD_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {GUARD_SECONDS:.0f} s: {what}")
        time.sleep(0.05)


def _pids(pid_file: Path) -> list[int]:
    _wait_for(pid_file.exists, "the child to start")
    return [int(p) for p in pid_file.read_text().split()]


def _kill_left(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _start_suite(tmp_path: Path, pid_file: Path) -> subprocess.Popen:
    """The suite's own main in a process, its one child (muon) the sleeper, which writes its pids to `pid_file`."""
    return subprocess.Popen([sys.executable, "-c", DRIVER, SLEEPER, str(pid_file), "--out", str(tmp_path / "out"),
                             "--only", "muon", "--quick", "--budget-seconds", "500"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, None)])
def test_a_signal_to_the_suite_kills_its_running_child_and_the_childs_own(tmp_path, signum, code):
    pid_file = tmp_path / "pids"
    suite = _start_suite(tmp_path, pid_file)
    pids: list[int] = []
    try:
        pids = _pids(pid_file)
        assert all(_alive(pid) for pid in pids)
        suite.send_signal(signum)
        _, err = suite.communicate(timeout=GUARD_SECONDS)
        if code is not None:
            assert suite.returncode == code, err.decode(errors="replace")
        else:
            assert suite.returncode != 0
        _wait_for(lambda: not any(_alive(pid) for pid in pids), f"the child and its own process {pids} to end")
    finally:
        suite.kill()
        suite.wait()
        _kill_left(pids)
    assert not (tmp_path / "out" / "muon.json").exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_an_error_in_the_suite_while_a_child_runs_kills_the_childs_group(tmp_path, monkeypatch):
    pid_file = tmp_path / "pids"
    command = [sys.executable, "-c", SLEEPER, str(pid_file)]
    monkeypatch.setattr(gpu_suite.Child, "command", lambda self, quick, limit, memory: command)
    communicate = subprocess.Popen.communicate
    pids: list[int] = []

    def failing(self, *args, **kwargs):
        if self.args != command:
            return communicate(self, *args, **kwargs)
        pids.extend(_pids(pid_file))
        raise RuntimeError("the suite failed while its child ran")

    monkeypatch.setattr(subprocess.Popen, "communicate", failing)
    try:
        with pytest.raises(RuntimeError, match="while its child ran"):
            gpu_suite.run_suite(tmp_path / "out", budget_seconds=500.0, quick=True, only=["muon"])
        assert len(pids) == 2
        _wait_for(lambda: not any(_alive(pid) for pid in pids), f"the child and its own process {pids} to end")
    finally:
        _kill_left(pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_a_sigkill_to_the_suite_still_ends_its_running_child(tmp_path):
    """No handler sees a SIGKILL: the kernel ends the child (PR_SET_PDEATHSIG). The child's own processes are
    its to end (the suite's children start none); the sleeper's is killed here."""
    pid_file = tmp_path / "pids"
    suite = _start_suite(tmp_path, pid_file)
    pids: list[int] = []
    try:
        pids = _pids(pid_file)
        assert _alive(pids[0])
        suite.kill()
        suite.communicate(timeout=GUARD_SECONDS)
        _wait_for(lambda: not _alive(pids[0]), f"the child {pids[0]} to end with the suite")
    finally:
        suite.kill()
        suite.wait()
        _kill_left(pids)
