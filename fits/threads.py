"""Single-threaded BLAS around the many tiny linear-algebra calls of a fit.

L-BFGS-B on 5 parameters, or a batch of 5×5 solves, calls BLAS on vectors of a few hundred
numbers; a multi-threaded OpenBLAS then spends its time waking and synchronising threads, and on
a loaded 2-core machine one Chinchilla grid fit went from 1 s to 32 s (measured). Fits run their
optimiser loops inside `one_blas_thread()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from threadpoolctl import threadpool_limits


@contextmanager
def one_blas_thread() -> Iterator[None]:
    with threadpool_limits(limits=1, user_api="blas"):
        yield
