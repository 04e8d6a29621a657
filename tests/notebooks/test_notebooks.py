"""Every analysis notebook runs top to bottom; a cell that errors fails the suite."""

from __future__ import annotations

import io
import os
import shutil
import tokenize
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


# Guards against a hung kernel, not speed limits: the slowest cell takes seconds on the idle 2-core box,
# and a loaded machine must not fail the suite (#24). nbclient's own defaults (60 s to start a kernel)
# are in that range on a machine shared with other work.
CELL_GUARD_S = 3600
KERNEL_START_GUARD_S = 600


def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def notebook_client(nb: nbformat.NotebookNode, work: Path) -> NotebookClient:
    return NotebookClient(nb, timeout=CELL_GUARD_S, startup_timeout=KERNEL_START_GUARD_S, kernel_name="python3",
                          resources={"metadata": {"path": str(work)}})


def test_notebook_limits_are_guards_far_above_any_run(tmp_path):
    client = notebook_client(nbformat.v4.new_notebook(), tmp_path)
    assert client.timeout >= 3600 and client.startup_timeout >= 600


def test_notebooks_are_committed_without_outputs():
    for path in notebook_paths():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.get("outputs") and cell.get("execution_count") is None, f"{path.name}: strip outputs"



def test_notebooks_take_the_reports_laws_from_the_recipe_not_their_own_numbers():
    """The report's LR/WD laws are written once, as `HparamLaws`' defaults (#18): a notebook that
    restates their coefficients keeps the old numbers when the defaults change."""
    from ladder.plan.recipe import HparamLaws

    coefficients = {abs(f.default) for f in HparamLaws.model_fields.values()
                    if isinstance(f.default, float) and abs(f.default) != 1.0}
    assert len(coefficients) == 4                       # 17.04, 1.51, 0.175, 0.573
    for path in notebook_paths():
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            tokens = tokenize.generate_tokens(io.StringIO(cell.source).readline)
            numbers = {abs(float(t.string)) for t in tokens if t.type == tokenize.NUMBER and "j" not in t.string}
            assert not numbers & coefficients, f"{path.name} restates the report's laws: {sorted(numbers & coefficients)}"


@pytest.mark.slow
@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.name)
def test_notebook_executes(path: Path, tmp_path: Path):
    # Run in a scratch copy of notebooks/ so figures written by cells do not dirty the tree.
    work = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, work, ignore=shutil.ignore_patterns("*.png", ".ipynb_checkpoints"))
    nb = nbformat.read(work / path.name, as_version=4)
    env_backup = dict(os.environ)
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ["LADDER_NOTEBOOK_SOURCE"] = "fixture"  # committed real runs, not whatever runs/ holds
    try:
        notebook_client(nb, work).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
