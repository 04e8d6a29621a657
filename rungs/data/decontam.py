"""Decontamination in both directions by shared word n-grams (GPT-3's 13-gram rule).

Text is normalised to lower-case word tokens (`\\w+`), so the rule ignores punctuation, spacing and
the tokenizer. A training document sharing any n-gram with a held-out document is removed from
training; a held-out document sharing any n-gram with a training document is reported (it stays in
the held-out set, now clean because its training counterparts are gone).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

log = logging.getLogger(__name__)
K = TypeVar("K")  # a document's key beside its text (`HeldOutIndex.matching`)
WORD_RE = re.compile(r"\w+")


def ngram_hashes(text: str, n: int) -> set[int]:
    words = WORD_RE.findall(text.lower())
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


@dataclass
class DecontaminationReport:
    ngram_words: int
    # training documents removed: (source, doc_id) -> held-out "domain/doc_id" it overlaps
    removed_train: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    # held-out documents that overlapped training: (domain, doc_id) -> training "source/doc_id"
    flagged_eval: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    train_docs_checked: dict[str, int] = field(default_factory=dict)
    eval_docs_checked: dict[str, int] = field(default_factory=dict)

    def removed_ids(self, source: str) -> set[str]:
        return {doc for (src, doc) in self.removed_train if src == source}

    def to_json(self) -> dict:
        removed_by_source: dict[str, int] = defaultdict(int)
        for src, _ in self.removed_train:
            removed_by_source[src] += 1
        flagged_by_domain: dict[str, int] = defaultdict(int)
        for dom, _ in self.flagged_eval:
            flagged_by_domain[dom] += 1
        return {
            "rule": f"shared lower-cased word {self.ngram_words}-gram",
            "ngram_words": self.ngram_words,
            "train_docs_checked": self.train_docs_checked,
            "eval_docs_checked": self.eval_docs_checked,
            "train_docs_removed": {s: removed_by_source.get(s, 0) for s in self.train_docs_checked},
            "eval_docs_overlapping_train": {d: flagged_by_domain.get(d, 0) for d in self.eval_docs_checked},
            "removed_train": [{"source": s, "doc_id": d, "overlaps": sorted(v)}
                              for (s, d), v in sorted(self.removed_train.items())],
            "flagged_eval": [{"domain": dom, "doc_id": d, "overlaps": sorted(v)}
                             for (dom, d), v in sorted(self.flagged_eval.items())],
        }


def decontaminate(train: dict[str, list[tuple[str, str]]], held_out: dict[str, list[tuple[str, str]]],
                  ngram_words: int = 13) -> DecontaminationReport:
    """`train`/`held_out` map a set name to [(doc_id, text)]; returns what overlaps, both ways."""
    report = DecontaminationReport(ngram_words=ngram_words)
    index: dict[int, list[str]] = defaultdict(list)  # held-out n-gram -> "domain/doc_id"
    for domain, docs in held_out.items():
        report.eval_docs_checked[domain] = len(docs)
        for doc_id, text in docs:
            for h in ngram_hashes(text, ngram_words):
                index[h].append(f"{domain}\x00{doc_id}")
    for source, docs in train.items():
        report.train_docs_checked[source] = len(docs)
        hits = 0
        for doc_id, text in docs:
            matched = {key for h in ngram_hashes(text, ngram_words) if h in index for key in index[h]}
            if not matched:
                continue
            hits += 1
            report.removed_train[(source, doc_id)] = [m.replace("\x00", "/") for m in matched]
            for key in matched:
                domain, eval_id = key.split("\x00", 1)
                report.flagged_eval.setdefault((domain, eval_id), []).append(f"{source}/{doc_id}")
        log.info("decontamination: %s: %d of %d training documents overlap a held-out set", source, hits, len(docs))
    return report


# ---- hashed n-grams: the scalable form prepare uses ----
# Every word is hashed in numpy from the text's code points (no Python per word): Σ c_k·Q^(k+1) mod 2^64
# over its characters, then a splitmix64 finaliser; an n-gram is Σ_j word[i+j]·P^j mod 2^64 over all
# positions at once. The same value in every process (Python's `hash` of a str is salted per process). Held-out n-grams live in
# a sorted uint64 array searched with `np.searchsorted`: 8 bytes per n-gram plus 4 for its document.
# Two different n-grams share a hash with probability ~2^-64 per pair, so checking 10^12 training
# n-grams against 10^8 held-out ones expects 10^20 / 1.8e19 ≈ 5 false matches (each one removes one
# training document); the planted-contamination test finds exactly the exact rule's matches on the demo.
_P = np.uint64(0x9E3779B97F4A7C15)
_Q = np.uint64(0xBF58476D1CE4E5B9)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_WORD_BLOCK_CELLS = 1 << 22  # characters x words per step: bounds the matrix a document of long words needs


def _hash_new_words(words: list[str]) -> np.ndarray:
    """The word hash of each word, one word at a time in a padded matrix (the reference `word_hashes_of` is
    tested against)."""
    out = np.empty(len(words), dtype=np.uint64)
    if not words:
        return out
    width = max(map(len, words))
    step = max(1, _WORD_BLOCK_CELLS // width)
    powers = np.cumprod(np.full(width, _Q, dtype=np.uint64), dtype=np.uint64)  # Q^1..Q^width
    with np.errstate(over="ignore"):
        for begin in range(0, len(words), step):
            block = np.array(words[begin:begin + step], dtype=f"<U{width}").view(np.uint32).reshape(-1, width)
            out[begin:begin + len(block)] = _mix((block.astype(np.uint64) * powers).sum(axis=1, dtype=np.uint64))
    return out


_WORD_CHAR: np.ndarray | None = None


def _word_char_table() -> np.ndarray:
    """bool per code point: does `\\w` match it (str.isalnum() or '_', as `re` defines it for str)."""
    global _WORD_CHAR
    if _WORD_CHAR is None:
        _WORD_CHAR = np.array([c.isalnum() or c == "_" for c in map(chr, range(0x110000))], dtype=bool)
    return _WORD_CHAR


def word_hashes_of(text: str) -> np.ndarray:
    """The hash of every word of `WORD_RE.findall(text.lower())`, in order, computed over the code points
    in numpy (no Python per word): the same values `_hash_new_words` gives the words."""
    return _lowered_word_hashes(text.lower())[0]


def _lowered_word_hashes(lowered: str) -> tuple[np.ndarray, np.ndarray]:
    """(hash of each `\\w+` word of already lower-cased text, the code-point offset where each word starts)."""
    points = np.frombuffer(lowered.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    empty = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    if not len(points):
        return empty
    is_word = _word_char_table()[points]
    begins = is_word & ~np.concatenate([[False], is_word[:-1]])
    starts = np.flatnonzero(begins)
    if not len(starts):
        return empty
    where = np.flatnonzero(is_word)  # positions of word characters, in order
    word_of = np.cumsum(begins)[where] - 1
    first = np.searchsorted(where, starts)  # index into `where` of each word's first character
    offset = np.arange(len(where)) - first[word_of]  # position of each character within its word
    width = int(offset.max()) + 1
    powers = np.cumprod(np.full(width, _Q, dtype=np.uint64), dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = np.add.reduceat(points[where].astype(np.uint64) * powers[offset], first, dtype=np.uint64)
        return _mix(h), starts


def _mix(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(30)
        h *= _M1
        h ^= h >> np.uint64(27)
        h *= _M2
        h ^= h >> np.uint64(31)
    return h


def ngram_hash_array(text: str, n: int) -> np.ndarray:
    """Unique 64-bit hashes of the lower-cased word n-grams of `text` (sorted uint64; empty when shorter)."""
    return np.unique(_ngrams_of_words(word_hashes_of(text), n))


def _ngrams_of_words(w: np.ndarray, n: int) -> np.ndarray:
    """The hash of each run of `n` consecutive word hashes: Σ_j w[i+j]·P^j mod 2^64 (in order, repeats kept)."""
    m = len(w) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = np.zeros(m, dtype=np.uint64)
    power = np.uint64(1)
    with np.errstate(over="ignore"):
        for j in range(n):
            h += w[j:j + m] * power
            power = power * _P
    return h


# Documents hashed in one numpy pass by `ngram_hashes_many`: the per-call overhead of ~20 numpy operations
# is paid per batch, not per document (most documents are a few hundred words).
BATCH_CHARS = 1 << 20


def ngram_hashes_many(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The word n-gram hashes of several documents in one pass: (hashes, the index in `texts` of each one's
    document), repeats kept, no n-gram spanning two documents. Each document's set of hashes is
    `ngram_hash_array`'s. The texts are lower-cased one by one and joined by a newline (not a word character),
    so each one's words are those of `WORD_RE.findall(text.lower())`."""
    lowered = [t.lower() for t in texts]
    w, starts = _lowered_word_hashes("\n".join(lowered))
    h = _ngrams_of_words(w, n)
    if not len(h):
        return h, np.zeros(0, dtype=np.int64)
    doc_begins = np.cumsum([0] + [len(t) + 1 for t in lowered[:-1]])  # code-point offset of each document
    doc_of_word = np.searchsorted(doc_begins, starts, side="right") - 1
    first, last = doc_of_word[:len(h)], doc_of_word[n - 1:]
    inside = first == last
    return h[inside], first[inside]


class HeldOutIndex:
    """Held-out n-gram hashes (sorted) and, beside each, the held-out document it came from."""

    def __init__(self, hashes: np.ndarray, docs: np.ndarray, labels: list[str], ngram_words: int) -> None:
        order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[order]
        self.docs = docs[order]
        self.labels = labels  # "domain\x00doc_id" per held-out document
        self.ngram_words = ngram_words

    @classmethod
    def build(cls, per_doc: list[tuple[str, np.ndarray]], ngram_words: int) -> HeldOutIndex:
        """`per_doc`: ("domain\\x00doc_id", its n-gram hashes) for every held-out document."""
        labels = [label for label, _ in per_doc]
        hashes = [h for _, h in per_doc]
        docs = [np.full(len(h), i, dtype=np.int32) for i, (_, h) in enumerate(per_doc)]
        return cls(np.concatenate(hashes) if hashes else np.zeros(0, np.uint64),
                   np.concatenate(docs) if docs else np.zeros(0, np.int32), labels, ngram_words)

    def matches(self, text: str) -> list[str]:
        """Labels of the held-out documents sharing an n-gram with `text` (sorted; [] when clean)."""
        if not len(self.hashes):
            return []
        h = ngram_hash_array(text, self.ngram_words)
        if not len(h):
            return []
        left = np.searchsorted(self.hashes, h, side="left")
        right = np.searchsorted(self.hashes, h, side="right")
        hit = right > left
        if not hit.any():
            return []
        found = np.unique(np.concatenate([self.docs[a:b] for a, b in zip(left[hit].tolist(), right[hit].tolist())]))
        return sorted(self.labels[i] for i in found.tolist())

    def matches_many(self, texts: list[str]) -> list[list[str]]:
        """`matches` of each text, hashed and searched a batch of documents at a time (`matching`)."""
        return [found for _, found in self.matching(enumerate(texts))]

    def matching(self, docs: Iterable[tuple[K, str]]) -> Iterator[tuple[K, list[str]]]:
        """(key, `matches` of its text) for each (key, text) of `docs`, in order: the documents are read a
        batch of about `BATCH_CHARS` characters at a time, each batch hashed and searched in one numpy pass,
        so no more than a batch is held."""
        batch: list[tuple[K, str]] = []
        chars = 0
        for key, text in docs:
            batch.append((key, text))
            chars += len(text)
            if chars >= BATCH_CHARS:
                yield from self._match_batch(batch)
                batch, chars = [], 0
        if batch:
            yield from self._match_batch(batch)

    def _match_batch(self, batch: list[tuple[K, str]]) -> list[tuple[K, list[str]]]:
        found: dict[int, set[int]] = defaultdict(set)
        if len(self.hashes):
            h, doc = ngram_hashes_many([text for _, text in batch], self.ngram_words)
            left = np.searchsorted(self.hashes, h, side="left")
            right = np.searchsorted(self.hashes, h, side="right")
            hit = np.flatnonzero(right > left)
            for d, a, b in zip(doc[hit].tolist(), left[hit].tolist(), right[hit].tolist()):
                found[d].update(self.docs[a:b].tolist())
        return [(key, sorted(self.labels[i] for i in found[d]) if d in found else [])
                for d, (key, _) in enumerate(batch)]
