"""Decontamination catches planted overlaps in both directions and nothing else."""

from __future__ import annotations

import json

from rungs.data.corpus import PreparedCorpus
from rungs.data.decontam import decontaminate
from rungs.data.prepare import prepare

from .conftest import make_docs, write_jsonl, write_manifest


def test_planted_overlaps_are_caught_both_ways_and_nothing_else(tmp_path):
    manifest = write_manifest(tmp_path)
    train_a = make_docs("a", 60, seed=1)
    train_b = make_docs("b", 40, seed=2, span=(7_000, 12_000))
    held = make_docs("x", 12, seed=3, span=(12_000, 20_000))
    held_words = held[3]["text"].split()
    b_words = train_b[5]["text"].split()
    # Training -> held-out: a training document quotes 13 words of a held-out one, with its case and
    # punctuation changed (the rule compares normalised words).
    quote = " ".join(held_words[4:17]).upper().replace(" ", ", ")
    train_a[7]["text"] += f"\n\nAs quoted: {quote}."
    # Held-out -> training: a held-out document contains 13 words of a training document.
    held.append({"id": "x-leak", "text": "Preface. " + " ".join(b_words[2:15]) + " and then new words follow here."})
    # Near misses: 12 shared words, and 13 words with one changed, are not contamination.
    train_a[9]["text"] += " " + " ".join(held_words[20:32])
    changed = held_words[40:53]
    changed[6] = "zzzunrelated"
    train_b[8]["text"] += " " + " ".join(changed)
    write_jsonl(tmp_path / "a.jsonl", train_a)
    write_jsonl(tmp_path / "b.jsonl", train_b)
    write_jsonl(tmp_path / "held" / "x.jsonl", held)

    out = prepare(manifest, tmp_path / "prepared", vocab_size=257, tokenizer="byte")
    report = json.loads((out / "decontamination.json").read_text())
    assert {(r["source"], r["doc_id"]) for r in report["removed_train"]} == {("a", "a-7"), ("b", "b-5")}
    assert {(r["domain"], r["doc_id"]) for r in report["flagged_eval"]} == {("x", "x-3"), ("x", "x-leak")}
    assert report["train_docs_removed"] == {"a": 1, "b": 1}
    assert report["eval_docs_overlapping_train"] == {"x": 2}
    corpus = PreparedCorpus.open(out)
    assert "a-7" not in corpus.train_shard("a").doc_ids and "a-9" in corpus.train_shard("a").doc_ids
    assert "b-5" not in corpus.train_shard("b").doc_ids and "b-8" in corpus.train_shard("b").doc_ids
    assert "x-leak" in corpus.eval_shard("x").doc_ids  # held-out documents are reported, not dropped


def test_ngram_length_is_respected():
    held = {"x": [("h", "one two three four five six seven")]}
    train = {"t": [("five", "zero one two three four five"), ("four", "zero one two three four")]}
    report = decontaminate(train, held, ngram_words=5)
    assert list(report.removed_train) == [("t", "five")]
    assert decontaminate(train, held, ngram_words=6).removed_train == {}
