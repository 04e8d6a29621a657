"""Paths a record keeps to find a file again after its project folder moved.

A prepared corpus (`meta.json`, with the relative path in its `progress.json`: `meta.json` is the same bytes
wherever the corpus is prepared), a curation directory (`curation.json`) and a mixed arm (`arm.json`) record
the manifest (or curation) they came from by its absolute path, which names the file wherever the record is
read from, and by its path relative to the record's own directory, which still names it after the folder
holding both was moved or copied as a whole (`mv project elsewhere`). A reader takes the relative path where
a file is there (a project copied as a whole reads its own copy, not the original's), else the absolute one (a
record moved on its own); a record written before the relative path was kept has only the absolute one.
"""

from __future__ import annotations

import os
from pathlib import Path

MANIFEST_RELATIVE = "manifest_relative"  # the field a record keeps the manifest's relative path in


def relative_to_dir(target: str | Path, directory: str | Path) -> str:
    """`target`'s path from `directory` (both made absolute first), `..` where needed."""
    return os.path.relpath(Path(target).resolve(), Path(directory).resolve())


def located(recorded: str | Path, relative: str | None, directory: str | Path) -> Path:
    """`relative` (from `directory`) where a file or folder is there; else the recorded absolute path (for the
    caller to report if it is missing too)."""
    if relative:
        beside = (Path(directory) / relative).resolve()
        if beside.exists():
            return beside
    return Path(recorded)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name the same file (compared resolved; a missing one is compared as written)."""
    return Path(a).resolve() == Path(b).resolve()
