"""scripts/subset_mix.py: the per-collection tokens of a subset, and its rung ranges."""

from __future__ import annotations

import pytest

from tests.rungs.data.shards import shard_of
from tests.scripts.helpers import load_script

mix_script = load_script("subset_mix")


def test_the_mix_counts_each_collection_s_tokens_and_sums_to_the_cap():
    # One big formal document first in hash order or not: the plain rule's mix depends on it, the
    # stratified one's does not.
    shard = shard_of({"formal/a#0": 900, **{f"pages/p{i}#0": 100 for i in range(20)}})
    for cap in (150, 1_000, 2_900):
        mix = mix_script.subset_mix(shard, "math", cap, stratified=True)
        assert sum(mix.values()) == cap
        assert mix.get("formal", 0) == pytest.approx(cap * 900 / 2_900, abs=1)
        assert sum(mix_script.subset_mix(shard, "math", cap, stratified=False).values()) == cap
    assert mix_script.subset_mix(shard, "math", 2_900, stratified=False) == {"formal": 900, "pages": 2_000}


def test_rung_ranges():
    assert mix_script.parse_rungs("4-9") == [4, 5, 6, 7, 8, 9]
    assert mix_script.parse_rungs("4,6") == [4, 6]
    with pytest.raises(ValueError, match="backwards"):
        mix_script.parse_rungs("9-4")
