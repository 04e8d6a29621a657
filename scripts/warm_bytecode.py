"""Compile the bytecode of what the platform's processes import, once, right after the install.

`make` installs with `pip install --no-compile`: pip otherwise byte-compiles every file of every
installed package (torch, jax, ray, mlflow, sympy, ...: 66 s of the 103 s install on the idle 2-core
machine, measured 2026-12-03), most of which no job ever imports. Importing the runtime here writes
the `.pyc` files of the modules actually used (about 13 s of CPU), so later processes load them
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
import sys
import time
import warnings

# What a trial, a sweep driver, the tracking server, a fit and the CLI import (and their libraries).
RUNTIME_MODULES = (
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.tensor",
    "jax", "jax.numpy", "optax", "orbax.checkpoint",
    "ray", "ray.tune", "ray.train", "ray.train.torch",
    "mlflow", "mlflow.cli", "mlflow.server.handlers", "mlflow.server.fastapi_app", "uvicorn",
    "numpy", "scipy.optimize", "scipy.stats", "statsmodels.api", "pandas", "pyarrow.parquet",
    "matplotlib.pyplot", "tokenizers", "rich.progress", "pydantic", "yaml",
    "ladder.cli", "ladder.cli.sweep", "ladder.cli.train", "ladder.cli.fit", "ladder.cli.nightly", "ladder.cli.demo",
    "ladder.run.orchestrate", "ladder.run.tracking_server", "rungs.train", "rungs.jaxjob.engine", "fits", "sweeps.spec",
)
# The `dev` extra `make` installs: each test worker and notebook kernel imports these.
DEV_MODULES = ("pytest", "xdist", "hypothesis", "nbclient", "nbformat", "ipykernel.kernelapp")


def main() -> int:
    if sys.dont_write_bytecode:
        print("warm_bytecode: bytecode writing is off in this process (PYTHONDONTWRITEBYTECODE); "
              "run it under `env -u PYTHONDONTWRITEBYTECODE`", file=sys.stderr)
        return 1
    warnings.simplefilter("ignore")  # deprecations of the libraries' own imports: not this script's to report
    t0 = time.monotonic()
    skipped = []
    modules = RUNTIME_MODULES + DEV_MODULES
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported below; a warm-up must not fail an install
            skipped.append(f"{name} ({type(exc).__name__}: {exc})")
    for line in skipped:
        print(f"warm_bytecode: skipped {line}", file=sys.stderr)
    print(f"warm_bytecode: compiled the imports of {len(modules) - len(skipped)} modules "
          f"in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0 if len(skipped) < len(modules) else 1


if __name__ == "__main__":
    sys.exit(main())
