"""demo_ladder_check's rung sets: ranges and lists, since a fixed-depth ladder skips rungs."""

from __future__ import annotations

from tests.scripts.helpers import load_script


def test_rung_sets_are_ranges_lists_or_both():
    check = load_script("demo_ladder_check")
    assert check.rung_set("4-9") == [4, 5, 6, 7, 8, 9]
    assert check.rung_set("4-6,8,11,13") == [4, 5, 6, 8, 11, 13]
    assert check.rung_set("11") == [11]
