"""The suite's thread policy: one BLAS and one OpenMP thread in this process and in every child (or the
counts the caller set in the environment), and a count the caller set is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from threadpoolctl import threadpool_info

from tests.threads import THREAD_VARIABLES, one_thread_per_process

_POOLS = "import json, numpy, torch; from threadpoolctl import threadpool_info; " \
         "print(json.dumps([[p['user_api'], p['num_threads']] for p in threadpool_info()] + [['torch', torch.get_num_threads()]]))"


def _expected(api: str) -> int:
    return int(os.environ["OPENBLAS_NUM_THREADS" if api == "blas" else "OMP_NUM_THREADS"])


def test_this_process_and_a_child_run_the_suites_thread_counts():
    import numpy  # noqa: F401  (its OpenBLAS is loaded)
    import torch

    here = [[p["user_api"], p["num_threads"]] for p in threadpool_info()] + [["torch", torch.get_num_threads()]]
    child = json.loads(subprocess.run([sys.executable, "-c", _POOLS], capture_output=True, text=True,
                                      check=True).stdout)
    for pools in (here, child):
        assert {api for api, _ in pools} >= {"blas", "openmp", "torch"}
        assert all(n == _expected(api) for api, n in pools), pools


def test_a_count_the_caller_set_is_kept(monkeypatch):
    import torch  # noqa: F401  (its libgomp is loaded, so the OpenMP check below has a pool to judge)

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    for name in THREAD_VARIABLES[1:]:
        monkeypatch.delenv(name, raising=False)
    try:
        one_thread_per_process()
        assert os.environ["OMP_NUM_THREADS"] == "2"
        assert all(os.environ[name] == "1" for name in THREAD_VARIABLES[1:])
        # torch's libgomp, loaded above: another OpenMP runtime an earlier test of this worker loaded (the suite
        # loads several, e.g. scikit-learn's and faiss's) may keep the count it had (seen once in a whole run)
        pools = threadpool_info()
        assert [p["num_threads"] for p in pools if p["user_api"] == "openmp" and "torch" in p["filepath"]] == [2], pools
    finally:
        monkeypatch.undo()
        one_thread_per_process()  # this worker back to the suite's counts for the tests after it
