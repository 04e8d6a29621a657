"""`rungs.host_memory`: a process that keeps freed host memory does not fault a step's large
temporaries in again each step, whichever thread allocates them (XLA:CPU allocates a compiled step's
temporaries from an executor thread: 190.6 MB at cpu-demo L6, 46,533 page faults a step without it).

Each case runs in a fresh interpreter (the policy must be set before any thread allocates) and counts
minor page faults (ru_minflt), a count of pages first touched: no clock is read.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rungs.host_memory import ALLOCATOR_ENV

REPO = Path(__file__).resolve().parents[2]
GUARD_SECONDS = 600  # ends a hung child; never a judgement of speed
STEP_BYTES = 96 * 2**20  # above glibc's 64 MB thread-arena heap: such a request is an mmap of its own
PAGES = STEP_BYTES // 4096

# Five "steps" in a non-main thread, each allocating, touching and freeing STEP_BYTES; the faults of
# steps 2-5 (the first one populates the heap).
PROBE = textwrap.dedent(f"""
    import ctypes, ctypes.util, json, resource, sys, threading
    policy = sys.argv[1]
    applied = None
    if policy == "call":
        from rungs.host_memory import keep_freed_host_memory
        applied = keep_freed_host_memory()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    faults = []
    def steps():  # malloc itself, as XLA's allocator: numpy would ask for transparent huge pages
        for _ in range(5):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            buf = libc.malloc({STEP_BYTES})
            ctypes.memset(buf, 1, {STEP_BYTES})
            libc.free(buf)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    t = threading.Thread(target=steps)
    t.start(); t.join()
    print(json.dumps({{"applied": applied, "faults": faults[1:]}}))
""")

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's malloc")


def _python(code: str, *args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter whose environment sets no MALLOC_* variable beyond `env_extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=GUARD_SECONDS)


def _probe(policy: str, env_extra: dict[str, str] | None = None) -> dict:
    out = _python(PROBE, policy, env_extra=env_extra)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_without_the_policy_a_threads_large_temporary_is_faulted_in_every_step():
    # The failure mode the module exists for (so the tests below can fail): each step maps fresh pages.
    got = _probe("none")
    assert all(f >= 0.9 * PAGES for f in got["faults"]), got


@glibc_only
def test_keep_freed_host_memory_makes_later_steps_fault_nothing():
    got = _probe("call")
    assert got["applied"] is True
    assert all(f < 0.01 * PAGES for f in got["faults"]), got


@glibc_only
def test_the_environment_a_worker_starts_with_does_the_same():
    # What the sweep hands its Ray workers (ladder.run.orchestrate.connect_ray): set when the process starts.
    got = _probe("env", ALLOCATOR_ENV)
    assert all(f < 0.01 * PAGES for f in got["faults"]), got


@pytest.mark.parametrize("args, applied", [
    (["train", "--help"], True), (["-v", "sweep", "--help"], True), (["data", "--help"], None),
    (["plan", "--help"], None)])
def test_the_ladder_commands_that_train_apply_it_and_others_do_not(args, applied):
    # As the `ladder` console script runs: main() with no argv reads sys.argv.
    probe = textwrap.dedent("""
        import sys
        import rungs.host_memory as hm
        from ladder.cli import main
        sys.argv = ["ladder", *sys.argv[1:]]
        try:
            main()
        except SystemExit:
            pass
        print(hm._applied)
    """)
    out = _python(probe, *args)
    expected = applied if applied is None or platform.libc_ver()[0] == "glibc" else False
    assert out.stdout.strip().splitlines()[-1] == str(expected), out.stderr[-2000:]


def test_an_in_process_caller_keeps_its_allocator():
    probe = textwrap.dedent("""
        import rungs.host_memory as hm
        from ladder.cli import main
        main(["plan", "cpu-demo", "--json"])
        print(hm._applied)
    """)
    out = _python(probe)
    assert out.stdout.strip().splitlines()[-1] == "None", out.stderr[-2000:]
