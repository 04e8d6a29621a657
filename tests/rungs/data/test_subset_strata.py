"""Stratified unique subsets: every rung sees its source's mix of collections, subsets still nest."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError
from rungs.data.sampler import SourceScaledSampler, collection_caps, collection_of, select_subset
from tests.rungs.data.shards import shard_of


# Two collections of very different document sizes: a few large 'formal' chunks, many small pages.
rng = np.random.default_rng(0)
MIXED = {**{f"formal/db.mm#{i}": int(rng.integers(1500, 2500)) for i in range(8)},
         **{f"pages/p{i}.html#0": int(rng.integers(50, 400)) for i in range(120)}}


def used_by_collection(shard, docs, used) -> Counter:
    out = Counter()
    for d, n in zip(docs, used):
        out[collection_of(shard.doc_ids[d])] += int(n)
    return out


def test_collection_is_the_id_up_to_the_first_slash():
    assert collection_of("metamath/set.mm#3") == "metamath"
    assert collection_of("sympy/modules/core.html#0") == "sympy"
    assert collection_of("corpus.jsonl:17") == ""


@pytest.mark.parametrize("cap", [1, 700, 2_000, 9_001, 20_000])
def test_each_collection_gets_its_share_and_the_caps_sum_exactly(cap):
    shard = shard_of(MIXED)
    total = sum(MIXED.values())
    formal = sum(n for k, n in MIXED.items() if k.startswith("formal/"))
    docs, used = select_subset(shard, "math", cap)
    assert int(used.sum()) == cap and len(set(docs.tolist())) == len(docs)
    got = used_by_collection(shard, docs, used)
    assert abs(got["formal"] - cap * formal / total) < 1.0
    assert sum(c for _, c in collection_caps(shard, cap).values()) == cap
    assert all(0 < u <= shard.index[d, 1] for d, u in zip(docs, used))


def test_the_plain_prefix_does_not_keep_the_mix_which_is_why_strata_exist():
    shard = shard_of(MIXED)
    total = sum(MIXED.values())
    formal = sum(n for k, n in MIXED.items() if k.startswith("formal/")) / total
    shares = []
    for cap in (1_500, 3_000, 6_000, 12_000):
        docs, used = select_subset(shard, "math", cap, stratified=False)
        shares.append(used_by_collection(shard, docs, used)["formal"] / cap)
        docs, used = select_subset(shard, "math", cap)
        assert used_by_collection(shard, docs, used)["formal"] / cap == pytest.approx(formal, abs=1e-3)
    assert max(abs(s - formal) for s in shares) > 0.05  # a few large documents swing the plain prefix


def test_stratified_subsets_nest_within_every_collection():
    shard = shard_of(MIXED)
    previous: dict[str, int] = {}
    for cap in (800, 1_600, 4_000, 10_000, sum(MIXED.values())):
        docs, used = select_subset(shard, "math", cap)
        now = {shard.doc_ids[d]: int(u) for d, u in zip(docs, used)}
        for doc_id, n in previous.items():  # everything a smaller rung saw, a larger one sees
            assert now.get(doc_id, 0) >= n
        previous = now
    assert previous == MIXED  # at the full cap: every document whole


def test_a_source_with_one_collection_keeps_the_plain_prefix():
    single = {f"doc-{i}": 100 + 7 * i for i in range(40)}
    shard = shard_of(single)
    for cap in (1, 999, 3_333):
        a, ua = select_subset(shard, "web", cap)
        b, ub = select_subset(shard, "web", cap, stratified=False)
        assert a.tolist() == b.tolist() and ua.tolist() == ub.tolist()


@pytest.fixture(scope="module")
def corpus(tiny_byte) -> PreparedCorpus:
    return PreparedCorpus.open(tiny_byte)


def test_the_rule_is_checked_and_is_part_of_the_resume_identity(corpus):
    cap = corpus.unique_tokens("a") // 2, corpus.unique_tokens("b") // 2
    plan = {"a": {"share": 0.6, "unique_tokens": cap[0], "epochs": 1.0},
            "b": {"share": 0.4, "unique_tokens": cap[1], "epochs": 1.0}}
    with pytest.raises(DataInputError, match="subset must be one of"):
        SourceScaledSampler(corpus, plan, seq_len=16, batch_sequences=2, seed=0, subset="random")
    stratified = SourceScaledSampler(corpus, plan, seq_len=16, batch_sequences=2, seed=0)
    stratified.next_batch()
    prefix = SourceScaledSampler(corpus, plan, seq_len=16, batch_sequences=2, seed=0, subset="prefix")
    with pytest.raises(DataInputError, match="different plan"):
        prefix.load_state_dict(stratified.state_dict())


def test_a_cap_outside_the_source_is_refused():
    shard = shard_of(MIXED)
    for cap in (0, sum(MIXED.values()) + 1):
        with pytest.raises(DataInputError, match="outside 1.."):
            select_subset(shard, "math", cap)


def test_the_data_report_names_the_rule_and_the_collections(corpus):
    plan = {"a": {"share": 0.6, "unique_tokens": 500, "epochs": 1.0},
            "b": {"share": 0.4, "unique_tokens": 400, "epochs": 1.0}}
    report = SourceScaledSampler(corpus, plan, seq_len=16, batch_sequences=2, seed=0).report()
    assert report["a"]["subset_rule"] == "stratified"
    assert report["a"]["subset_collections"] == {"": 500} and report["b"]["subset_collections"] == {"": 400}
