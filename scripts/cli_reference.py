"""The CLI reference page, generated from `ladder.cli.build_parser()`: one section per (sub)command with
its usage, description and a table of its arguments, so the documentation cannot drift from the parsers.

Used two ways:
- as an MkDocs hook (`hooks:` in mkdocs.yml): `on_files` adds the generated `cli.md` to the site;
- as a script: `python scripts/cli_reference.py > cli.md` prints the same Markdown.

No library does this for plain argparse at the level of upkeep MkDocs plugins need (mkdocs-click is for
Click), and the walk is short: argparse's own formatter renders usage and expands each help string.
"""

from __future__ import annotations

import argparse
import html
import sys
from collections.abc import Iterator
from typing import Any

PAGE = "cli.md"

INTRO = """# CLI reference

Generated from the `ladder` command's parsers when the site is built (`scripts/cli_reference.py`), so it
lists exactly what `ladder COMMAND --help` accepts. Every command prints a readable table by default and
one JSON object with `--json`; logs and progress go to stderr. Exit status 0 on success, 2 on bad input
(one line naming the file and the field, nothing written); `ladder sweep run`, `ladder nightly` and
`ladder fit` also use 1 (a failed trial, a regression, no group fitted).
"""


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order they were registered."""
    for action in parser._actions:  # argparse exposes no public walk of its subparsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def walk(parser: argparse.ArgumentParser, prog: str = "ladder", summary: str = ""
         ) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(command line, one-line help, parser) of the parser and every subcommand below it, depth first."""
    yield prog, summary, parser
    for name, help_text, sub in _subcommands(parser):
        yield from walk(sub, f"{prog} {name}", help_text)


def _text(value: Any) -> str:
    """Plain text made safe inside a Markdown table cell: no HTML, no cell breaks, no stray emphasis."""
    return html.escape(" ".join(str(value).split()), quote=False).replace("|", "&#124;").replace("*", r"\*")


def _names(action: argparse.Action) -> str:
    if action.option_strings:
        flags = ", ".join(action.option_strings)
        if action.nargs != 0:
            flags += f" {action.metavar or action.dest.upper()}"
        return f"`{flags}`"
    return f"`{action.metavar or action.dest}`"


def _default(action: argparse.Action) -> str:
    if action.option_strings and action.nargs == 0:
        return ""  # a switch: its default is "off"
    if action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    return f"`{action.default}`"


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS]


def _section(prog: str, summary: str, parser: argparse.ArgumentParser) -> str:
    formatter = parser._get_formatter()
    level = "#" * (2 + max(0, prog.count(" ") - 1))  # ladder, ladder plan: ##; ladder fit power-law: ###
    out = [f"{level} {prog}", ""]
    description = parser.description or summary
    if description:
        out += [_text(description), ""]
    prefix = "usage: "
    lines = parser.format_usage().removeprefix(prefix).rstrip().splitlines()
    usage = "\n".join([lines[0], *(line.removeprefix(" " * len(prefix)) for line in lines[1:])])
    out += ["```", usage, "```", ""]
    rows = []
    for action in _arguments(parser):
        cell = _text(formatter._expand_help(action)) if action.help else ""
        if action.choices and not isinstance(action.choices, dict):
            cell += ("; " if cell else "") + "one of " + ", ".join(f"`{c}`" for c in action.choices)
        if default := _default(action):
            cell += ("; " if cell else "") + f"default {default}"
        rows.append(f"| {_names(action)} | {cell} |")
    if rows:
        out += ["| argument | what it does |", "|---|---|", *rows, ""]
    subs = list(_subcommands(parser))
    if subs:
        out += ["| subcommand | what it does |", "|---|---|"]
        out += [f"| [`{prog} {name}`](#{_anchor(f'{prog} {name}')}) | {_text(h)} |" for name, h, _ in subs]
        out.append("")
    if parser.epilog:
        out += [_text(parser.epilog), ""]
    return "\n".join(out)


def _anchor(heading: str) -> str:
    """The id MkDocs' toc extension gives a heading of plain words: lower case, spaces to hyphens."""
    return "-".join(heading.lower().split())


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole page as Markdown."""
    if parser is None:
        from ladder.cli import build_parser

        parser = build_parser()
    sections = [_section(prog, summary, p) for prog, summary, p in walk(parser)]
    return INTRO + "\n" + "\n".join(sections)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the site's files, before the nav is resolved."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    sys.stdout.write(render())
