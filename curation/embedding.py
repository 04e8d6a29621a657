"""Document embeddings for the curation taggers: wordllama's static 256-d token embeddings, mean-pooled.

Why wordllama and not the hidden state of one of the project's own trained rungs: a rung small enough to
train here embeds at low quality (it has seen a few million tokens) and slowly (a transformer forward per
document on 2 CPU cores), while wordllama (`l2_supercat_256`, 32k Llama-2 tokens x 256 dims, distilled
from Llama-2-70B's input embeddings) is a static embedding: a document's vector is the mean of its tokens'
vectors, a gather and a sum in NumPy, thousands of documents a second per core, and the weights ship inside
the wheel. The same static-embedding idea is what SemHash (model2vec) uses for semantic deduplication.

No network, ever: the weights (`wordllama/weights/l2_supercat_256.safetensors`) and the tokenizer
(`wordllama/tokenizers/l2_supercat_tokenizer_config.json`) are read straight from the installed package
directory, found with `importlib.util.find_spec` (which does not execute the package). wordllama's own
loader is bypassed on purpose: it downloads from the Hugging Face hub when a file is missing, falls back to
`Tokenizer.from_pretrained` for the tokenizer, and its `__init__` calls `logging.basicConfig`. A missing
file here is a FileNotFoundError naming the path. The pooling is wordllama's (`WordLlamaInference.embed`
with `norm=True`: mean of the token vectors, then L2 normalisation); tests/curation/test_embedding.py
checks the two agree.

Long documents: only the first `max_tokens` tokens (default 512) are embedded, and the tokenizer only sees
the first `max_tokens * 16` characters (Llama-2 tokens average 3-5 characters on the demo corpus, so the
character cut never binds before the token cut on ordinary text). The cost per document is then bounded,
and a document's vector describes its opening, which is what near-duplicate documents share. Documents
with no tokens (empty text; whitespace is tokenized) all get the same fixed unit vector (1/sqrt(d) in every
dimension), so they are each other's duplicates and nothing else's.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import scipy.sparse as sp

logger = logging.getLogger(__name__)

EMBEDDING_DIM = 256
DEFAULT_MAX_TOKENS = 512
CHARS_PER_TOKEN_CAP = 16  # characters handed to the tokenizer per token embedded
WEIGHTS_FILE = "weights/l2_supercat_256.safetensors"
TOKENIZER_FILE = "tokenizers/l2_supercat_tokenizer_config.json"


def wordllama_dir() -> Path:
    """The installed wordllama package directory, found without importing (running) the package."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the wordllama package is not installed (it ships the embedding weights)")
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=1)
def _model(max_tokens: int) -> tuple[np.ndarray, object]:
    """(token vectors (vocab, 256) float32, tokenizer truncating at `max_tokens`), read from local files."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    root = wordllama_dir()
    weights_path, tokenizer_path = root / WEIGHTS_FILE, root / TOKENIZER_FILE
    for path in (weights_path, tokenizer_path):
        if not path.is_file():
            raise FileNotFoundError(f"wordllama file missing: {path} (this module never downloads it)")
    vectors = np.ascontiguousarray(load_file(str(weights_path))["embedding.weight"], dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != EMBEDDING_DIM:
        raise ValueError(f"{weights_path}: expected (vocab, {EMBEDDING_DIM}) weights, got {vectors.shape}")
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    logger.debug("wordllama weights %s (%d tokens), tokenizer %s", weights_path, vectors.shape[0], tokenizer_path)
    return vectors, tokenizer


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise ValueError(f"texts must be a sequence of str, got {type(texts).__name__}")
    if len(texts) == 0:
        raise ValueError("texts is empty: nothing to embed")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ValueError(f"texts[{bad}] is {type(texts[bad]).__name__}, not str")
    return list(texts)


def embed_texts(texts: Sequence[str], *, batch_size: int = 256, max_tokens: int = DEFAULT_MAX_TOKENS) -> np.ndarray:
    """Embeddings (n, 256) float32, each row L2-normalised: the mean wordllama vector of the first
    `max_tokens` tokens of each text. Deterministic: the same texts give the same bits, in any batch size."""
    texts = _check_texts(texts)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    vectors, tokenizer = _model(max_tokens)
    vocab = vectors.shape[0]
    char_cap = max_tokens * CHARS_PER_TOKEN_CAP
    out = np.empty((len(texts), EMBEDDING_DIM), dtype=np.float32)
    for start in range(0, len(texts), batch_size):
        chunk = [t[:char_cap] for t in texts[start:start + batch_size]]
        ids = [e.ids for e in tokenizer.encode_batch(chunk, add_special_tokens=False)]
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        flat = np.clip(np.fromiter((i for x in ids for i in x), dtype=np.int64, count=int(lengths.sum())), 0, vocab - 1)
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        # Token counts per document as a sparse (docs, vocab) matrix: one sparse-dense product sums each
        # document's token vectors without materialising a (docs, tokens, 256) array.
        counts = sp.csr_matrix((np.ones(flat.size, dtype=np.float32), flat, indptr), shape=(len(chunk), vocab))
        sums = np.asarray(counts @ vectors, dtype=np.float32)
        out[start:start + len(chunk)] = sums / np.maximum(lengths, 1)[:, None].astype(np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    empty = norms[:, 0] <= 1e-12
    out /= np.where(empty[:, None], 1.0, norms)
    out[empty] = np.float32(1.0 / np.sqrt(EMBEDDING_DIM))
    return out
