"""BPB against closed forms and independent float64 references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rungs.data.bpb import document_windows, evaluate_bpb
from rungs.data.corpus import PreparedCorpus


def eval_text(corpus: PreparedCorpus, domain: str = "x") -> list[np.ndarray]:
    shard = corpus.eval_shard(domain)
    return [np.asarray(shard.document_tokens(i), dtype=np.int64) for i in range(shard.n_docs)]


def test_a_model_uniform_over_bytes_scores_8_bits_per_byte(tiny_byte):
    corpus = PreparedCorpus.open(tiny_byte)

    def uniform_over_bytes(inputs):
        logits = torch.zeros(*inputs.shape, 512)
        logits[..., 256:] = -math.inf  # EOS and unused ids get no mass
        return logits

    result = evaluate_bpb(uniform_over_bytes, corpus, seq_len=16, batch_size=5)["x"]
    assert result.bpb == pytest.approx(8.0, abs=1e-12)
    assert result.tokens == result.bytes == sum(len(d) for d in eval_text(corpus))
    assert result.docs == corpus.eval_shard("x").n_docs


@pytest.mark.parametrize("fixture", ["tiny_byte", "tiny_bpe"])
@pytest.mark.parametrize("seq_len,stride", [(8, 3), (16, None), (64, 64), (1000, None)])
def test_a_unigram_model_scores_its_cross_entropy(fixture, seq_len, stride, request):
    corpus = PreparedCorpus.open(request.getfixturevalue(fixture))
    vocab = corpus.tokenizer.vocab_size
    probs = np.random.default_rng(0).dirichlet(np.ones(vocab))
    log_probs = torch.tensor(np.log(probs), dtype=torch.float32)

    def unigram(inputs):
        return log_probs.expand(*inputs.shape, vocab)

    docs = eval_text(corpus)
    # The reference: a float64 loop over every document token, with the model's float32 log-probabilities.
    lp32 = torch.log_softmax(log_probs.double(), -1).numpy()
    nats = 0.0
    for doc in docs:
        for token in doc:
            nats -= lp32[token]
    n_bytes = int(corpus.eval_shard("x").index[:, 2].sum())
    result = evaluate_bpb(unigram, corpus, seq_len=seq_len, stride=stride, batch_size=3)["x"]
    assert result.tokens == sum(len(d) for d in docs)
    assert result.nats == pytest.approx(nats, rel=1e-12)
    assert result.bpb == pytest.approx(nats / (math.log(2) * n_bytes), rel=1e-12)


def oracle_per_byte(corpus: PreparedCorpus, nats_per_byte: float):
    """A model that, at every position, gives the true next token exactly `nats_per_byte` × its bytes nats.

    It finds each input window inside the held-out documents (EOS + doc) to know the next token; the
    mass not on the target is spread evenly, so the target's probability is set through its logit.
    """
    tok = corpus.tokenizer
    vocab = tok.vocab_size
    sequences = [np.concatenate([[corpus.eos_id], d]) for d in eval_text(corpus)]
    if tok.kind == "byte":
        token_bytes = np.ones(vocab)
    else:  # byte-level BPE: one symbol per byte
        token_bytes = np.array([len(tok.hf.id_to_token(i)) for i in range(vocab)], dtype=np.float64)

    def logits_fn(inputs):
        out = torch.zeros(*inputs.shape, vocab, dtype=torch.float64)
        for r, row in enumerate(inputs.numpy()):
            n = len(row)
            while n > 1 and row[n - 1] == corpus.eos_id:  # strip right padding (EOS only starts a document)
                n -= 1
            for seq in sequences:
                hits = [b for b in range(len(seq) - n) if np.array_equal(seq[b:b + n], row[:n])]
                if hits:
                    b = hits[0]
                    for i in range(n):
                        target = int(seq[b + i + 1])
                        nats = nats_per_byte * token_bytes[target]
                        # p = e^L / (e^L + V - 1) = exp(-nats)  =>  L = log((V - 1) / (exp(nats) - 1))
                        out[r, i, target] = math.log((vocab - 1) / math.expm1(nats))
                    break
            else:
                raise AssertionError("window not found in any held-out document")
        return out

    return logits_fn


def test_bpb_normalises_by_bytes_not_tokens(tiny_byte, tiny_bpe):
    per_byte = 0.7
    byte_corpus, bpe_corpus = PreparedCorpus.open(tiny_byte), PreparedCorpus.open(tiny_bpe)
    kw = dict(seq_len=24, stride=10, batch_size=4, max_docs_per_domain=4)
    by_byte = evaluate_bpb(oracle_per_byte(byte_corpus, per_byte), byte_corpus, **kw)["x"]
    by_bpe = evaluate_bpb(oracle_per_byte(bpe_corpus, per_byte), bpe_corpus, **kw)["x"]
    assert by_bpe.tokens < by_byte.tokens  # different token counts...
    assert by_bpe.nats == pytest.approx(by_byte.nats, rel=1e-9)  # ...the same total cross-entropy...
    assert by_bpe.bpb == pytest.approx(by_byte.bpb, rel=1e-9)  # ...the same BPB
    assert by_byte.bpb == pytest.approx(per_byte / math.log(2), rel=1e-9)


@pytest.mark.parametrize("n_tokens", [0, 1, 7, 8, 9, 30, 31])
@pytest.mark.parametrize("seq_len,stride", [(8, 1), (8, 3), (8, 8)])
def test_windows_score_every_token_once_with_maximal_context(n_tokens, seq_len, stride):
    tokens = np.arange(100, 100 + n_tokens)
    scored = []
    for w in document_windows(0, tokens, 0, seq_len, stride):
        assert len(w.inputs) <= seq_len and len(w.inputs) == len(w.targets)
        for i in range(w.score_from, len(w.inputs)):
            context = w.inputs[:i + 1]
            scored.append(int(w.targets[i]))
            position = int(w.targets[i]) - 100
            assert len(context) >= min(position + 1, seq_len - stride + 1)  # never starved of context
    assert scored == list(tokens)
