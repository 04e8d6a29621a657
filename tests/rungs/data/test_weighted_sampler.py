"""Per-document weights (`ladder data mix` with `diversity: weight`): carried from an arm's JSONL through
prepare, counted as Σ weight · tokens, and drawn by the sampler in proportion to the weight; an
unweighted corpus's shards and stream stay what they were."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import yaml
from scipy.stats import chisquare

from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError
from rungs.data.prepare import prepare
from rungs.data.sampler import SourceScaledSampler

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
WEIGHTS = (0.25, 0.5, 1.0, 1.75, 3.0)  # cycled over the documents


def write_corpus(folder, *, weighted: bool, bad_weight=None):
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(40):
        record = {"id": f"doc{i}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20)))}
        if weighted:
            record["weight"] = WEIGHTS[i % len(WEIGHTS)]
        lines.append(record)
    if bad_weight is not None:
        lines[3]["weight"] = bad_weight
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "eval.jsonl").write_text(json.dumps({"id": "e0", "text": "omega psi chi phi upsilon tau"}) + "\n")
    manifest = {"name": "weighted", "sources": [{"name": "s", "domain": "s", "share": 1.0, "files": ["train.jsonl"]}],
                "eval": [{"domain": "s", "files": ["eval.jsonl"]}]}
    (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    return folder / "manifest.yaml", {r["id"]: r.get("weight", 1.0) for r in lines}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("weighted")
    out = {}
    for weighted in (True, False):
        manifest, weights = write_corpus(root / f"in-{weighted}", weighted=weighted)
        out[weighted] = (PreparedCorpus.open(prepare(manifest, root / f"prep-{weighted}", vocab_size=257,
                                                     tokenizer="byte")), weights)
    return out


def test_prepare_carries_each_documents_weight_and_counts_weighted_tokens(corpora):
    corpus, weights = corpora[True]
    shard = corpus.train_shard("s")
    assert shard.weighted
    assert list(shard.weights) == [weights[d] for d in shard.doc_ids]
    lengths = np.asarray(shard.index[:, 1], dtype=np.float64)
    expected = float(np.dot([weights[d] for d in shard.doc_ids], lengths))
    assert corpus.source_info("s")["weighted_tokens"] == pytest.approx(expected, rel=1e-12)
    assert shard.weighted_tokens == pytest.approx(expected, rel=1e-12)
    assert corpus.unique_tokens("s") == int(lengths.sum())  # the raw count stays what it was


def test_an_unweighted_corpus_has_the_same_tokens_and_no_weights(corpora):
    weighted, _ = corpora[True]
    plain, _ = corpora[False]
    a, b = weighted.train_shard("s"), plain.train_shard("s")
    assert np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert not b.weighted and np.all(b.weights == 1.0)
    assert "weighted_tokens" not in plain.source_info("s")
    stems = [s["stem"] for s in plain.source_info("s")["shards"]]
    assert all(set(json.loads((plain.path / f"{stem}.ids.json").read_text())) == {"ids"} for stem in stems)
    assert all("weighted_tokens" not in s for s in plain.source_info("s")["shards"])


def test_the_unweighted_stream_is_each_pass_a_seeded_permutation(corpora):
    import hashlib

    plain, _ = corpora[False]
    sampler = SourceScaledSampler(plain, {"s": {"share": 1.0, "unique_tokens": plain.unique_tokens("s"), "epochs": 3}},
                                  seq_len=16, batch_sequences=2, seed=5)
    stream = sampler.streams[0]
    name_key = int.from_bytes(hashlib.sha256(b"s").digest()[:4], "little")
    for epoch in range(3):
        stream.epoch = epoch
        expected = np.random.default_rng([5, name_key, epoch]).permutation(len(stream.seg_doc))
        assert np.array_equal(stream.order(), expected)


def test_documents_are_drawn_in_proportion_to_their_weights(corpora):
    corpus, weights = corpora[True]
    cap = int(corpus.source_info("s")["weighted_tokens"])
    sampler = SourceScaledSampler(corpus, {"s": {"share": 1.0, "unique_tokens": cap, "epochs": 400}},
                                  seq_len=16, batch_sequences=2, seed=3)
    stream = sampler.streams[0]
    counts = np.zeros(len(stream.seg_doc))
    passes = 400
    for epoch in range(passes):
        stream.epoch = epoch
        counts += np.bincount(stream.order(), minlength=len(stream.seg_doc))
    w = np.asarray([weights[stream.shard.doc_ids[d]] for d in stream.seg_doc])
    expected = w * passes
    assert counts.sum() == pytest.approx(expected.sum(), rel=0.05)
    result = chisquare(counts, expected * counts.sum() / expected.sum())
    assert result.pvalue > 1e-3, result
    # The same seed gives the same draws; another seed others.
    stream.epoch = 7
    first = stream.order().copy()
    stream._order_epoch = -1
    assert np.array_equal(stream.order(), first)


def test_the_stream_emits_documents_in_proportion_to_their_weights(corpora):
    corpus, weights = corpora[True]
    cap = corpus.source_info("s")["weighted_tokens"]
    sampler = SourceScaledSampler(corpus, {"s": {"share": 1.0, "unique_tokens": cap, "epochs": 60}},
                                  seq_len=32, batch_sequences=4, seed=1)
    tokens: dict[str, int] = {}
    for _ in range(int(cap * 60 // (32 * 4))):
        batch = sampler.next_batch()
        for _, _, doc, _, n in batch.segments.tolist():
            doc_id = corpus.train_shard("s").doc_ids[doc]
            tokens[doc_id] = tokens.get(doc_id, 0) + n
    shard = corpus.train_shard("s")
    lengths = dict(zip(shard.doc_ids, shard.index[:, 1].tolist()))
    # Tokens per document over its length: passes it was drawn, ∝ its weight (light by 0.25, heavy by 3).
    per_weight: dict[float, list[float]] = {}
    for doc_id, n in tokens.items():
        per_weight.setdefault(weights[doc_id], []).append(n / lengths[doc_id])
    means = {w: float(np.mean(v)) for w, v in per_weight.items()}
    for w, mean in means.items():
        assert mean / means[1.0] == pytest.approx(w, rel=0.25), means


def test_a_weight_that_is_not_a_positive_number_is_refused(tmp_path):
    for bad in (0, -1.0, "heavy", True):
        manifest, _ = write_corpus(tmp_path / f"bad-{bad}", weighted=True, bad_weight=bad)
        with pytest.raises(DataInputError, match="weight"):
            prepare(manifest, tmp_path / f"out-{bad}", vocab_size=257, tokenizer="byte")
