"""The layout's rules that import-linter cannot state: no module imports a private name from another
top-level package (within one package, a leading underscore means "private to the package"), and every `ladder` subcommand module is loaded (a broken one is an error, not a missing command)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ladder.cli as cli

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ladder", "sweeps", "fits", "rungs", "benchmarks", "provenance")

# Known, each with its follow-up: the benchmarks' hooks into the training step get public names.
KNOWN = {
    ("benchmarks/dist_muon.py", "rungs.parallel.dist_muon", "_local"),
    ("benchmarks/train_step.py", "rungs.train", "_pick_threads"),
    ("benchmarks/common.py", "rungs.torch_engine", "_train_step"),
}


def _private_imports() -> set[tuple[str, str, str]]:
    found = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                    continue
                if node.module.split(".")[0] not in PACKAGES or node.module.split(".")[0] == package:
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.add((rel, node.module, alias.name))
    return found


def test_no_module_imports_another_modules_private_name():
    new = _private_imports() - KNOWN
    assert not new, f"private names imported across modules (give them a public name): {sorted(new)}"


def test_a_subcommand_module_that_fails_to_import_is_an_error_not_a_missing_command(monkeypatch):
    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", [*cli.SUBCOMMAND_MODULES, "ladder.cli.no_such_command"])
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser()


def test_every_subcommand_is_registered():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert set(sub.choices) >= {"plan", "data", "train", "sweep", "fit", "extrapolate", "nightly", "demo"}


def test_the_cli_output_module_loads_no_fitting_stack():
    """ladder.cli.output takes its JSON normaliser from fits.results: that must not load scipy and every law
    (fits/__init__ loads its exports on first use), or every `ladder` command would pay for them."""
    import subprocess
    import sys

    code = "import sys, ladder.cli.output; heavy = {'scipy', 'fits.power_law'} & set(sys.modules); assert not heavy, heavy"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


PRODUCT = ("ladder", "sweeps", "fits", "rungs", "provenance")


def import_cycle(graph) -> list[str] | None:
    """One import cycle of the graph's modules (each module importing the next, the last the first),
    or None when its imports form no circle."""
    import graphlib

    order = graphlib.TopologicalSorter({m: graph.find_modules_directly_imported_by(m) for m in graph.modules})
    try:
        order.prepare()
    except graphlib.CycleError as err:
        return list(reversed(err.args[1][:-1]))
    return None


def test_the_cycle_finder_finds_a_circle_hidden_behind_type_checking():
    import grimp

    graph = grimp.ImportGraph()
    for importer, imported in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=importer, imported=imported)
    cycle = import_cycle(graph)
    assert cycle is not None and set(cycle) == {"p.a", "p.b", "p.c"}
    graph.remove_import(importer="p.c", imported="p.a")
    assert import_cycle(graph) is None


def test_the_product_code_has_no_import_cycle():
    """No circle among the product's modules, counting lazy imports and those under TYPE_CHECKING
    (import-linter's contracts leave the latter out, and check siblings only)."""
    import grimp

    graph = grimp.build_graph(*PRODUCT, exclude_type_checking_imports=False, cache_dir=None)
    cycle = import_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle + cycle[:1])
