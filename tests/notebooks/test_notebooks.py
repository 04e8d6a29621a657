"""The analysis notebooks are stored executed, with their figures inline, and what is stored is what a run
gives: each one runs top to bottom (a cell that errors fails the suite) and its readable outputs are
compared with the stored ones (`notebooks/execute.py`; refresh with `.venv/bin/python notebooks/execute.py`)."""

from __future__ import annotations

import importlib.util
import io
import shutil
import tokenize
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
_spec = importlib.util.spec_from_file_location("notebooks_execute", NOTEBOOKS / "execute.py")
execute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute)


def code_cells(path: Path) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_notebook_limits_are_guards_far_above_any_run(tmp_path):
    client = execute.client(nbformat.v4.new_notebook(), tmp_path)
    assert client.timeout >= 3600 and client.startup_timeout >= 600


def test_notebooks_are_stored_executed_in_order_with_their_figures_inline():
    assert [p.name[:2] for p in execute.notebook_paths()] == ["01", "02", "03", "04", "05"]
    for path in execute.notebook_paths():
        cells = code_cells(path)
        assert [c.execution_count for c in cells] == list(range(1, len(cells) + 1)), f"{path.name}: run it whole"
        outputs = [o for c in cells for o in c.outputs]
        assert not any(o.output_type == "error" for o in outputs), path.name
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name}: no figure shown"
        assert all(not c.get("metadata", {}).get("execution") for c in cells), f"{path.name}: timings stored"
        source = "\n".join(c.source for c in cells)
        assert "%matplotlib inline" in source and "savefig" not in source and 'use("Agg")' not in source


def test_the_comparison_reads_what_a_reader_reads():
    def nb(text: str, html: str, image: bool = True, stderr: str = "") -> nbformat.NotebookNode:
        outputs = [nbformat.v4.new_output("stream", name="stdout", text=text),
                   nbformat.v4.new_output("stream", name="stderr", text=stderr),
                   nbformat.v4.new_output("execute_result", data={"text/plain": "table", "text/html": html},
                                          execution_count=1)]
        if image:
            outputs.append(nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "fig"}))
        return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=outputs)])

    stored = nb("alpha 0.092021 at <obj at 0x7f3a>, code 0.1.0+g0123456789ab", '<table id="T_1a2b3">1.5</table>')
    same = nb("alpha 0.0920211 at <obj at 0x55aa>, code 0.1.0+gba9876543210.dirty", '<table id="T_ffee0">1.5</table>',
              stderr="a library warning")
    assert execute.differences(stored, same) == []
    assert "stdout differs" in execute.differences(stored, nb("alpha 0.0931 at <obj at 0x7f3a>, code 0.1.0+g0123456789ab",
                                                              '<table id="T_1a2b3">1.5</table>'))[0]
    assert "text/html differs" in execute.differences(stored, nb(stored.cells[0].outputs[0].text, "<table>1.6</table>"))[0]
    assert "outputs" in execute.differences(stored, nb(stored.cells[0].outputs[0].text,
                                                       '<table id="T_1a2b3">1.5</table>', image=False))[0]


def test_notebooks_take_the_reports_laws_from_the_recipe_not_their_own_numbers():
    """The report's LR/WD laws are written once, as `HparamLaws`' defaults: a notebook that restates their
    coefficients keeps the old numbers when the defaults change."""
    from ladder.plan.recipe import HparamLaws

    coefficients = {abs(f.default) for f in HparamLaws.model_fields.values()
                    if isinstance(f.default, float) and abs(f.default) != 1.0}
    assert len(coefficients) == 4                       # 17.04, 1.51, 0.175, 0.573
    for path in execute.notebook_paths():
        for cell in code_cells(path):
            tokens = tokenize.generate_tokens(io.StringIO(cell.source).readline)
            numbers = {abs(float(t.string)) for t in tokens if t.type == tokenize.NUMBER and "j" not in t.string}
            assert not numbers & coefficients, f"{path.name} restates the report's laws: {sorted(numbers & coefficients)}"


@pytest.mark.slow
@pytest.mark.parametrize("path", execute.notebook_paths(), ids=lambda p: p.name)
def test_notebook_executes_and_its_stored_outputs_are_current(path: Path, tmp_path: Path):
    # Run in a scratch copy of notebooks/ so files written by cells do not dirty the tree.
    work = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, work, ignore=shutil.ignore_patterns("*.png", ".ipynb_checkpoints", "*.py"))
    fresh = execute.execute(work / path.name, work)
    diff = execute.differences(nbformat.read(path, as_version=4), fresh)
    assert not diff, (f"{path.name}: the stored outputs are not what a run gives; refresh them with "
                      f"`.venv/bin/python notebooks/execute.py {path.name}`:\n" + "\n".join(diff))
