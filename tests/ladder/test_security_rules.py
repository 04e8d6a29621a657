"""Rules the whole code base keeps: YAML is only safe-loaded, and no shell command
line is ever built (no `shell=True`, `os.system`, `os.popen`), so no user input reaches a shell.

Checked on the syntax tree of every Python file of the product, not by grepping text, so a
comment or a string that mentions a call does not count and an aliased call does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("ladder", "rungs", "sweeps", "fits", "scripts", "benchmarks", "notebooks")
UNSAFE_YAML = {"load", "unsafe_load", "full_load", "load_all", "unsafe_load_all", "full_load_all"}


def _sources() -> list[Path]:
    return sorted(p for d in PRODUCT if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.py"))


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _violations(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "yaml":
            found += [f"from yaml import {a.name}" for a in node.names if a.name in UNSAFE_YAML]
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name.startswith("yaml.") and name.split(".", 1)[1] in UNSAFE_YAML:
            found.append(f"{name}() (use yaml.safe_load)")
        if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"):
            found.append(f"{name}() runs a shell")
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append(f"{name}(shell=...) runs a shell")
    return [f"{path.relative_to(root)}:{v}" for v in found]


def test_the_rules_catch_what_they_forbid(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os, subprocess, yaml\nyaml.load(open('x'))\nsubprocess.run('ls', shell=True)\n"
                   "os.system('ls')\nfrom yaml import unsafe_load\n")
    assert len(_violations(bad, root=tmp_path)) == 4


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_unsafe_yaml_and_no_shell(path):
    assert _violations(path) == []
