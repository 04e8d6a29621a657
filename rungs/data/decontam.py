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
from dataclasses import dataclass, field

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
