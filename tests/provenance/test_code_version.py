"""The one code version (`provenance.code_version`): the package version, `+g` and HEAD's 12-hex
commit from a checkout, `.dirty` when tracked files are edited. MLflow run tags, fit results and the
golden files carry it, so its format is a contract: this reads git itself and expects the same string."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

import fits.results
import rungs.tracking
from provenance import code_version

ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def test_code_version_is_the_package_version_plus_the_checkouts_commit_and_dirty_flag():
    dirty = ".dirty" if _git("status", "--porcelain", "--untracked-files=no") else ""
    want = f"{metadata.version('scaling-ladder')}+g{_git('rev-parse', '--short=12', 'HEAD')}{dirty}"
    # The tree may change between the two reads (other work in the checkout): the commit part must match.
    got = code_version()
    assert got.removesuffix(".dirty") == want.removesuffix(".dirty"), (got, want)


def test_run_tags_and_fit_results_use_the_one_function():
    assert rungs.tracking.code_version is code_version
    assert fits.results.code_version is code_version


def test_no_other_product_module_reads_a_commit_of_its_own():
    """One definition: a second way to name the code (a `git rev-parse` elsewhere) would drift from it."""
    others = [p.relative_to(ROOT).as_posix() for package in ("ladder", "rungs", "fits", "sweeps", "benchmarks")
              for p in (ROOT / package).rglob("*.py") if "rev-parse" in p.read_text(encoding="utf-8")]
    assert others == []
