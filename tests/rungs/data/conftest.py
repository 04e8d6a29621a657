"""Small real-text corpora written on the fly (words drawn from the shipped demo corpus)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from rungs.data.manifest import DEMO_MANIFEST
from rungs.data.prepare import prepare

_WORDS: list[str] = []


def demo_words() -> list[str]:
    if not _WORDS:
        with gzip.open(DEMO_MANIFEST.parent / "corpus" / "eval_books.jsonl.gz", "rt", encoding="utf-8") as f:
            text = " ".join(json.loads(line)["text"] for line in f)
        _WORDS.extend(text.split()[:20_000])
    return _WORDS


def make_docs(prefix: str, n_docs: int, seed: int, min_words: int = 20, max_words: int = 200,
              span: tuple[int, int] = (0, 7_000)) -> list[dict]:
    """Documents of consecutive, non-overlapping runs of words from `span` of the word list (wrapping
    around if the span runs out), so sets drawn from disjoint spans never share a 13-gram."""
    rng = random.Random(seed)
    words = demo_words()[span[0]:span[1]]
    docs, cursor = [], 0
    for i in range(n_docs):
        n = rng.randint(min_words, max_words)
        if cursor + n > len(words):
            cursor = 0
        docs.append({"id": f"{prefix}-{i}", "text": " ".join(words[cursor:cursor + n]) + " é✓"})
        cursor += n
    return docs


def write_jsonl(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")


def write_manifest(root: Path, *, shares=(0.6, 0.4), n_docs=(60, 40), eval_docs=12, extra: str = "") -> Path:
    write_jsonl(root / "a.jsonl", make_docs("a", n_docs[0], seed=1))
    write_jsonl(root / "b.jsonl", make_docs("b", n_docs[1], seed=2, span=(7_000, 12_000)))
    write_jsonl(root / "held" / "x.jsonl", make_docs("x", eval_docs, seed=3, span=(12_000, 20_000)))
    manifest = root / "manifest.yaml"
    manifest.write_text(
        "name: tiny\n"
        "sources:\n"
        f"  - {{name: a, domain: web, share: {shares[0]}, files: [a.jsonl]}}\n"
        f"  - {{name: b, domain: code, share: {shares[1]}, files: [b.jsonl]}}\n"
        "eval:\n"
        "  - {domain: x, files: ['held/*.jsonl']}\n" + extra
    )
    return manifest


@pytest.fixture(scope="session")
def tiny_manifest(tmp_path_factory) -> Path:
    return write_manifest(tmp_path_factory.mktemp("tiny_corpus"))


@pytest.fixture(scope="session")
def tiny_byte(tiny_manifest, tmp_path_factory) -> Path:
    return prepare(tiny_manifest, tmp_path_factory.mktemp("tiny_byte"), vocab_size=257, tokenizer="byte")


@pytest.fixture(scope="session")
def tiny_bpe(tiny_manifest, tmp_path_factory) -> Path:
    return prepare(tiny_manifest, tmp_path_factory.mktemp("tiny_bpe"), vocab_size=300, tokenizer="bpe")


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def many_files_manifest(root: Path) -> Path:
    """Source a in 4 JSONL files, source b in 3 text files (a glob), one held-out file."""
    for k in range(4):
        write_jsonl(root / "a" / f"part-{k}.jsonl", make_docs(f"a{k}", 30, seed=10 + k))
    for k in range(3):
        (root / "b").mkdir(parents=True, exist_ok=True)
        (root / "b" / f"doc-{k}.txt").write_text(" ".join(d["text"] for d in make_docs(f"b{k}", 5, seed=20 + k,
                                                                                       span=(7_000, 12_000))))
    write_jsonl(root / "held.jsonl", make_docs("x", 10, seed=3, span=(12_000, 20_000)))
    manifest = root / "manifest.yaml"
    manifest.write_text("name: many\nsources:\n"
                        "  - {name: a, share: 0.7, files: ['a/*.jsonl']}\n"
                        "  - {name: b, share: 0.3, files: ['b/*.txt']}\n"
                        "eval:\n  - {domain: x, files: [held.jsonl]}\n")
    return manifest
