"""The command line explains itself: help text on every argument of every subcommand, `--version`, and
shell completion through argcomplete."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from ladder.cli import build_parser, leaf_parsers, main

ROOT = Path(__file__).resolve().parents[2]


def _arguments(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from _arguments(child)
        else:
            yield parser.prog, "/".join(action.option_strings) or action.dest, action.help


def test_every_argument_of_every_subcommand_has_help_text():
    missing = [(prog, name) for prog, name, text in _arguments(build_parser())
               if not text or text == argparse.SUPPRESS or not text.strip()]
    assert not missing, f"arguments without help text: {missing}"


def test_every_command_that_prints_tables_takes_a_format():
    for leaf in leaf_parsers(build_parser()):
        has_json = "--json" in leaf._option_string_actions
        assert ("--format" in leaf._option_string_actions) == (has_json and leaf.prog != "ladder demo"), leaf.prog


def test_version_names_the_code_version(capsys):
    from provenance import code_version

    try:
        main(["--version"])
    except SystemExit as stop:
        assert stop.code == 0
    assert capsys.readouterr().out == f"ladder {code_version()}\n"


def test_the_shell_completes_subcommands_and_flags(tmp_path):
    """What a completing shell asks argcomplete (`eval "$(register-python-argcomplete ladder)"`)."""
    def complete(line: str) -> set[str]:
        answer = tmp_path / "completions"
        env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
               "_ARGCOMPLETE_STDOUT_FILENAME": str(answer), "_ARGCOMPLETE_IFS": "\n"}
        subprocess.run([sys.executable, "-m", "ladder"], cwd=ROOT, env=env, check=True, timeout=600,
                       capture_output=True)
        return {word.strip() for word in answer.read_text().split("\n") if word.strip()}

    assert {"run", "status", "plan"} <= complete("ladder sweep ")
    assert {"--mfu", "--goodput", "--json", "--format"} <= complete("ladder sweep plan smoke --")
