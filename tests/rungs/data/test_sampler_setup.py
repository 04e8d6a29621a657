"""The sampler's set-up is vectorised: the same subsets as the per-document rule it replaced, read
from the prepared corpus's memory-mapped orders, in memory that grows with the subset, not the source."""

from __future__ import annotations

import hashlib
import tracemalloc

import numpy as np
import pytest

from rungs.data.corpus import DocumentShard, PreparedCorpus
from rungs.data.prepare import prepare
from rungs.data.sampler import select_subset
from tests.rungs.data.shards import shard_of

from .conftest import make_docs, write_jsonl


def _per_document_rule(shard, source: str, cap_tokens: int, stratified: bool):
    """The rule as it was written in older versions: a Python loop over every document (kept as the reference)."""
    def collection(doc_id):
        head, sep, _ = doc_id.partition("/")
        return head if sep else ""

    def hash_prefix(docs, cap):
        keys = np.array([int.from_bytes(hashlib.sha256(f"{source}\x00{shard.doc_ids[d]}".encode()).digest()[:8],
                                        "little") for d in docs], dtype=np.uint64)
        order = docs[np.argsort(keys, kind="stable")]
        lengths = np.asarray(shard.index[order, 1])
        cumulative = np.cumsum(lengths)
        n = min(int(np.searchsorted(cumulative, cap, side="left")) + 1, len(order))
        used = lengths[:n].astype(np.int64).copy()
        used[-1] -= int(cumulative[n - 1]) - cap
        return order[:n].astype(np.int64), used

    if not stratified:
        return hash_prefix(np.arange(shard.n_docs, dtype=np.int64), cap_tokens)
    members: dict[str, list[int]] = {}
    for i, doc_id in enumerate(shard.doc_ids):
        members.setdefault(collection(doc_id), []).append(i)
    names = sorted(members)
    sizes = [int(np.asarray(shard.index[members[n], 1]).sum()) for n in names]
    docs, used, before, running = [], [], 0, 0
    for name, size in zip(names, sizes):
        running += size
        upto = cap_tokens * running // sum(sizes)
        if upto - before > 0:
            d, u = hash_prefix(np.asarray(members[name], dtype=np.int64), upto - before)
            docs.append(d)
            used.append(u)
        before = upto
    return np.concatenate(docs), np.concatenate(used)


@pytest.fixture(scope="module")
def collections_corpus(tmp_path_factory):
    """Three collections over four files, cut into many small shards."""
    root = tmp_path_factory.mktemp("collections")
    for k, prefix in enumerate(("formal/db", "pages/site", "pages/other", "loose")):
        docs = make_docs(prefix, 40, seed=30 + k, min_words=5, max_words=300 if k else 900)
        write_jsonl(root / f"part-{k}.jsonl", docs)
    write_jsonl(root / "held.jsonl", make_docs("x", 4, seed=3, span=(12_000, 20_000)))
    (root / "m.yaml").write_text("sources:\n  - {name: m, share: 1.0, files: ['part-*.jsonl']}\n"
                                 "eval:\n  - {domain: x, files: [held.jsonl]}\n")
    return prepare(root / "m.yaml", root / "out", vocab_size=257, tokenizer="byte", shard_bytes=5_000)


@pytest.mark.parametrize("stratified", [True, False])
def test_prepared_orders_give_the_per_document_rules_subsets(collections_corpus, stratified):
    shard = PreparedCorpus.open(collections_corpus).train_shard("m")
    assert len(PreparedCorpus.open(collections_corpus).meta["sources"][0]["shards"]) > 4
    for cap in (1, 17, 1_000, 12_345, shard.n_tokens // 2, shard.n_tokens - 1, shard.n_tokens):
        got = select_subset(shard, "m", cap, stratified=stratified)
        want = _per_document_rule(shard, "m", cap, stratified)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), cap


@pytest.mark.parametrize("stratified", [True, False])
def test_a_shard_built_in_memory_gives_the_per_document_rules_subsets(stratified):
    rng = np.random.default_rng(3)
    lengths = {f"{c}/{i}" if c else f"doc{i}": int(rng.integers(1, 900)) for i in range(300) for c in ("a", "b", "")
               if rng.random() < 0.5}
    shard = shard_of(lengths)
    for cap in (1, 500, 20_000, shard.n_tokens):
        got = select_subset(shard, "src", cap, stratified=stratified)
        want = _per_document_rule(shard, "src", cap, stratified)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_set_up_memory_is_a_few_bytes_per_document_of_the_source(tmp_path):
    """10^5 documents in 3 collections, arrays memory-mapped as a prepared corpus has them: selecting half
    the tokens allocates at most 16 bytes per document of the source (Python per document took ~180 B)."""
    n = 100_000
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 500, n).astype(np.int64)
    index = np.stack([np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths, lengths * 3], axis=1)
    keys = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64)
    codes = rng.integers(0, 3, n)
    np.save(tmp_path / "index.npy", index)
    np.save(tmp_path / "order.npy", np.argsort(keys, kind="stable"))
    np.save(tmp_path / "strata.npy", np.lexsort((keys, codes)))
    collections = [(c, int((codes == r).sum()), int(lengths[codes == r].sum())) for r, c in enumerate("abc")]
    tokens = np.zeros(int(lengths.sum()), np.uint16)

    def arrays():
        return (np.load(tmp_path / "order.npy", mmap_mode="r"), np.load(tmp_path / "strata.npy", mmap_mode="r"),
                collections)

    shard = DocumentShard("s", "d", tokens, np.load(tmp_path / "index.npy", mmap_mode="r"),
                          ids_loader=lambda: pytest.fail("set-up must not read the document ids"),
                          subset_loader=arrays)
    for stratified in (True, False):
        tracemalloc.start()
        docs, used = select_subset(shard, "s", int(lengths.sum()) // 2, stratified=stratified)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert int(used.sum()) == int(lengths.sum()) // 2
        assert peak <= 16 * n, peak / n
