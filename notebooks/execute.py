"""Execute the analysis notebooks and store their outputs, or check that the stored outputs are current.

    .venv/bin/python notebooks/execute.py            # re-execute every notebook, store its outputs
    .venv/bin/python notebooks/execute.py --check    # exit 1 if any stored output is not what a run gives
    .venv/bin/python notebooks/execute.py 02_bpb_vs_flops.ipynb   # just those named

The notebooks run on the committed fixtures (`LADDER_NOTEBOOK_SOURCE=fixture`), so what is stored is what
anyone gets on a fresh clone, and the test suite (`tests/notebooks/test_notebooks.py`) runs each one and
compares. What is compared is what a reader reads: stdout and every result's text and HTML, with numbers
equal to a relative 1e-4 (BLAS and platform noise), memory addresses, code versions and pandas Styler ids
masked; a figure must be there, its pixels are not compared; stderr (library warnings) is not compared.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent

# Guards against a hung kernel, not speed limits: the slowest cell takes seconds on an idle 2-core box, and
# a loaded machine must not fail the suite; nbclient's own defaults (60 s to start a kernel) are in range.
CELL_GUARD_S = 3600
KERNEL_START_GUARD_S = 600
NUMBER_RTOL = 1e-4

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_VOLATILE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),                                    # memory addresses in reprs
    (re.compile(r"\d+\.\d+\.\d+\+g[0-9a-f]{12}(?:\.dirty)?"), "<code version>"),
    (re.compile(r"T_[0-9a-f]{5}"), "T_…"),                                     # pandas Styler's random ids
]


def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def client(nb: nbformat.NotebookNode, work: Path) -> NotebookClient:
    # record_timing off: no per-cell timestamps in the stored notebook
    return NotebookClient(nb, timeout=CELL_GUARD_S, startup_timeout=KERNEL_START_GUARD_S, kernel_name="python3",
                          record_timing=False, resources={"metadata": {"path": str(work)}})


def execute(path: Path, work: Path) -> nbformat.NotebookNode:
    """`path` executed top to bottom in the scratch folder `work` (files a cell writes land there), on
    the committed fixtures; raises `nbclient.exceptions.CellExecutionError` on the first failing cell."""
    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ["LADDER_NOTEBOOK_SOURCE"] = "fixture"  # committed real runs, not whatever runs/ holds
    try:
        client(nb, work).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def _mask(text: str) -> str:
    for pattern, repl in _VOLATILE:
        text = pattern.sub(repl, text)
    return text


def readable(nb: nbformat.NotebookNode) -> list[list[tuple[str, Any]]]:
    """Per code cell, what a reader reads: ("stdout", text), (mime, text) of results and displays, ("image",
    mime) for a figure, ("error", name) for an error; masked (module docstring)."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        items: list[tuple[str, Any]] = []
        for out in cell.get("outputs", []):
            if out.output_type == "stream" and out.name == "stdout":
                items.append(("stdout", _mask(out.text)))
            elif out.output_type in ("execute_result", "display_data"):
                for mime, data in sorted(out.data.items()):
                    if mime.startswith("image/"):
                        items.append(("image", mime))
                    elif mime in ("text/plain", "text/html", "text/markdown"):
                        items.append((mime, _mask(data if isinstance(data, str) else "".join(data))))
            elif out.output_type == "error":
                items.append(("error", out.ename))
        cells.append(items)
    return cells


def _same_text(a: str, b: str) -> bool:
    """Equal but for numbers, which are equal to NUMBER_RTOL."""
    if _NUMBER.sub("#", a) != _NUMBER.sub("#", b):
        return False
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b)):
        u, v = float(x), float(y)
        if abs(u - v) > NUMBER_RTOL * max(abs(u), abs(v)) and abs(u - v) > 1e-12:
            return False
    return True


def differences(stored: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> list[str]:
    """Where a fresh run's readable outputs differ from the stored ones (empty: the stored are current)."""
    out = []
    old, new = readable(stored), readable(fresh)
    if len(old) != len(new):
        return [f"{len(old)} code cells stored, {len(new)} run"]
    for i, (a, b) in enumerate(zip(old, new), start=1):
        if [k for k, _ in a] != [k for k, _ in b]:
            out.append(f"code cell {i}: outputs {[k for k, _ in a]} stored, {[k for k, _ in b]} now")
            continue
        for (kind, x), (_, y) in zip(a, b):
            if kind in ("image", "error") and x == y:
                continue
            if not _same_text(x, y):
                out.append(f"code cell {i}: {kind} differs:\n--- stored\n{x[:2000]}\n--- now\n{y[:2000]}")
    return out


def run_all(check: bool, names: list[str] | None = None) -> int:
    stale = 0
    paths = [p for p in notebook_paths() if not names or p.name in names]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "notebooks"
        shutil.copytree(NOTEBOOKS, work, ignore=shutil.ignore_patterns("*.png", ".ipynb_checkpoints", "*.py"))
        for path in paths:
            fresh = execute(path, work)
            if check:
                diff = differences(nbformat.read(path, as_version=4), fresh)
                stale += bool(diff)
                print(f"{path.name}: " + ("stored outputs are current" if not diff else "\n".join(diff)))
            else:
                nbformat.write(fresh, path)
                print(f"{path.name}: executed, outputs stored")
    return 1 if stale else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the stored outputs instead of storing")
    parser.add_argument("names", nargs="*", help="notebook file names (default: every notebook)")
    args = parser.parse_args()
    sys.exit(run_all(args.check, args.names))
