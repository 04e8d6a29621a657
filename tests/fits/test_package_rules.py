"""The folder rules: `fits` imports nothing of ladder/rungs/sweeps, and nothing reads ../shared."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fits_imports_no_other_project_package():
    modules = sorted(p.stem for p in (ROOT / "fits").glob("*.py") if p.stem != "__init__")
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module('fits.' + m)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ladder', 'rungs', 'sweeps')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_fits_and_its_tests_do_not_read_the_shared_folder():
    for path in [*(ROOT / "fits").rglob("*.py"), *(ROOT / "tests" / "fits").glob("*.py")]:
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        assert "../shared" not in text and "/work/shared" not in text, path
