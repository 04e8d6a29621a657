"""The install's bytecode warm-up (scripts/warm_bytecode.py, run by `make` after `pip install --no-compile`)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from tests.scripts.helpers import ROOT

# Imported by name (scripts/ on the path), not loaded from its file: the script's worker processes
# are spawned and find `import_group` by its module's name.
SCRIPTS = str(ROOT / "scripts")
sys.path.insert(0, SCRIPTS)
try:
    warm = importlib.import_module("warm_bytecode")
finally:
    sys.path.remove(SCRIPTS)


@pytest.mark.parametrize("name", warm.all_modules())
def test_every_module_of_the_warm_up_list_still_resolves(name):
    """A renamed module would only be skipped with a line in the install log; here it fails."""
    assert importlib.util.find_spec(name) is not None, name


def test_it_writes_the_bytecode_of_what_it_imports_and_reports_what_it_skips(tmp_path, monkeypatch, capsys):
    package = tmp_path / "warm_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from warm_probe_pkg import inner\n")
    (package / "inner.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(SCRIPTS)  # the spawned workers import the script by name
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(warm, "RUNTIME_GROUPS", (("warm_probe_pkg",), ("warm_probe_missing_module",)))
    monkeypatch.setattr(warm, "DEV_GROUPS", ())
    assert warm.main() == 0
    compiled = {p.name.split(".")[0] for p in (package / "__pycache__").glob("*.pyc")}
    assert compiled == {"__init__", "inner"}  # the import's own imports too
    err = capsys.readouterr().err
    assert "skipped warm_probe_missing_module (ModuleNotFoundError" in err and "of 1 modules" in err


def test_with_bytecode_writing_off_it_says_so_and_fails(monkeypatch, capsys):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(warm, "RUNTIME_GROUPS", (("json",),))
    assert warm.main() == 1
    assert "PYTHONDONTWRITEBYTECODE" in capsys.readouterr().err
