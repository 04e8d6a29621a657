"""Suite-wide: the collection runs longest file first (see tests/file_seconds.py for why)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.file_seconds import load_file_seconds


def longest_file_first(items: list[pytest.Item], rootpath, file_seconds: dict[str, float]) -> list[pytest.Item]:
    """A stable sort: by the file's measured seconds, then (for files the table does not list) by its
    number of slow-marked tests; files stay contiguous and keep their own order."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    return sorted(items, key=lambda item: (-file_seconds.get(item.path.relative_to(rootpath).as_posix(), 0.0),
                                           -slow[item.path]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = longest_file_first(items, config.rootpath, load_file_seconds())
