"""Decontamination catches planted overlaps in both directions and nothing else."""

from __future__ import annotations

import json

import pytest

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


@pytest.mark.slow
def test_hashed_ngrams_find_planted_contamination_on_the_demo_corpus_exactly_as_the_exact_rule(tmp_path):
    """The demo corpus plus 40 planted training documents (each quoting 13 words of a held-out document,
    case and punctuation changed), 40 near misses (12 words) and 10 planted held-out documents quoting
    training text: prepare's hashed n-grams (sorted uint64, searched in the scan workers) report exactly
    what the exact tuple rule does, both ways. False matches are measured, not assumed: on the demo's
    ~2.4M training n-grams against the held-out index there are none beyond the exact rule's."""
    import random

    from rungs.data.manifest import DEMO_MANIFEST, load_manifest
    from rungs.data.prepare import plan_inputs
    from rungs.data.scanning import scan

    demo = load_manifest(DEMO_MANIFEST)
    rng = random.Random(7)
    held = [(e.name, d) for e in demo.eval_sets for d in e.documents()]
    train = [d for d in demo.sources[5].documents()]  # qa
    planted, near = [], []
    from rungs.data.decontam import WORD_RE

    for k, (domain, doc) in enumerate(rng.sample(held, 80)):
        words = WORD_RE.findall(doc.text)
        at = rng.randrange(max(1, len(words) - 13))
        if k < 40:
            planted.append({"id": f"planted/{k}", "text": "Quoted: " + ", ".join(words[at:at + 13]).upper() + "."})
        else:
            near.append({"id": f"near/{k}", "text": "Near: " + " ".join(words[at:at + 12]) + " zzqq."})
    leaks = []
    for k, doc in enumerate(rng.sample(train, 10)):
        words = WORD_RE.findall(doc.text)
        leaks.append({"id": f"leak-{k}", "text": "Leak: " + " ".join(words[:13])})
    write_jsonl(tmp_path / "planted.jsonl", planted + near)
    write_jsonl(tmp_path / "leaks.jsonl", leaks)
    corpus = DEMO_MANIFEST.parent / "corpus"
    lines = ["name: planted", "sources:"]
    lines += [f"  - {{name: {s.name}, share: {0.5 if s.name == 'qa' else 0.1}, files: ['{s.files[0]}']}}"
              for s in demo.sources if s.name in ("qa", "math", "books", "stem", "web", "code")]
    lines[2:] = [line.replace("share: 0.1", "share: 0.08") for line in lines[2:]]
    lines.append("  - {name: planted, share: 0.1, files: [planted.jsonl]}")
    lines.append("eval:")
    lines += [f"  - {{domain: {e.name}, files: ['{corpus / e.files[0].name}']}}" for e in demo.eval_sets]
    lines.append("  - {domain: leaks, files: [leaks.jsonl]}")
    (tmp_path / "m.yaml").write_text("\n".join(lines) + "\n")
    manifest = load_manifest(tmp_path / "m.yaml")
    assert abs(sum(s.share for s in manifest.sources) - 1) < 1e-9

    hashed = scan(manifest, plan_inputs(manifest, 32 << 20), 1, 1, None).report
    exact = decontaminate({s.name: [(d.doc_id, d.text) for d in s.documents()] for s in manifest.sources},
                          {e.name: [(d.doc_id, d.text) for d in e.documents()] for e in manifest.eval_sets},
                          manifest.ngram_words).to_json()
    assert hashed == exact
    removed = {(r["source"], r["doc_id"]) for r in hashed["removed_train"]}
    assert {d for s, d in removed if s == "planted"} == {p["id"] for p in planted}  # every plant, no near miss
    flagged = {(r["domain"], r["doc_id"]) for r in hashed["flagged_eval"]}
    assert {("leaks", f"leak-{k}") for k in range(10)} <= flagged


@pytest.mark.parametrize("text", ["Hello, wörld! it's 3 o_clock ÉCOLE naïve 北京 x", "", "!!", "a", "Ⅻ ǅ ß ﬃ İstanbul",
                                  "tab\tnew\nline  double--dash " + "z" * 5_000 + " end"])
def test_vectorised_word_hashes_are_the_hashes_of_the_regex_words(text):
    """prepare hashes words from code points in numpy; they must be exactly the words `\\w+` finds."""
    from rungs.data.decontam import WORD_RE, _hash_new_words, word_hashes_of

    assert word_hashes_of(text).tolist() == _hash_new_words(WORD_RE.findall(text.lower())).tolist()


def test_documents_matched_a_batch_at_a_time_match_as_one_at_a_time(monkeypatch):
    """prepare matches a batch of training documents in one numpy pass: the same held-out documents as
    matching each alone, with no n-gram across two documents and batches split anywhere."""
    import random

    import numpy as np

    from rungs.data import decontam
    from rungs.data.decontam import HeldOutIndex, ngram_hash_array, ngram_hashes_many

    rng = random.Random(7)
    vocab = ["alpha", "beta", "gamma", "ΣΟΦΊΑ", "naïve", "x_y", "北京", "İstanbul", "3", "ǅ"]
    held = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 40))) for _ in range(12)]
    index = HeldOutIndex.build([(f"h\x00{i}", ngram_hash_array(t, 3)) for i, t in enumerate(held)], 3)
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 30))) + rng.choice(["", ".", " ΣΑΣ", "\n"])
             for _ in range(300)]
    texts += ["", "alpha", "alpha beta", "beta gamma", "gamma alpha"]  # each too short alone: joined, they would match
    index_abc = HeldOutIndex.build([("h\x00abc", ngram_hash_array("alpha beta gamma", 3))], 3)
    assert index_abc.matches_many(["alpha beta", "gamma"]) == [[], []]
    assert index_abc.matches_many(["x alpha beta gamma", "alpha"]) == [["h/abc".replace("/", "\x00")], []]
    one_at_a_time = [index.matches(t) for t in texts]
    assert sum(map(bool, one_at_a_time)) > 50  # a test of the matches, not of empty lists
    assert index.matches_many(texts) == one_at_a_time
    monkeypatch.setattr(decontam, "BATCH_CHARS", 40)  # batches of a few documents, split at every size
    assert index.matches_many(texts) == one_at_a_time
    hashes, doc = ngram_hashes_many(texts, 3)
    for i, t in enumerate(texts):
        assert np.array_equal(np.unique(hashes[doc == i]), ngram_hash_array(t, 3)), t
