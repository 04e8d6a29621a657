"""The README as a new user meets it: it opens with the two set-up commands, stays short, its relative
links resolve, and the commands in its shell blocks that take under a minute run as written, in a fresh
copy of the repository, from the installed `ladder`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_BYTES = 20_000

# Every command of the README's shell blocks is run here or names where it is tested: a new command
# that is neither fails test_every_readme_command_is_run_here_or_tested_elsewhere.
RUN_HERE = ("ladder --help", "ladder --version", "ladder plan ", "ladder sweep plan ",
            'eval "$(register-python-argcomplete ladder)"')
TESTED_ELSEWHERE = {
    "make demo": "the main job itself (minutes of training); its parts: tests/ladder/test_report.py",
    "make test": "the suite this test is part of",
    "make .venv/.installed": "what make test runs first",
    "source .venv/bin/activate": "shell set-up: this test puts .venv/bin on PATH instead",
    "ladder sweep run ": "trains (about two minutes): tests/ladder/test_orchestrate.py",
    "ladder sweep status ": "needs the store the sweep writes: tests/ladder/test_orchestrate.py",
    "ladder fit ": "the fit -> extrapolate tour on the demo fixture: tests/fits/test_tour.py",
    "ladder extrapolate ": "the fit -> extrapolate tour on the demo fixture: tests/fits/test_tour.py",
}


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"^ *```(?:bash|sh|shell|console)\n(.*?)^ *```", text, flags=re.M | re.S)


def _commands(block: str) -> list[str]:
    """The commands of a shell block as a user would type them: continuation lines joined, comments
    (a `#` after whitespace) and blank lines dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        command = re.split(r"\s+#\s", " " + line, maxsplit=1)[0].strip()
        if command and not command.startswith("#"):
            out.append(command)
    return out


def _readme_commands() -> list[str]:
    return [c for block in _shell_blocks(README.read_text()) for c in _commands(block)]


def _where(command: str) -> str | None:
    if command.startswith(RUN_HERE) or command in RUN_HERE:
        return "here"
    return next((why for prefix, why in TESTED_ELSEWHERE.items() if command.startswith(prefix)), None)


def test_readme_opens_with_exactly_the_two_set_up_commands():
    first = _shell_blocks(README.read_text())[0]
    assert _commands(first) == ["make demo", "make test"]
    assert README.read_text().index("```") < README.read_text().index("\n## ")  # before any section


def test_readme_is_short():
    assert README.stat().st_size <= MAX_BYTES


def test_every_relative_link_in_the_readme_resolves():
    text = README.read_text()
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    relative = [t for t in targets if not re.match(r"[a-z]+://|mailto:|#", t)]
    assert relative
    missing = [t for t in relative if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, missing


def test_every_readme_command_is_run_here_or_tested_elsewhere():
    commands = _readme_commands()
    assert any(_where(c) == "here" for c in commands)
    assert not [c for c in commands if _where(c) is None]


def test_the_readme_fit_commands_are_the_ones_the_tour_test_runs():
    """tests/fits/test_tour.py runs docs/fits.md's Quick start as written: the README's fit and extrapolate
    commands must be those, word for word."""
    quick_start = [c for block in _shell_blocks((ROOT / "docs" / "fits.md").read_text()) for c in _commands(block)]
    tour = [c for c in _readme_commands() if c.startswith(("ladder fit ", "ladder extrapolate "))]
    assert tour and set(tour) <= set(quick_start)


def test_the_checker_finds_commands_and_flags_a_new_one():
    block = "ladder plan x \\\n    --rungs 1,2   # a comment\n# a comment line\n\nladder frobnicate\n"
    assert _commands(block) == ["ladder plan x --rungs 1,2", "ladder frobnicate"]
    assert _where("ladder frobnicate") is None and _where("ladder plan x") == "here"


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory) -> Path:
    """The repository's tracked files, copied to a new directory: no runs/, no store, no caches."""
    dest = tmp_path_factory.mktemp("fresh") / "scaling-ladder"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.parametrize("command", [c for c in _readme_commands() if _where(c) == "here"])
def test_readme_command_runs_as_written(command, fresh_copy):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "200"}
    # The completion set-up prints nothing: what it did is asked of the shell after it.
    check = "\ncomplete -p ladder" if "register-python-argcomplete" in command else ""
    proc = subprocess.run(["bash", "-c", command + check], cwd=fresh_copy, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()
    assert not (fresh_copy / "runs").exists()  # a dry run writes nothing
