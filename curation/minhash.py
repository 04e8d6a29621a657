"""MinHash signatures of word 5-gram shingles, LSH band keys, and the exact Jaccard that verifies candidates.

A document's text is lower-cased and cut into words (`\\w+`: punctuation and whitespace differences are
not differences); its shingles are its word 5-grams (a shorter document is one shingle), each a 64-bit
hash of five word hashes (rensa's token hash, then SplitMix64 over a positional combination): a document
is a sorted set of uint64. Signatures are rensa's `RMinHash` over those hashes (`num_perm` = bands x rows,
32-bit values, deterministic given the seed; `benchmarks/curation.py` measures it against datasketch).

Two documents share a band's bucket with probability s^rows per band, so they become candidates with
probability 1 - (1 - s^rows)^bands; 14 bands x 8 rows (datatrove's default) catch 92% of pairs at
Jaccard 0.8, 99% at 0.85, 5.3% at 0.5 and 0.1% at 0.3, with the S-curve's midpoint (1/bands)^(1/rows) = 0.72. Each
candidate pair is then kept only if the exact Jaccard of its shingle sets is at least `threshold`
(NeMo Curator's false-positive check), so LSH's false positives never remove a document.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from curation.ids import splitmix64
from rungs.data.errors import DataInputError

SHINGLE_WORDS = 5
_WORD = re.compile(r"\w+")
# Odd multipliers for the positions of a shingle's words and of a band's rows (from SplitMix64's stream)
_POSITION = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x27D4EB2F165667C5,
                      0x85EBCA77C2B2AE63, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x94D049BB133111EB,
                      0xBF58476D1CE4E5B9, 0xD6E8FEB86659FD93, 0xA0761D6478BD642F, 0xE7037ED1A0B428DB,
                      0x8EBC6AF09C88C6E3, 0x589965CC75374CC3, 0x1D8E4E27C47D124F, 0xD3A2646C6B1B3E5D],
                     dtype=np.uint64)


@dataclass(frozen=True)
class LSHParams:
    bands: int = 14
    rows: int = 8
    threshold: float = 0.7  # exact Jaccard a candidate pair needs to count as a near-duplicate
    seed: int = 42

    def __post_init__(self) -> None:
        for name in ("bands", "rows", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if name == "seed" else 1):
                low = "a non-negative int" if name == "seed" else "an int >= 1"
                raise DataInputError(f"LSHParams.{name} must be {low}, got {value!r}")
        if not 0.0 < self.threshold <= 1.0:  # NaN included: a pair at or above it is a near-duplicate
            raise DataInputError(f"LSHParams.threshold (the exact Jaccard of a near-duplicate pair) must be in (0, 1], "
                                 f"got {self.threshold!r}")

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    def catch_probability(self, jaccard: float | np.ndarray) -> float | np.ndarray:
        return 1.0 - (1.0 - np.asarray(jaccard, dtype=np.float64) ** self.rows) ** self.bands

    def to_dict(self) -> dict:
        return {"bands": self.bands, "rows": self.rows, "threshold": self.threshold, "seed": self.seed,
                "shingle_words": SHINGLE_WORDS, "s_curve_midpoint": (1 / self.bands) ** (1 / self.rows)}


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def shingle_sets(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every document's sorted set of shingle hashes, flat (uint64) with offsets (n + 1): ragged rows."""
    import rensa

    word_lists = [words(t) for t in texts]
    hashed = rensa.RMinHash.hash_token_sets(word_lists)
    rows, offsets = [], [0]
    for h in hashed:
        w = np.array(h, dtype=np.uint64)
        if len(w) >= SHINGLE_WORDS:
            n = len(w) - SHINGLE_WORDS + 1
            with np.errstate(over="ignore"):
                acc = np.zeros(n, dtype=np.uint64)
                for j in range(SHINGLE_WORDS):
                    acc = acc + w[j:j + n] * _POSITION[j]
        elif len(w):
            with np.errstate(over="ignore"):
                acc = np.array([np.sum(w * _POSITION[:len(w)], dtype=np.uint64)], dtype=np.uint64)
        else:
            acc = np.zeros(0, dtype=np.uint64)
        s = np.unique(splitmix64(acc))
        rows.append(s)
        offsets.append(offsets[-1] + len(s))
    flat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.uint64)
    return flat.astype(np.uint64), np.array(offsets, dtype=np.int64)


def signatures(flat: np.ndarray, offsets: np.ndarray, params: LSHParams) -> np.ndarray:
    """(n, num_perm) uint32 MinHash signatures of non-empty shingle sets (rensa; the same for the same seed)."""
    import rensa

    if len(offsets) <= 1:
        return np.zeros((0, params.num_perm), dtype=np.uint32)
    matrix = rensa.RMinHash.digest_matrix_from_flat_token_hashes(flat, offsets.astype(np.uint64), params.num_perm,
                                                                 params.seed)
    return np.array(matrix.to_rows(), dtype=np.uint32).reshape(len(offsets) - 1, params.num_perm)


def band_keys(sigs: np.ndarray, params: LSHParams) -> np.ndarray:
    """(n, bands) uint64: one bucket key per band, a hash of the band's rows and the band's index."""
    n = sigs.shape[0]
    parts = sigs.reshape(n, params.bands, params.rows).astype(np.uint64)
    mult = _POSITION[np.arange(params.rows) % len(_POSITION)]
    with np.errstate(over="ignore"):
        acc = (parts * mult).sum(axis=2, dtype=np.uint64) + np.arange(params.bands, dtype=np.uint64) * _POSITION[-1]
    return splitmix64(acc)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted sets of shingle hashes."""
    if not len(a) and not len(b):
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)
