"""Compile the bytecode of what the platform's processes import, once, right after the install.

`make` installs with `pip install --no-compile`: pip otherwise byte-compiles every file of every
installed package (torch, jax, ray, mlflow, sympy, ...: 66 s of the 103 s install on the idle 2-core
machine, measured 2026-12-03), most of which no job ever imports. Importing the runtime here writes
the `.pyc` files of the modules actually used (about 30 s of CPU, in as many processes as there are
cores: one per group of libraries below), so later processes load them
whatever their environment says: with PYTHONDONTWRITEBYTECODE set (it is on these machines) a
process would otherwise compile every module it imports, every time. A module imported by none of
these (a test-only library, a rarely used submodule) is compiled by the first process that imports
it with bytecode writing on, as Python does by default.

Run as `env -u PYTHONDONTWRITEBYTECODE .venv/bin/python scripts/warm_bytecode.py`. A module that
fails to import is reported and skipped (this is a warm-up, not a check of the install: the tests
and the jobs import these modules for real; `tests/scripts/test_warm_bytecode.py` checks every name still
resolves); the exit status is 1 only when bytecode writing is off or none of them imports.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

# What a trial, a sweep driver, the tracking server, a fit and the CLI import (and their libraries),
# in groups that share little, each imported by one process (largest first).
RUNTIME_GROUPS: tuple[tuple[str, ...], ...] = (
    ("torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor", "ray.train.torch",
     "rungs.train", "ladder.cli.train"),
    ("mlflow", "mlflow.cli", "mlflow.server.handlers", "mlflow.server.fastapi_app", "uvicorn",
     "ladder.run.tracking_server"),
    ("ray", "ray.tune", "ray.train", "ladder.run.orchestrate", "ladder.cli.sweep", "ladder.cli.nightly",
     "ladder.cli.demo"),
    ("jax", "jax.numpy", "optax", "orbax.checkpoint", "rungs.jaxjob.engine"),
    ("numpy", "scipy.optimize", "scipy.stats", "statsmodels.api", "pandas", "pyarrow.parquet",
     "matplotlib.pyplot", "tokenizers", "rich.progress", "pydantic", "yaml",
     "ladder.cli", "ladder.cli.fit", "fits", "sweeps.spec"),
)
# The `dev` extra `make` installs: each test worker and notebook kernel imports these.
DEV_GROUPS: tuple[tuple[str, ...], ...] = (("pytest", "xdist", "hypothesis", "nbclient", "nbformat", "ipykernel.kernelapp"),)


def all_modules() -> tuple[str, ...]:
    return tuple(name for group in RUNTIME_GROUPS + DEV_GROUPS for name in group)


def import_group(names: tuple[str, ...]) -> list[str]:
    """Import each module (writing its bytecode and its imports'); what failed, with why."""
    warnings.simplefilter("ignore")  # deprecations of the libraries' own imports: not this script's to report
    skipped = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported by main; a warm-up must not fail an install
            skipped.append(f"{name} ({type(exc).__name__}: {exc})")
    return skipped


def main() -> int:
    if sys.dont_write_bytecode:
        print("warm_bytecode: bytecode writing is off in this process (PYTHONDONTWRITEBYTECODE); "
              "run it under `env -u PYTHONDONTWRITEBYTECODE`", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    groups = RUNTIME_GROUPS + DEV_GROUPS
    # Fresh interpreters (spawn): each compiles what its group imports, as a job's process would.
    with ProcessPoolExecutor(max_workers=max(1, min(os.cpu_count() or 1, len(groups))),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        skipped = [line for lines in pool.map(import_group, groups) for line in lines]
    for line in skipped:
        print(f"warm_bytecode: skipped {line}", file=sys.stderr)
    total = len(all_modules())
    print(f"warm_bytecode: compiled the imports of {total - len(skipped)} modules in {len(groups)} groups "
          f"in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0 if len(skipped) < total else 1


if __name__ == "__main__":
    sys.exit(main())
