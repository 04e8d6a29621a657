"""Throughput of the curation models on the demo corpus (rungs/data/demo), per core, and the quality classifier's
held-out AUC.

Each step runs once on the whole corpus (--quick: the first 60 documents of each source) and is timed by the
process's CPU clock (`time.process_time`, every thread counted), so documents per CPU-second is the rate of one
core whatever the tokenizer's or faiss's thread pools do; wall seconds are reported beside it. MB are UTF-8
bytes of the full documents (embedding reads only each document's first 512 tokens, so its MB/s counts bytes it
skipped: the rate a corpus is tagged at). No reference exists in the same run for these, so they are absolute.

Checks: the quality classifier's held-out AUC >= 0.9 on two splits of the demo sources:
edited reference text (stem, books, math) against mailing-list replies (qa), and books + stem + qa against web.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Report, main_for

CORPUS = Path(__file__).resolve().parents[1] / "rungs" / "data" / "demo" / "corpus"
SOURCES = ("code", "web", "stem", "books", "math", "qa")
QUALITY_SPLITS = {"edited_vs_mailing_list": (("stem", "books", "math"), ("qa",)),
                  "books_stem_qa_vs_web": (("books", "stem", "qa"), ("web",))}
N_TOPICS = 20
AUC_TARGET = 0.9


def load_corpus(per_source: int | None) -> dict[str, list[dict[str, str]]]:
    out = {}
    for source in SOURCES:
        with gzip.open(CORPUS / f"{source}.jsonl.gz", "rt") as f:
            docs = [json.loads(line) for line in f]
        out[source] = docs[:per_source] if per_source else docs
    return out


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, CPU seconds of this process, wall seconds) of one call."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = fn()
    return result, time.process_time() - cpu0, time.perf_counter() - wall0


def rates(n_docs: int, n_bytes: int, cpu_s: float, wall_s: float) -> dict[str, float]:
    return {"docs": n_docs, "cpu_seconds": round(cpu_s, 4), "wall_seconds": round(wall_s, 4),
            "docs_per_cpu_second": round(n_docs / cpu_s, 1), "mb_per_cpu_second": round(n_bytes / 1e6 / cpu_s, 3)}


def run(quick: bool) -> Report:
    from curation.embedding import embed_texts
    from curation.quality import train_quality_classifier
    from curation.semantic import diversity_weights, semantic_duplicates
    from curation.topics import assign_topics, fit_topics

    report = Report("curation_models")
    corpus = load_corpus(60 if quick else None)
    docs = [d for source in SOURCES for d in corpus[source]]
    texts, ids = [d["text"] for d in docs], [d["id"] for d in docs]
    source_of = np.array([s for s in SOURCES for _ in corpus[s]])
    n, n_bytes = len(texts), sum(len(t.encode("utf-8")) for t in texts)
    res: dict[str, Any] = {"corpus": {"docs": n, "mb": round(n_bytes / 1e6, 3), "per_source": {s: len(corpus[s]) for s in SOURCES}}}

    embed_texts(texts[:1])  # the weights and tokenizer load once per process; not a per-document cost
    emb, cpu, wall = timed(lambda: embed_texts(texts))
    res["embed_texts"] = rates(n, n_bytes, cpu, wall)
    res["embed_texts"]["max_abs_norm_error"] = float(np.abs(np.linalg.norm(emb, axis=1) - 1).max())

    centroids, cpu, wall = timed(lambda: fit_topics(emb, N_TOPICS, seed=0))
    res["fit_topics"] = rates(n, n_bytes, cpu, wall) | {"n_topics": N_TOPICS}
    labels, cpu, wall = timed(lambda: assign_topics(emb, centroids))
    res["assign_topics"] = rates(n, n_bytes, cpu, wall)
    res["topic_sizes"] = np.bincount(labels, minlength=N_TOPICS).tolist()

    (cluster, keep), cpu, wall = timed(lambda: semantic_duplicates(ids, emb, labels, centroids, eps=0.01))
    res["semantic_duplicates"] = rates(n, n_bytes, cpu, wall) | {
        "eps": 0.01, "removed_docs": int((~keep).sum()), "groups_with_duplicates": int(len(np.unique(cluster[~keep])))}
    weights, cpu, wall = timed(lambda: diversity_weights(emb, labels, centroids))
    res["diversity_weights"] = rates(n, n_bytes, cpu, wall) | {
        "k_neighbors": 10, "min": float(weights.min()), "max": float(weights.max()), "mean": float(weights.mean())}

    for name, (pos_sources, neg_sources) in QUALITY_SPLITS.items():
        pos = [d["text"] for s in pos_sources for d in corpus[s]]
        neg = [d["text"] for s in neg_sources for d in corpus[s]]
        model, cpu, wall = timed(lambda: train_quality_classifier(pos, neg, seed=0))
        train_bytes = sum(len(t.encode("utf-8")) for t in pos + neg)
        res[f"quality_train_{name}"] = rates(len(pos) + len(neg), train_bytes, cpu, wall) | {
            "positive": list(pos_sources), "negative": list(neg_sources), "heldout_auc": round(model.heldout_auc, 4),
            "counts": model.counts}
        report.check(f"quality_heldout_auc_{name}", model.heldout_auc, ">=", AUC_TARGET, valid=(0.0, 1.0))
        if name == "edited_vs_mailing_list":
            scores, cpu, wall = timed(lambda: model.score(texts))
            res["quality_score"] = rates(n, n_bytes, cpu, wall) | {
                "mean_score_per_source": {s: round(float(scores[source_of == s].mean()), 4) for s in SOURCES}}
    report.results = res
    return report


if __name__ == "__main__":
    sys.exit(main_for("curation_models", run))
