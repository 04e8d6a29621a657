"""`data_order: keyed`: each pass places a document by a hash of its own id and (seed, source, pass), so a
curated arm that keeps some of the baseline's documents sees them in the baseline's relative order on the
same seed. Checked against the restriction of the full order (numpy), through the real subset selection of
prepared corpora, with the permutation rule as the case that does not have the property; weighted draws
against their expected counts; resume and config identity as every other data rule."""

from __future__ import annotations

import numpy as np
import pytest

from rungs.config import TrainConfigError, parse_config
from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError
from rungs.data.prepare import prepare
from rungs.data.sampler import SourceScaledSampler, doc_id_hashes, keyed_order
from tests.rungs.data.conftest import make_docs, write_jsonl
from tests.rungs.train_helpers import tiny_config


def test_any_subsets_order_is_the_full_order_with_the_others_left_out():
    ids = [f"web/{i}" for i in range(2_000)]
    hashes = doc_id_hashes(ids)
    rng = np.random.default_rng(0)
    for epoch in (0, 3):
        full = keyed_order(hashes, seed=7, source_key=11, epoch=epoch)
        assert sorted(full) == list(range(len(ids)))  # a permutation of the subset
        keep = np.sort(rng.choice(len(ids), 1_500, replace=False))
        sub = keyed_order(hashes[keep], seed=7, source_key=11, epoch=epoch)
        np.testing.assert_array_equal(keep[sub], full[np.isin(full, keep)])
    # another seed, pass or source is another order (rank correlation near 0, not a shifted copy)
    base = keyed_order(hashes, seed=7, source_key=11, epoch=0)
    for other in (dict(seed=8, source_key=11, epoch=0), dict(seed=7, source_key=12, epoch=0),
                  dict(seed=7, source_key=11, epoch=1)):
        assert abs(np.corrcoef(np.argsort(base), np.argsort(keyed_order(hashes, **other)))[0, 1]) < 0.1


def test_weighted_passes_draw_each_document_its_weight_in_expectation():
    hashes = doc_id_hashes([f"d{i}" for i in range(500)])
    weights = np.random.default_rng(1).uniform(0.0, 3.0, 500)
    passes = 300
    counts = np.zeros(500)
    for epoch in range(passes):
        order = keyed_order(hashes, seed=2, source_key=5, epoch=epoch, weights=weights)
        drawn = np.bincount(order, minlength=500)
        assert ((drawn == np.floor(weights)) | (drawn == np.floor(weights) + 1)).all()
        counts += drawn
    frac = weights - np.floor(weights)
    z = (counts / passes - weights) / np.sqrt(np.maximum(frac * (1 - frac), 1e-12) / passes)
    assert abs(z.mean()) < 0.2 and 0.85 < z.std() < 1.15  # Bernoulli coins of the right bias, independent
    # A kept document keeps its draws and its copies' relative order in a subset's pass.
    keep = np.arange(0, 500, 2)
    full = keyed_order(hashes, seed=2, source_key=5, epoch=0, weights=weights)
    sub = keyed_order(hashes[keep], seed=2, source_key=5, epoch=0, weights=weights[keep])
    np.testing.assert_array_equal(keep[sub], full[np.isin(full, keep)])


@pytest.fixture(scope="module")
def full_and_curated(tmp_path_factory):
    """One source's corpus, and the same corpus with every fifth document dropped (a curated arm)."""
    root = tmp_path_factory.mktemp("keyed")
    docs = make_docs("web", 80, seed=4)
    corpora = []
    for name, kept in (("full", docs), ("curated", [d for i, d in enumerate(docs) if i % 5])):
        write_jsonl(root / name / "a.jsonl", kept)
        write_jsonl(root / name / "held.jsonl", make_docs("x", 4, seed=3, span=(12_000, 20_000)))
        (root / name / "manifest.yaml").write_text(
            "name: k\nsources:\n  - {name: a, domain: web, share: 1.0, files: [a.jsonl]}\n"
            "eval:\n  - {domain: x, files: [held.jsonl]}\n")
        corpora.append(PreparedCorpus.open(prepare(root / name / "manifest.yaml", root / f"prep-{name}",
                                                   vocab_size=257, tokenizer="byte")))
    return corpora


def _pass_ids(corpus: PreparedCorpus, order: str, seed: int, epoch: int) -> list[str]:
    """The document ids of one pass over the whole source, in the order the sampler visits them."""
    plan = {"a": {"share": 1.0, "unique_tokens": corpus.train_shard("a").n_tokens, "epochs": 3}}
    stream = SourceScaledSampler(corpus, plan, seq_len=16, batch_sequences=2, seed=seed, order=order).streams[0]
    stream.epoch = epoch
    return [stream.shard.doc_ids[int(stream.seg_doc[i])] for i in stream.order()]


def test_a_curated_corpus_sees_its_kept_documents_in_the_baselines_order_only_when_keyed(full_and_curated):
    full, curated = full_and_curated
    for seed, epoch in ((0, 0), (3, 2)):
        kept = set(_pass_ids(curated, "keyed", seed, epoch))
        assert len(kept) == 64
        assert _pass_ids(curated, "keyed", seed, epoch) == [d for d in _pass_ids(full, "keyed", seed, epoch)
                                                             if d in kept]
        # the seeded permutation of 64 documents is not the permutation of 80 with 16 left out
        assert _pass_ids(curated, "permutation", seed, epoch) != [
            d for d in _pass_ids(full, "permutation", seed, epoch) if d in kept]


def test_a_keyed_stream_resumes_exactly_and_refuses_a_state_of_the_other_order(full_and_curated):
    full, _ = full_and_curated
    plan = {"a": {"share": 1.0, "unique_tokens": 3_000, "epochs": 4}}

    def sampler(order: str) -> SourceScaledSampler:
        return SourceScaledSampler(full, plan, seq_len=16, batch_sequences=2, seed=1, order=order)

    run = sampler("keyed")
    for _ in range(7):
        run.next_batch()
    state = run.state_dict()
    expected = [run.next_batch().inputs for _ in range(5)]
    resumed = sampler("keyed")
    resumed.load_state_dict(state)
    for batch in expected:
        assert np.array_equal(resumed.next_batch().inputs, batch)
    with pytest.raises(DataInputError, match="different plan"):
        sampler("permutation").load_state_dict(state)
    with pytest.raises(DataInputError, match="order must be one of"):
        sampler("random")


def test_the_permutation_order_keeps_every_configs_key_and_keyed_is_another_trial():
    legacy = parse_config(tiny_config())
    assert legacy.data_order == "permutation"
    assert parse_config(tiny_config(data_order="permutation")).key() == legacy.key()
    assert parse_config(tiny_config(data_order="keyed")).key() != legacy.key()
    with pytest.raises(TrainConfigError) as err:
        parse_config(tiny_config() | {"data_order": "shuffled"})
    assert err.value.key == "data_order"
