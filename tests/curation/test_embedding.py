"""curation.embedding: wordllama's shipped weights, read offline, pooled as wordllama pools them."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import socket
from pathlib import Path

import numpy as np
import pytest

from curation import embedding
from curation.embedding import EMBEDDING_DIM, embed_texts

CORPUS = Path(__file__).resolve().parents[2] / "rungs" / "data" / "demo" / "corpus"


def demo_texts(source: str, n: int) -> list[str]:
    with gzip.open(CORPUS / f"{source}.jsonl.gz", "rt") as f:
        return [json.loads(line)["text"] for line in itertools.islice(f, n)]


@pytest.fixture(scope="module")
def demo_slice() -> list[str]:
    return [t for s in ("code", "web", "qa") for t in demo_texts(s, 8)]


def test_rows_are_unit_float32_and_deterministic(demo_slice):
    a = embed_texts(demo_slice)
    assert a.shape == (len(demo_slice), EMBEDDING_DIM) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
    assert np.array_equal(a, embed_texts(demo_slice))
    assert np.array_equal(a, embed_texts(demo_slice, batch_size=5)), "a row must not depend on its batch"


def test_matches_wordllama_own_inference():
    texts = ["The cat sat on the mat.", "def f(x):\n    return x + 1", "Quantum chromodynamics describes quarks."]
    # wordllama's __init__ calls logging.basicConfig: keep the root logger as it was
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        from tokenizers import Tokenizer
        from wordllama.inference import WordLlamaInference
    finally:
        root.handlers[:], root.level = handlers, level
    vectors, _ = embedding._model(embedding.DEFAULT_MAX_TOKENS)
    tokenizer = Tokenizer.from_file(str(embedding.wordllama_dir() / embedding.TOKENIZER_FILE))
    reference = WordLlamaInference(vectors, tokenizer).embed(texts, norm=True)
    np.testing.assert_allclose(embed_texts(texts), reference, atol=1e-6)


def test_loads_with_no_network(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("embed_texts tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "HF_ENDPOINT"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.cache/wordllama to fall back on
    embedding._model.cache_clear()
    out = embed_texts(["offline embedding"])
    assert out.shape == (1, EMBEDDING_DIM) and np.isfinite(out).all()


def test_similar_texts_are_closer_than_unrelated_ones():
    a, b, c = embed_texts(["the cat sat on the mat", "a cat was sitting on a mat", "import numpy as np\nx = np.zeros(3)"])
    assert a @ b > a @ c + 0.2


def test_only_the_first_max_tokens_count():
    head = "the committee approved the budget for the coming year " * 60  # > 512 tokens
    same_start = [head + "and then discussed fishing", head + "quantum field theory lecture notes"]
    short = embed_texts(same_start)
    assert np.array_equal(short[0], short[1])
    longer = embed_texts(same_start, max_tokens=2048)
    assert not np.array_equal(longer[0], longer[1])


def test_empty_documents_share_one_fixed_vector():
    out = embed_texts(["", "", "text"])
    np.testing.assert_array_equal(out[0], np.full(EMBEDDING_DIM, 1 / np.sqrt(EMBEDDING_DIM), dtype=np.float32))
    np.testing.assert_array_equal(out[0], out[1])
    assert abs(out[2] @ out[0]) < 0.99


@pytest.mark.parametrize("bad", [[], "a string", ["ok", 3], None])
def test_bad_texts_are_refused(bad):
    with pytest.raises(ValueError):
        embed_texts(bad)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="batch_size"):
        embed_texts(["x"], batch_size=0)
    with pytest.raises(ValueError, match="max_tokens"):
        embed_texts(["x"], max_tokens=0)
