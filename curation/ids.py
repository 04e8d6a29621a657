"""Stable document ids: a document is named by its source and its id in the input (the manifest readers keep
the input's `id` field, else derive `<file>:<line>` from its position), and keyed by a 64-bit hash of both.

The hash (`doc_uid`) is what the duplicate graphs and the keep rule work on: a cluster's id is the smallest
uid among its documents and `keep_one` keeps that document. It depends on the source name and document id
only, never on the worker count, the partitioning or the order files were read in. Two different documents
collide with probability about n^2 / 2^64 (a billion documents: ~3%, and then only two documents share a node
of the duplicate graph).
"""

from __future__ import annotations

import hashlib

import numpy as np

UID_MASK = (1 << 63) - 1  # uids are non-negative int64


def doc_uid(source: str, doc_id: str) -> int:
    digest = hashlib.blake2b(f"{source}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & UID_MASK


def doc_uids(source: str, doc_ids: list[str]) -> np.ndarray:
    return np.fromiter((doc_uid(source, d) for d in doc_ids), dtype=np.int64, count=len(doc_ids))


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on uint64 (wrapping): a fast, well-mixed 64-bit hash."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))
