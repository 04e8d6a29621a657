"""Keep a training process's freed host memory for reuse, so a step does not fault its temporaries in
again every step (glibc's malloc only; elsewhere a no-op).

Why: XLA:CPU allocates a compiled step's temporaries as one buffer per execution (190.6 MB at
cpu-demo L6), from one of its executor threads. glibc serves a non-main thread from a thread arena
whose heaps are at most 64 MB, so a request that large is always a fresh mmap, returned with munmap
when the step ends: the next step touches 46,500 new zeroed pages (measured with strace and
ru_minflt: 46,533 minor faults and 0.12 s of system time in a 0.51 s JAX step, one thread). PyTorch's
step faulted 5,134 pages (its large activations are mmap'd from the main arena above the dynamic
mmap threshold). With every thread on the main arena, no mmap for allocations and freed memory kept
at the top of the heap, both steps fault nothing: JAX 0.487-0.518 -> 0.402-0.440 s a step, PyTorch
0.389-0.418 -> 0.412-0.428 s, within its spread (`python -m benchmarks.jax_step`, which runs both
engines this way and reports the faults; docs/performance/jax.md).

The cost: a process keeps its high-water mark of freed heap (up to 2 GiB at the top of the heap)
instead of returning it to the system, as the caching allocators of torch (CUDA) and XLA (GPU,
BFC) do with device memory. GPU jobs' host temporaries are small; this matters for the CPU jobs.

How: glibc reads `MALLOC_ARENA_MAX`, `MALLOC_MMAP_MAX_` and `MALLOC_TRIM_THRESHOLD_` when a process
starts (`ALLOCATOR_ENV`: what the sweep passes to its Ray workers), and `mallopt` sets the same at run
time (`keep_freed_host_memory`), which holds for threads that have not allocated yet: call it before
jax, torch or numpy start their threads (the `ladder` commands that train do, first thing: `train`,
`sweep`, `demo`, `nightly`). Not `ladder data`: one arena for every thread would serialise the
tokenizer's parallel allocations.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["ALLOCATOR_ENV", "TRIM_THRESHOLD_BYTES", "keep_freed_host_memory"]

TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt takes a C int: keep up to 2 GiB free at the heap's top

ALLOCATOR_ENV = {
    "MALLOC_ARENA_MAX": "1",                          # every thread allocates from the main arena (sbrk heap)
    "MALLOC_MMAP_MAX_": "0",                          # no allocation is an mmap of its own
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES),  # freed memory stays for the next step
}

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_applied: bool | None = None


def keep_freed_host_memory() -> bool:
    """Set `ALLOCATOR_ENV`'s policy in this process with mallopt; True when glibc accepted it (or the
    environment already set it when the process started). Idempotent. Threads that allocated before
    this call keep their own arenas, so call it before jax, torch or numpy start threads; the
    `MALLOC_*` environment variables are the way for a process started by someone else."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("MALLOC_ARENA_MAX") == ALLOCATOR_ENV["MALLOC_ARENA_MAX"] \
            and os.environ.get("MALLOC_MMAP_MAX_") == ALLOCATOR_ENV["MALLOC_MMAP_MAX_"]:
        _applied = True
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = [mallopt(_M_ARENA_MAX, 1), mallopt(_M_MMAP_MAX, 0), mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)]
    _applied = all(r == 1 for r in ok)
    return _applied
