"""Seconds each test file took in a measured whole-suite run, the order `make test` starts files in.

`make test` hands whole files to two xdist workers (`--dist loadfile --no-loadscope-reorder`) in
collection order; tests/conftest.py sorts the collection longest file first, so the long files
(a loopback Ray cluster, the training-job kills, the JAX subprocesses) start while the other worker
works through the many short ones, instead of one of them starting last and running alone (xdist's
own reorder, most tests first, started the one-test JAX subprocess files last). A file missing from
the table (a new one, or every file while the table is absent) is ordered by its number of
slow-marked tests, after the listed ones; the order decides only when a file starts, never what runs
or what passes.

Rewrite the table from a run's JUnit XML (`--junitxml`, times include set-up and tear-down):

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/suite.xml
    .venv/bin/python -m tests.file_seconds /tmp/suite.xml
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_suffix(".json")


def load_file_seconds(table: Path = TABLE) -> dict[str, float]:
    """Repository-relative test file path -> measured seconds; empty if the table is missing."""
    if not table.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(table.read_text(encoding="utf-8")).items()}


def module_path(classname: str) -> str:
    """`tests.ladder.test_x` or `tests.ladder.test_x.TestClass` -> `tests/ladder/test_x.py`."""
    parts = classname.split(".")
    while parts and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def file_seconds_from_junit(xml_path: Path) -> dict[str, float]:
    seconds: Counter[str] = Counter()
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        seconds[module_path(case.get("classname", ""))] += float(case.get("time", "0"))
    return {path: round(total, 1) for path, total in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml", type=Path)
    args = parser.parse_args(argv)
    TABLE.write_text(json.dumps(file_seconds_from_junit(args.junit_xml), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
