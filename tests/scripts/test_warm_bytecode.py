"""The install's bytecode warm-up (scripts/warm_bytecode.py, run by `make` after `pip install --no-compile`)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.scripts.helpers import load_script

warm = load_script("warm_bytecode")


@pytest.mark.parametrize("name", warm.RUNTIME_MODULES + warm.DEV_MODULES)
def test_every_module_of_the_warm_up_list_still_resolves(name):
    """A renamed module would only be skipped with a line in the install log; here it fails."""
    assert importlib.util.find_spec(name) is not None, name


def test_it_writes_the_bytecode_of_what_it_imports_and_reports_what_it_skips(tmp_path, monkeypatch, capsys):
    package = tmp_path / "warm_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from warm_probe_pkg import inner\n")
    (package / "inner.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(warm, "RUNTIME_MODULES", ("warm_probe_pkg", "warm_probe_missing_module"))
    monkeypatch.setattr(warm, "DEV_MODULES", ())
    assert warm.main() == 0
    compiled = {p.name.split(".")[0] for p in (package / "__pycache__").glob("*.pyc")}
    assert compiled == {"__init__", "inner"}  # the import's own imports too
    err = capsys.readouterr().err
    assert "skipped warm_probe_missing_module (ModuleNotFoundError" in err and "of 1 modules" in err


def test_with_bytecode_writing_off_it_says_so_and_fails(monkeypatch, capsys):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(warm, "RUNTIME_MODULES", ("json",))
    assert warm.main() == 1
    assert "PYTHONDONTWRITEBYTECODE" in capsys.readouterr().err
