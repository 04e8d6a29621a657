"""CLI output conventions: a readable table on stdout by default, or exactly one JSON object with
--json. Logs and progress go to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from fits.results import jsonable


class _StreamConsole:
    """A rich Console bound to the *current* sys.stdout/stderr at each use (tests swap them)."""

    def __init__(self, stream: str, **kwargs: Any) -> None:
        self._stream = stream
        self._kwargs = kwargs

    def __getattr__(self, name: str) -> Any:
        return getattr(Console(file=getattr(sys, self._stream), **self._kwargs), name)


stdout_console = _StreamConsole("stdout", soft_wrap=False, width=200)
stderr_console = _StreamConsole("stderr")


def progress_line(message: str) -> None:
    """One progress line on stderr, flushed at once (the CLI's progress callback for long commands)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def print_json(payload: dict) -> None:
    sys.stdout.write(json.dumps(jsonable(payload), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def make_table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title, header_style="bold")
    for c in columns:
        table.add_column(c, justify="right" if c not in ("name", "source", "domain", "recipe") else "left")
    for row in rows:
        table.add_row(*[fmt(v) for v in row])
    return table


def fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) < 10**7 else f"{value:.3e}"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1e6 or abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)

