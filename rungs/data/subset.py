"""A source's unique subset for a rung, vectorised over the prepared document table (#20).

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


def prefix_of(order: np.ndarray, lengths: np.ndarray, cap_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents of `order` (a possibly memory-mapped index array) up to exactly `cap_tokens` tokens,
    read a block at a time: (doc indices, tokens used of each, the last one cut at the cap)."""
    chosen, used, total = [], [], 0
    for begin in range(0, len(order), BLOCK_DOCS):
        block = np.asarray(order[begin:begin + BLOCK_DOCS], dtype=np.int64)
        n = np.asarray(lengths[block], dtype=np.int64)
        cumulative = total + np.cumsum(n)
        stop = int(np.searchsorted(cumulative, cap_tokens, side="left"))
        if stop < len(block):
            chosen.append(block[:stop + 1])
            last = n[:stop + 1].copy()
            last[-1] -= int(cumulative[stop]) - cap_tokens
            used.append(last)
            break
        chosen.append(block)
        used.append(n)
        total = int(cumulative[-1])
    if not chosen:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(chosen), np.concatenate(used)


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
