"""Decontamination in both directions by shared word n-grams (GPT-3's 13-gram rule).

Text is normalised to lower-case word tokens (`\\w+`), so the rule ignores punctuation, spacing and
the tokenizer. A training document sharing any n-gram with a held-out document is removed from
training; a held-out document sharing any n-gram with a training document is reported (it stays in
the held-out set, now clean because its training counterparts are gone).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)
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
# A word is hashed once (blake2b, 8 bytes; stable across processes, unlike `hash`), an n-gram is the
# polynomial Σ_j word[i+j]·P^j mod 2^64 computed over all positions at once in numpy. Held-out n-grams
# live in a sorted uint64 array searched with `np.searchsorted`: 8 bytes per n-gram plus 4 for its
# document. Two different n-grams share a 64-bit hash with probability ~2^-64 per pair, so a check of
# 10^12 training n-grams against 10^8 held-out ones expects 10^20 / 1.8e19 ≈ 5 false matches (each one
# removes one training document); the planted-contamination test measures equality with the exact `decontaminate` on the demo corpus.
_P = np.uint64(0x9E3779B97F4A7C15)
_WORD_CACHE: dict[str, int] = {}
_WORD_CACHE_MAX = 1 << 20


def _word_hashes(words: list[str]) -> np.ndarray:
    cache = _WORD_CACHE
    if len(cache) > _WORD_CACHE_MAX:
        cache.clear()
    out = np.empty(len(words), dtype=np.uint64)
    for i, w in enumerate(words):
        h = cache.get(w)
        if h is None:
            h = cache[w] = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
        out[i] = h
    return out


def ngram_hash_array(text: str, n: int) -> np.ndarray:
    """Unique 64-bit hashes of the lower-cased word n-grams of `text` (sorted uint64; empty when shorter)."""
    words = WORD_RE.findall(text.lower())
    m = len(words) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    w = _word_hashes(words)
    h = np.zeros(m, dtype=np.uint64)
    power = np.uint64(1)
    with np.errstate(over="ignore"):
        for j in range(n):
            h += w[j:j + m] * power
            power = power * _P
    return np.unique(h)


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
