"""A tiny corpus with planted duplicates, written as JSONL files and a manifest (shared by the curation tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = [f"w{k}" for k in range(5000)]


def random_text(rng: np.random.Generator, words: int) -> str:
    return " ".join(VOCAB[i] for i in rng.integers(0, len(VOCAB), words))


def near_copy(rng: np.random.Generator, text: str, changed: int) -> str:
    """`text` with `changed` words, spread out, replaced by words the corpus never uses elsewhere."""
    words = text.split()
    step = len(words) // changed
    for k in range(changed):
        words[k * step + step // 2] = f"new{rng.integers(10**9)}"
    return " ".join(words)


def write_corpus(root: Path, *, files_per_source: int = 2, docs_per_file: int = 30, seed: int = 0) -> dict:
    """Two sources (`a` with ids, `b` without: ids from file and line) and one held-out set; returns what was
    planted: `exact` (groups of ids whose normalised texts are equal) and `near` (pairs, exact Jaccard >= 0.8)."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    planted: dict[str, list] = {"exact": [], "near": []}
    bases = [random_text(rng, 200) for _ in range(6)]
    for source, with_ids in (("a", True), ("b", False)):
        for f in range(files_per_source):
            rows = []
            for k in range(docs_per_file):
                doc_id = f"{source}/f{f}-d{k}" if with_ids else f"{source}{f}.jsonl:{k + 1}"
                rows.append((doc_id, random_text(rng, int(rng.integers(60, 200)))))
            if source == "a" and f == 0:
                rows[3] = (rows[3][0], bases[0])
                rows[7] = (rows[7][0], "  " + bases[0].upper() + "\n")  # an exact duplicate after normalisation
                planted["exact"].append(("a", [rows[3][0], rows[7][0]]))
                rows[10] = (rows[10][0], bases[1])
                rows[11] = (rows[11][0], near_copy(rng, bases[1], 4))
                planted["near"].append((("a", rows[10][0]), ("a", rows[11][0])))
            if source == "b" and f == files_per_source - 1:
                rows[5] = (rows[5][0], near_copy(rng, bases[1], 3))  # a near copy across sources and files
                planted["near"].append((("a", "a/f0-d10"), ("b", rows[5][0])))
            path = root / f"{source}{f}.jsonl"
            path.write_text("".join(json.dumps({"id": i, "text": t} if with_ids else {"text": t}) + "\n"
                                    for i, t in rows))
    (root / "eval.jsonl").write_text("".join(json.dumps({"id": f"e{k}", "text": random_text(rng, 80)}) + "\n"
                                             for k in range(10)))
    (root / "manifest.yaml").write_text(
        "name: tiny\nsources:\n"
        "  - {name: a, domain: a, share: 0.5, files: ['a*.jsonl']}\n"
        "  - {name: b, domain: b, share: 0.5, files: ['b*.jsonl']}\n"
        "eval:\n  - {domain: a, files: [eval.jsonl]}\n")
    return planted
