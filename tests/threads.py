"""One BLAS thread and one OpenMP thread in every process of the suite.

The suite runs two pytest workers on two cores, and each worker starts ranks, JAX subprocesses, CLI
runs and Ray actors. OpenBLAS and libgomp start a thread per core by default and spin-wait between
calls; the tests' linear algebra is tiny (5-parameter fits, 64-wide models), so a second thread buys
nothing and its spinning takes a core the other worker needs. Measured on the 2-core dev machine
(idle, 2026-12-06): tests/fits/test_power_law_starts.py took 19.6 s of wall clock and 37.6 machine
CPU-seconds with the default two BLAS threads, 19.2 s and 19.3 CPU-seconds with one.

A job that asks for threads still gets them (`torch.set_num_threads(cfg.threads)` in the engines, and
the benchmarks set their own); a value already in the environment is kept, so
`OMP_NUM_THREADS=2 make test` runs the suite with two. XLA's CPU thread pool is not an OpenMP pool
and is left as it is.
"""

from __future__ import annotations

import os

from threadpoolctl import threadpool_limits

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def one_thread_per_process() -> None:
    """Children inherit one thread through the environment (OpenBLAS and libgomp read it when they
    load); the libraries this process has loaded already are limited in place."""
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, "1")
    threadpool_limits(limits=int(os.environ["OMP_NUM_THREADS"]), user_api="openmp")
    threadpool_limits(limits=int(os.environ["OPENBLAS_NUM_THREADS"]), user_api="blas")
