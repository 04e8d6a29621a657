"""The `ladder` command line. Each subcommand is one module with a `register`:
`ladder/cli/<name>.py` (`ladder/cli/fit/` for the fit family).

Contract (docs/architecture.md): a readable table by default, one JSON object with --json (or the tables
as CSV or Markdown with --format csv|md, on every command that has --json), logs on stderr, exit 0 on
success, exit 2 with one clear paragraph (no traceback) on bad input. `ladder --version` names the code
version; shell completion comes from argcomplete (`eval "$(register-python-argcomplete ladder)"`).
"""
# PYTHON_ARGCOMPLETE_OK (argcomplete's marker: this entry point completes itself)

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ladder.cli.output import TABLE_FORMATS, set_table_format
from ladder.errors import LadderInputError

# Each module registers its own subcommands.
SUBCOMMAND_MODULES = [
    "ladder.cli.plan",
    "ladder.cli.data",
    "ladder.cli.train",
    "ladder.cli.sweep",
    "ladder.cli.fit",
    "ladder.cli.extrapolate",
    "ladder.cli.nightly",
    "ladder.cli.demo",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors are bad input too: exit 2, one line
        sys.stderr.write(f"ladder: error: {message} (`{self.prog} --help` lists the flags)\n")
        raise SystemExit(2)


class _Version(argparse.Action):
    """--version: the code version (`provenance.code_version`), read only when asked (it runs git)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from provenance import code_version

        sys.stdout.write(f"ladder {code_version()}\n")
        raise SystemExit(0)


def leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser of a command line that runs a command (the subcommands' subcommands, depth first)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for a in subs for child in dict.fromkeys(a.choices.values()) for leaf in leaf_parsers(child)]


NO_TABLES = frozenset({"ladder demo"})  # prints a report's summary lines, no tables


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ladder", description="Scaling-ladder experiment platform (MAI-Base-2 method)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    parser.add_argument("--version", action=_Version, help="print the code version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for leaf in leaf_parsers(parser):
        if "--json" in leaf._option_string_actions and leaf.prog not in NO_TABLES:
            leaf.add_argument("--format", choices=TABLE_FORMATS, default="table",
                              help="how tables are printed: table (fits the terminal), csv or md (Markdown); "
                                   "--json prints one JSON object instead")
    return parser


TRAINING_COMMANDS = frozenset({"train", "sweep", "demo", "nightly"})


def _command(args: list[str]) -> str | None:
    """The subcommand of a command line (its first word that is not an option), before parsing."""
    return next((a for a in args if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    """Run one command line. Ctrl-C anywhere in it is one line on stderr and exit 130 (128 + SIGINT), with
    what to do next where the command says (`on_interrupt`: `ladder data prepare` resumes when rerun)."""
    parsed: list[argparse.Namespace] = []  # the command line, once parsed (an interrupt may come before)
    try:
        return _main(argv, parsed)
    except KeyboardInterrupt:
        name = f"ladder {parsed[0].command}" if parsed else "ladder"
        hint = getattr(parsed[0], "on_interrupt", None) if parsed else None
        sys.stderr.write(f"{name}: interrupted" + (f"; {hint}" if hint else "") + "\n")
        return 130


def _main(argv: list[str] | None, parsed: list[argparse.Namespace]) -> int:
    if argv is None and _command(sys.argv[1:]) in TRAINING_COMMANDS:
        # This process is a `ladder` command that trains: before any library starts its threads, keep
        # freed host memory for reuse, so a training step does not fault its temporaries in again each
        # step (rungs.host_memory). Not for `ladder data` (the tokenizer's threads would share one
        # arena), nor for a caller that passes argv (a test, a notebook), which keeps its allocator.
        from rungs.host_memory import keep_freed_host_memory

        keep_freed_host_memory()
    parser = build_parser()
    if argv is None:
        import argcomplete

        argcomplete.autocomplete(parser)  # answers a completing shell and exits; a no-op otherwise
    args = parser.parse_args(argv)
    parsed.append(args)
    table_format = getattr(args, "format", "table")
    if table_format != "table" and getattr(args, "json", False):
        parser.error("--json and --format are two outputs: choose one")
    set_table_format(table_format)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args) or 0)
    except LadderInputError as err:
        sys.stderr.write(f"ladder {args.command}: error: {err}\n")
        return 2
    except FileNotFoundError as err:
        sys.stderr.write(f"ladder {args.command}: error: {err.filename or err}: file not found\n")
        return 2
    except Exception as err:
        # The edge of last resort: input the readers above did not name (a parser error raised from
        # deeper down) is still bad input, one line and exit 2; anything else is a bug and keeps its
        # traceback (exit 1).
        text = _input_error_text(err)
        if text is None:
            raise
        sys.stderr.write(f"ladder {args.command}: error: {text}\n")
        return 2


def _input_error_text(err: BaseException) -> str | None:
    """One line for an error that can only come from reading a user's file or flag; None otherwise."""
    import json

    import yaml
    from pydantic import ValidationError

    if isinstance(err, UnicodeDecodeError):
        return f"input is not UTF-8 text (byte {err.start} is 0x{err.object[err.start]:02x})"
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON: {err}"
    if isinstance(err, yaml.YAMLError):
        from ladder.plan.yaml_input import describe_yaml_error

        return describe_yaml_error(err)
    if isinstance(err, ValidationError):
        from ladder.plan.yaml_input import describe_validation_error

        field, msg = describe_validation_error(err, schema=err.title)
        return f"{err.title}: {field}: {msg}"
    return None


if __name__ == "__main__":
    sys.exit(main())
