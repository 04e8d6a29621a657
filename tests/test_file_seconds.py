"""The suite's start order: longest measured file first, files kept whole, new files last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import longest_file_first
from tests.file_seconds import file_seconds_from_junit, load_file_seconds, module_path


class FakeItem:
    """What the sort reads of a pytest item: its path and marks (a real pytest.Item needs a session)."""

    def __init__(self, path: Path, name: str, slow: bool = False) -> None:
        self.path, self.name, self.slow = path, name, slow

    def get_closest_marker(self, name: str):
        return pytest.mark.slow.mark if name == "slow" and self.slow else None


def test_files_start_longest_first_each_file_whole_and_in_its_own_order(tmp_path):
    a, b, c = (tmp_path / "tests" / f"test_{x}.py" for x in "abc")
    items = [FakeItem(a, "a1"), FakeItem(a, "a2"), FakeItem(b, "b1"), FakeItem(c, "c1"), FakeItem(c, "c2")]
    seconds = {"tests/test_a.py": 5.0, "tests/test_c.py": 60.0}  # test_b.py is new: not measured
    ordered = longest_file_first(items, tmp_path, seconds)  # type: ignore[arg-type]
    assert [i.name for i in ordered] == ["c1", "c2", "a1", "a2", "b1"]


def test_files_the_table_does_not_list_start_by_their_number_of_slow_tests(tmp_path):
    a, b, c = (tmp_path / "tests" / f"test_{x}.py" for x in "abc")
    items = [FakeItem(a, "a1"), FakeItem(b, "b1", slow=True), FakeItem(b, "b2"), FakeItem(c, "c1", slow=True),
             FakeItem(c, "c2", slow=True)]
    assert [i.name for i in longest_file_first(items, tmp_path, {})] == ["c1", "c2", "b1", "b2", "a1"]  # type: ignore[arg-type]


def test_junit_times_are_summed_per_file_set_up_included(tmp_path):
    xml = tmp_path / "suite.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.ladder.test_x" name="t1" time="1.5"/>'
        '<testcase classname="tests.ladder.test_x" name="t2[p]" time="2.25"/>'
        '<testcase classname="tests.rungs.test_y.TestGroup" name="t3" time="4.0"/>'
        '<testcase classname="tests.test_z" name="t4" time="0.05"/>'
        "</testsuite></testsuites>")
    assert file_seconds_from_junit(xml) == {"tests/rungs/test_y.py": 4.0, "tests/ladder/test_x.py": 3.8,
                                            "tests/test_z.py": 0.1}
    assert module_path("tests.rungs.parallel.test_launch") == "tests/rungs/parallel/test_launch.py"


def test_a_missing_table_orders_nothing(tmp_path):
    assert load_file_seconds(tmp_path / "absent.json") == {}
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"tests/test_a.py": 3}))
    assert load_file_seconds(table) == {"tests/test_a.py": pytest.approx(3.0)}
