"""One gloo launch shared by several tests of a module (tests/rungs/parallel/spawn.py starts it).

Starting `world` rank processes, importing what their first FSDP call imports (torch._dynamo) and
opening MLflow's SQL store in rank 0 cost CPU-seconds a launch, paid again by every test that starts its
own. Tests whose rank work is independent share one launch instead: a module-scoped fixture runs each
selected test's *part* (a rank function with the assertions that test made in its own launch) in turn in
the same processes, and each test then checks that its part passed on every rank. Every assertion still
runs, in real rank processes over a real process group.

A part that fails on a rank records its traceback and ends the launch (the ranks' collectives can no
longer line up); that test fails with the traceback, the tests whose parts had not run yet fail saying
so, and the parts that finished on every rank before it count as passed.

Only the parts of the tests this session runs are launched (`-k`, `-m "not slow"`, one test by node id).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.rungs.parallel.spawn import run_ranks

Part = tuple[str, Callable[..., Any], tuple]  # (test name, fn(rank, world, *args), args)
# test name -> (fn(rank, world, *args), make_args(the test's own directory) -> args)
PartTable = dict[str, tuple[Callable[..., Any], Callable[[Path], tuple]]]


def selected_tests(request: pytest.FixtureRequest) -> set[str]:
    """The names (without parameters) of the tests of the requesting module that this session runs."""
    return {getattr(item, "originalname", item.name) for item in request.session.items if item.path == request.path}


def _run_parts(rank: int, world: int, parts: Sequence[Part], out: Path) -> None:
    for name, fn, args in parts:
        try:
            fn(rank, world, *args)
        except BaseException:
            (out / f"{name}.rank{rank}.failed").write_text(traceback.format_exc())
            raise
        (out / f"{name}.rank{rank}.passed").touch()


@dataclass
class SharedLaunch:
    out: Path
    world: int
    names: tuple[str, ...]
    error: BaseException | None

    def check(self, name: str) -> None:
        """Fail unless part `name` ran in this launch and passed on every rank."""
        assert name in self.names, f"{name} was not part of the shared launch (selected: {self.names})"
        earlier = self.names[:self.names.index(name)]
        broke = next((n for n in earlier if any(self.out.glob(f"{n}.rank*.failed"))), None)
        context = (f" (the launch broke earlier, in {broke}: its ranks' failures may have ended this one)"
                   if broke else "")
        failed = sorted(self.out.glob(f"{name}.rank*.failed"))
        if failed:
            pytest.fail(f"{name} failed{context}\n" + "\n".join(f"{f.name}:\n{f.read_text()}" for f in failed),
                        pytrace=False)
        missing = [r for r in range(self.world) if not (self.out / f"{name}.rank{r}.passed").is_file()]
        if missing:
            pytest.fail(f"{name}: not finished on ranks {missing}{context}; the shared launch ended with "
                        f"{self.error!r}", pytrace=False)


def launch_parts(out: Path, world: int, parts: Sequence[Part]) -> SharedLaunch:
    """Run `parts` in order in one launch of `world` ranks; what each test checks afterwards."""
    out.mkdir(parents=True, exist_ok=True)
    error = None
    if parts:
        try:
            run_ranks(_run_parts, world, list(parts), out)
        except Exception as err:  # reported by the tests whose parts did not pass (SharedLaunch.check)
            error = err
    return SharedLaunch(out, world, tuple(name for name, _, _ in parts), error)


def launch_selected(request: pytest.FixtureRequest, out: Path, world: int, table: PartTable) -> SharedLaunch:
    """`launch_parts` for the tests of `table` (in its order) that this session runs; each part's arguments
    are made from a directory of its own, `out / <test name>`."""
    chosen = selected_tests(request)
    parts = []
    for name, (fn, make_args) in table.items():
        if name in chosen:
            (out / name).mkdir(parents=True)
            parts.append((name, fn, make_args(out / name)))
    return launch_parts(out, world, parts)
