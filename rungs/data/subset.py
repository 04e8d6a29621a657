"""A source's unique subset for a rung, vectorised over the prepared document table.

The rule (`rungs.data.sampler` explains it): documents ordered by a 64-bit hash of "source\\0id",
taken up to exactly the cap (the last one cut), per collection (stratified) or over the whole source
(prefix). `prepare` stores each source's keys and both orders (`.keys/.order/.strata.npy`, memory
mapped), so set-up reads only the head of each collection's order and the lengths of the documents it
takes: its memory and time grow with the subset, not the source. A shard built in memory (tests,
scripts) gets the same arrays computed from its ids.
"""

from __future__ import annotations

import hashlib

import numpy as np

BLOCK_DOCS = 1 << 16


def collection_of(doc_id: str) -> str:
    """The collection a document belongs to: its id up to the first '/' ('' when there is none)."""
    head, sep, _ = doc_id.partition("/")
    return head if sep else ""


def subset_key(source: str, doc_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{source}\x00{doc_id}".encode()).digest()[:8], "little")


def prefix_length(order: np.ndarray, lengths: np.ndarray, cap_tokens: int) -> tuple[int, int]:
    """How many documents of `order` (a possibly memory-mapped index array) reach `cap_tokens` tokens, and
    the tokens the last of them contributes; read a block at a time, nothing kept."""
    total = 0
    for begin in range(0, len(order), BLOCK_DOCS):
        n = np.asarray(lengths[np.asarray(order[begin:begin + BLOCK_DOCS], dtype=np.int64)], dtype=np.int64)
        cumulative = total + np.cumsum(n)
        stop = int(np.searchsorted(cumulative, cap_tokens, side="left"))
        if stop < len(n):
            return begin + stop + 1, int(n[stop]) - (int(cumulative[stop]) - cap_tokens)
        total = int(cumulative[-1])
    return len(order), int(lengths[int(order[-1])]) if len(order) else 0


def fill_prefix(order: np.ndarray, lengths: np.ndarray, n_docs: int, last_used: int, docs_out: np.ndarray,
                used_out: np.ndarray) -> None:
    """Write the first `n_docs` of `order` and the tokens used of each (the last cut to `last_used`)."""
    if not n_docs:
        return
    docs_out[:] = order[:n_docs]
    used_out[:] = lengths[docs_out]
    used_out[-1] = last_used


def prefix_of(order: np.ndarray, lengths: np.ndarray, cap_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents of `order` up to exactly `cap_tokens` tokens: (doc indices, tokens used of each, the
    last one cut at the cap). Allocates 16 bytes per document taken, nothing per document left."""
    n_docs, last = prefix_length(order, lengths, cap_tokens)
    docs, used = np.empty(n_docs, np.int64), np.empty(n_docs, np.int64)
    fill_prefix(order, lengths, n_docs, last, docs, used)
    return docs, used


def caps_by_collection(tokens: list[int], cap_tokens: int) -> list[int]:
    """Each collection's share of `cap_tokens`, proportional to its tokens; cumulative floors make the
    shares sum to exactly `cap_tokens`."""
    total = sum(tokens)
    caps, before, running = [], 0, 0
    for size in tokens:
        running += size
        upto = cap_tokens * running // total
        caps.append(upto - before)
        before = upto
    return caps
