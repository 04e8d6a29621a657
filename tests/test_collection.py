"""Every test module under tests/ is collected by a plain `pytest` run (what `make test` runs).

pytest skips folders named in its `norecursedirs` (by default `build`, `dist`, `venv`, `node_modules`, dot
folders and a few more) when it walks from `testpaths`, while it collects them when named directly: the
distributed tests once lived in tests/rungs/dist/ and ran alone but never in the suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_module_is_collected_by_the_suite():
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    collected = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    # A module may hold no test function (a helper named test_*.py would be a mistake too): every file counts.
    missing = sorted(on_disk - collected)
    assert not missing, f"not collected by the suite: {missing}"
