"""The held-out evals: the intermediate sample is fixed and spans each set, the final eval's BPB is
the number `evaluate_bpb` gives, and its standard error is the ratio estimator's (checked against a
float64 bootstrap over documents and against per-document scoring)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rungs.config import parse_config
from rungs.data.bpb import document_windows, evaluate_bpb, score_windows
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.evaluation import ratio_standard_error, sample_documents, score_domains, spread_order
from tests.rungs.train_helpers import DATA_CACHE, tiny_config


@pytest.fixture(scope="module")
def corpus() -> PreparedCorpus:
    return PreparedCorpus.open(ensure_prepared(vocab_size=512, cache_root=DATA_CACHE))


def bigram_logits(vocab: int = 512):
    """A fixed, seeded bigram model: logits of the next token from the current one."""
    table = torch.from_numpy(np.random.default_rng(7).normal(0.0, 2.0, (vocab, vocab))).float()
    return lambda inputs: table[inputs]


@pytest.mark.parametrize("n", [1, 2, 5, 13, 16, 111])
def test_the_spread_order_is_a_permutation_whose_power_of_two_prefixes_cover_every_stratum(n):
    order = spread_order(n)
    assert sorted(order.tolist()) == list(range(n))
    for k in range(int(math.log2(n)) + 1):  # 2^k <= n
        starts = (np.arange(2 ** k) * n) // 2 ** k  # 2^k equal strata of 0..n-1
        strata = np.searchsorted(starts, order[:2 ** k], side="right") - 1
        assert sorted(strata.tolist()) == list(range(2 ** k)), (n, k)


def test_the_intermediate_sample_is_the_same_every_call_spans_the_set_and_meets_its_budget(corpus):
    for domain in corpus.eval_domains:
        shard = corpus.eval_shard(domain)
        tokens = np.asarray(shard.index[:, 1])
        budget = int(tokens.sum() // 4)
        first, again = sample_documents(shard, budget), sample_documents(shard, budget)
        np.testing.assert_array_equal(first, again)
        assert tokens[first].sum() >= budget
        assert first.min() == 0 and first.max() >= shard.n_docs // 2  # not a prefix of the set
        assert len(first) < shard.n_docs
        # the shortest such prefix of the spread order: one document fewer misses the budget
        fewer = spread_order(shard.n_docs)[:len(first) - 1]
        assert tokens[fewer].sum() < budget
    everything = sample_documents(corpus.eval_shard(corpus.eval_domains[0]), 10 ** 12)
    assert everything.tolist() == list(range(corpus.eval_shard(corpus.eval_domains[0]).n_docs))


def test_the_ratio_standard_error_matches_a_float64_bootstrap_over_documents():
    rng = np.random.default_rng(0)
    n, resamples = 60, 40_000
    nbytes = rng.integers(500, 20_000, n).astype(np.float64)
    bits = nbytes * rng.normal(3.0, 0.4, n)  # documents differ in length and in difficulty
    picks = rng.integers(0, n, (resamples, n))
    boot = bits[picks].sum(axis=1) / nbytes[picks].sum(axis=1)
    assert ratio_standard_error(bits, nbytes) == pytest.approx(boot.std(), rel=0.03)


def test_the_ratio_standard_error_of_equal_length_documents_is_the_standard_error_of_a_mean():
    bits = np.array([3.0, 5.0, 4.0, 6.5, 2.5]) * 100.0
    nbytes = np.full(5, 100.0)
    assert ratio_standard_error(bits, nbytes) == pytest.approx(np.std(bits / 100.0) / math.sqrt(5), rel=1e-12)
    assert math.isnan(ratio_standard_error(bits[:1], nbytes[:1]))


def test_the_final_eval_gives_evaluate_bpb_s_number_and_the_se_of_its_per_document_sums(corpus):
    docs = 2
    cfg = parse_config(tiny_config(final_eval_max_docs_per_domain=docs, eval_tokens_per_domain=3000))
    logits_fn = bigram_logits()
    scores = score_domains(logits_fn, corpus, cfg, final=True)
    reference = evaluate_bpb(logits_fn, corpus, seq_len=cfg.seq_len, batch_size=cfg.eval_batch_size,
                             max_docs_per_domain=docs, stride=cfg.seq_len)
    assert scores.keys() == reference.keys()
    for domain, score in scores.items():
        assert score.bpb == reference[domain].bpb  # the same windows, batches and sum: the same number
        assert score.docs == reference[domain].docs and score.bytes == reference[domain].bytes
        if domain not in ("qa", "stem"):  # (per-document scoring is slow: two domains will do)
            continue
        shard = corpus.eval_shard(domain)
        doc_bits = np.array([score_windows(logits_fn, document_windows(d, shard.document_tokens(d), corpus.eos_id,
                                                                      cfg.seq_len, cfg.seq_len),
                                           cfg.seq_len, 8, corpus.eos_id)[0] / math.log(2) for d in range(docs)])
        doc_bytes = np.asarray(shard.index[:docs, 2], dtype=np.float64)
        ratio = doc_bits.sum() / doc_bytes.sum()
        want_se = math.sqrt(np.sum((doc_bits - ratio * doc_bytes) ** 2)) / doc_bytes.sum()
        assert score.bpb_se == pytest.approx(want_se, rel=1e-9) and score.bpb_se > 0
        sample = sample_documents(shard, 3000)
        if sample.max() < docs:  # the final eval covers the sample: its BPB comes from the same sums
            want = doc_bits[sample].sum() / doc_bytes[sample].sum()
            assert score.sample_bpb == pytest.approx(want, rel=1e-9)
        else:
            assert score.sample_bpb is None


def test_the_intermediate_eval_scores_the_sample_and_no_other_document(corpus):
    cfg = parse_config(tiny_config(eval_tokens_per_domain=1500))
    logits_fn = bigram_logits()
    scores = score_domains(logits_fn, corpus, cfg, final=False)
    for domain, score in scores.items():
        shard = corpus.eval_shard(domain)
        sample = sample_documents(shard, 1500)
        windows = [w for d in sample for w in document_windows(int(d), shard.document_tokens(int(d)), corpus.eos_id,
                                                               cfg.seq_len, cfg.seq_len)]
        nats, tokens = score_windows(logits_fn, windows, cfg.seq_len, cfg.eval_batch_size, corpus.eos_id)
        assert score.docs == len(sample) and score.tokens == tokens
        assert score.bpb == pytest.approx(nats / (math.log(2) * shard.index[sample, 2].sum()), rel=1e-12)
