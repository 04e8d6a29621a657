"""The documentation site: it builds with warnings as errors, its CLI reference lists every flag the parsers
accept, and no page speaks of how the project was built."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ladder.cli import build_parser
from tests.scripts.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
cli_reference = load_script("cli_reference")  # the MkDocs hook, loaded by path as MkDocs loads it

# Words about the making of the project, not about the product: a page says what the platform does.
PROCESS_WORDS = [
    r"\bsessions?\b", r"\blent\b", r"\bissue\s*#?\d+", r"(?<![\w/&])#\d+(\.\d+)?\b", r"\$OUT\b",
    r"\bcarry\s*\[", r"other engineers?", r"another engineer", r"tried as a new user",
]


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_site_builds_with_warnings_as_errors(tmp_path):
    """`mkdocs build --strict`: every nav page exists, every link and anchor resolves, the CLI reference
    and the API page generate (an API object that does not resolve is an error)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cli_page = (tmp_path / "site" / "cli" / "index.html").read_text()
    for prog, _, _ in cli_reference.walk(build_parser()):
        assert f'id="{cli_reference._anchor(prog)}"' in cli_page, prog
    api_page = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "fit_power_law" in api_page and "load_runs" in api_page


def test_cli_reference_lists_every_flag_that_help_prints():
    """Each command's section names every option argparse's own --help prints for it."""
    page = cli_reference.render(build_parser())
    sections = dict(zip(re.findall(r"^#{2,4} (ladder.*)$", page, flags=re.M),
                        re.split(r"^#{2,4} ladder.*$", page, flags=re.M)[1:]))
    commands = list(cli_reference.walk(build_parser()))
    assert set(sections) == {prog for prog, _, _ in commands}
    for prog, _, parser in commands:
        # argparse's help lists each option at the start of a line: "  -v, --verbose", "  --rungs RUNGS  ..."
        invocations = re.findall(r"^ {2}(-.*?)(?: {2,}|$)", parser.format_help(), flags=re.M)
        options = {flag.split()[0] for inv in invocations for flag in inv.split(", ")} - {"-h", "--help"}
        missing = {o for o in options if f"`{o}" not in sections[prog] and f", {o}" not in sections[prog]}
        assert not missing, f"{prog}: {sorted(missing)}"


def test_cli_reference_escapes_markup_in_help_text():
    import argparse

    parser = argparse.ArgumentParser(prog="ladder")
    parser.add_argument("--tokenizer", help="a file with an <|endoftext|> token; A*C^-a and B*x")
    page = cli_reference.render(parser)
    row = next(line for line in page.splitlines() if line.startswith("| `--tokenizer"))
    assert "&lt;&#124;endoftext&#124;&gt;" in row and r"A\*C" in row
    assert row.count("|") == 3  # two cells, however many pipes the help holds


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_speak_of_the_product_not_of_its_making(page):
    text = page.read_text()
    hits = [m.group(0) for pattern in PROCESS_WORDS for m in re.finditer(pattern, text, flags=re.I)]
    assert not hits, f"{page.relative_to(ROOT)}: {hits}"
