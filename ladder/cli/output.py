"""CLI output conventions: a readable table on stdout by default, exactly one JSON object with --json,
or the tables as CSV or Markdown with --format csv|md. Logs and progress go to stderr.

Tables fit the terminal: on a terminal (or with COLUMNS set) rich sizes them to its width, wrapping
cells; piped to a file they keep a fixed 200 columns, so their rows stay whole. `--format csv` writes
each table as CSV (a blank line between tables) and sends titles and other text to stderr, so a
command's stdout is the data; `--format md` writes each table as a Markdown table under its title.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fits.results import jsonable

TABLE_FORMATS = ("table", "csv", "md")
PIPED_WIDTH = 200  # columns of a table written to a file or a pipe
_format = {"stdout": "table"}  # the running command's --format (set once, by ladder.cli.main)


def set_table_format(name: str) -> None:
    if name not in TABLE_FORMATS:
        raise ValueError(f"unknown table format {name!r}; one of {list(TABLE_FORMATS)}")
    _format["stdout"] = name


def table_format() -> str:
    return _format["stdout"]


class PlainTable(Table):
    """A rich Table that keeps its title, columns and cell text, for CSV and Markdown output."""

    def __init__(self, title: str, columns: list[str], cells: list[list[str]], **kwargs: Any) -> None:
        super().__init__(title=title, **kwargs)
        self.plain_title, self.plain_columns, self.plain_cells = title, list(columns), cells


def _plain(text: str) -> str:
    return Text.from_markup(text).plain


def write_csv(table: PlainTable, stream) -> None:
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(table.plain_columns)
    writer.writerows([[_plain(c) for c in cells] for cells in table.plain_cells])


def write_markdown(table: PlainTable, stream) -> None:
    def row(cells: list[str]) -> str:
        return "| " + " | ".join(_plain(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |\n"

    if table.plain_title:
        stream.write(f"**{_plain(table.plain_title)}**\n\n")
    stream.write(row(table.plain_columns))
    stream.write(row(["---"] * len(table.plain_columns)))
    for cells in table.plain_cells:
        stream.write(row(cells))


class _StreamConsole:
    """A rich Console bound to the *current* sys.stdout/stderr at each use (tests swap them); on stdout,
    `print` follows the command's --format."""

    def __init__(self, stream: str, **kwargs: Any) -> None:
        self._stream = stream
        self._kwargs = kwargs

    def _console(self) -> Console:
        file = getattr(sys, self._stream)
        sized = file.isatty() or "COLUMNS" in os.environ  # rich reads the terminal's width (or COLUMNS)
        return Console(file=file, **({} if sized else {"width": PIPED_WIDTH}), **self._kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        fmt = table_format() if self._stream == "stdout" else "table"
        if fmt == "table":
            self._console().print(*objects, **kwargs)
            return
        for obj in objects:
            if isinstance(obj, PlainTable):
                if fmt == "csv" and obj.plain_title:
                    sys.stderr.write(_plain(obj.plain_title) + "\n")
                (write_csv if fmt == "csv" else write_markdown)(obj, sys.stdout)
                sys.stdout.write("\n")
            elif fmt == "csv":  # stdout holds the tables alone
                sys.stderr.write(_plain(str(obj)) + "\n")
            else:
                sys.stdout.write((str(obj) if kwargs.get("markup") is False else _plain(str(obj))) + "\n\n")
        sys.stdout.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)


stdout_console = _StreamConsole("stdout", soft_wrap=False)
stderr_console = _StreamConsole("stderr")


def progress_line(message: str) -> None:
    """One progress line on stderr, flushed at once (the CLI's progress callback for long commands)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def print_json(payload: dict) -> None:
    sys.stdout.write(json.dumps(jsonable(payload), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def make_table(title: str, columns: list[str], rows: list[list[Any]]) -> PlainTable:
    cells = [[fmt(v) for v in row] for row in rows]
    table = PlainTable(title, columns, cells, header_style="bold")
    for c in columns:
        table.add_column(c, justify="right" if c not in ("name", "source", "domain", "recipe") else "left")
    for row in cells:
        table.add_row(*row)
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


def check_writable(path: Path, *, flag: str, kind: str) -> None:
    """`path` must be a `kind` ("directory" or "file") or creatable as one: not the other kind, nor under a
    file, nor where this user cannot write. Raises LadderInputError naming `flag`."""
    from ladder.errors import LadderInputError

    for at in (path, *path.parents):
        if not at.exists():
            continue
        if at == path and at.is_dir() != (kind == "directory"):
            other = "directory" if at.is_dir() else "file"
            raise LadderInputError(f"{path} is a {other}, not a {kind}; give a {kind} path", field=flag)
        if at != path and not at.is_dir():
            raise LadderInputError(f"{path} is under {at}, which is a file, not a directory; give another path",
                                   field=flag)
        if not os.access(at, os.W_OK | (os.X_OK if at.is_dir() else 0)):
            raise LadderInputError(f"cannot write {at} (permission denied); give a writable path", field=flag)
        return


def output_file(suffixes: tuple[str, ...]):
    """An argparse type for a file a command writes (--plot, --save): checked when the flags are read,
    before any work: not empty, a name ending in one of `suffixes` (or none), and writable where it
    lies (`check_writable`)."""
    from ladder.errors import LadderInputError

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("an empty path; give a file name")
        path = Path(text)
        if path.suffix and path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{text}: writes {'/'.join(s[1:].upper() for s in suffixes)}; name it "
                                             f"{' or '.join(path.stem + s for s in suffixes)}")
        try:
            check_writable(path, flag="", kind="file")
        except LadderInputError as err:
            raise argparse.ArgumentTypeError(err.detail) from None
        return text

    return parse
