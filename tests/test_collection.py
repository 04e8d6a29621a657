"""Every test module under tests/ is collected by a plain `pytest` run (what `make test` runs).

pytest skips folders named in its `norecursedirs` (by default `build`, `dist`, `venv`, `node_modules`, dot
folders and a few more) when it walks from `testpaths`, while it collects them when named directly: the
distributed tests once lived in tests/rungs/dist/ and ran alone but never in the suite.

When this run is itself the whole suite (no paths given, or `tests/`), the modules it collected are the
answer (tests/conftest.py records them as they are collected, before any `-m` or `-k` deselects); a run of
some files collects the whole suite again in a subprocess, as a plain `pytest` would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import COLLECTED_MODULES

ROOT = Path(__file__).resolve().parents[1]


def _whole_suite(config: pytest.Config) -> bool:
    paths = {(config.invocation_params.dir / a.split("::")[0]).resolve() for a in config.args}
    return paths <= {ROOT, ROOT / "tests"}


def collected_by_a_plain_run(config: pytest.Config) -> set[str]:
    if _whole_suite(config):
        return {p.relative_to(ROOT).as_posix() for p in config.stash[COLLECTED_MODULES]}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    return {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}


def test_every_test_module_is_collected_by_the_suite(request):
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    # A module may hold no test function (a helper named test_*.py would be a mistake too): every file counts.
    missing = sorted(on_disk - collected_by_a_plain_run(request.config))
    assert not missing, f"not collected by the suite: {missing}"
