"""Which code produced a result: the one `code_version()` that fit results, MLflow run tags, the
golden files and the nightly report all carry.

It lives in its own top-level package, importing nothing of the project, because both `rungs` (run
tags) and `fits` (fit results) need it and neither may import the other (docs/layout.md).
"""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The one code version (fit results, MLflow run tags, nightly goldens): the package version, plus
    `+g<12-hex commit>` when this code runs from a git checkout, plus `.dirty` when tracked files
    have local edits (PEP 440 local-version form, e.g. `0.1.0+g3e8d795a1b2c.dirty`). Read once per
    process."""
    try:
        version = metadata.version("scaling-ladder")
    except metadata.PackageNotFoundError:
        version = "unknown"
    root = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=5, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    if not commit:
        return version
    return f"{version}+g{commit}" + (".dirty" if status else "")
