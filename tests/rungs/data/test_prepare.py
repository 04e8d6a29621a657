"""Manifests, tokenizers and shards: round trips, idempotence, resume, the cache, bad input."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from rungs.data.prepare import ensure_prepared, prepare

from .conftest import write_jsonl, write_manifest


@pytest.mark.parametrize("fixture", ["tiny_byte", "tiny_bpe"])
def test_shards_decode_back_to_every_document_with_its_byte_count(fixture, tiny_manifest, request):
    corpus = PreparedCorpus.open(request.getfixturevalue(fixture))
    manifest = load_manifest(tiny_manifest)
    for ds, shard in [(s, corpus.train_shard(s.name)) for s in manifest.sources] + \
                     [(e, corpus.eval_shard(e.name)) for e in manifest.eval_sets]:
        docs = list(ds.documents())
        assert list(shard.doc_ids) == [d.doc_id for d in docs]
        for i, doc in enumerate(docs):
            start, n, n_bytes = shard.index[i]
            assert shard.tokens[start + n - 1] == corpus.eos_id  # every document ends with EOS
            assert corpus.tokenizer.decode(shard.document_tokens(i).tolist()) == doc.text
            assert n_bytes == len(doc.text.encode("utf-8"))
        if ds.share is not None:
            assert corpus.unique_tokens(ds.name) == shard.n_tokens


def test_bpe_has_the_requested_vocabulary_and_round_trips_arbitrary_text(tiny_bpe):
    tok = PreparedCorpus.open(tiny_bpe).tokenizer
    assert tok.vocab_size == 300
    text = "naïve café — 数学 \t\n def f(x): return x**2  # 🙂"
    ids = tok.encode(text)
    assert max(ids) < 300 and tok.decode(ids) == text


def test_prepare_is_idempotent_and_deterministic(tiny_manifest, tiny_bpe, tmp_path):
    again = prepare(tiny_manifest, tmp_path / "again", vocab_size=300)
    first = json.loads((tiny_bpe / "meta.json").read_text())
    second = json.loads((again / "meta.json").read_text())
    assert [s["sha256"] for s in first["sources"] + first["eval"]] == \
           [s["sha256"] for s in second["sources"] + second["eval"]]
    assert (tiny_bpe / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()
    stamp = (again / "meta.json").stat()
    prepare(tiny_manifest, again, vocab_size=300)  # a finished prepare is a no-op (a rewrite is a new inode)
    assert ((again / "meta.json").stat().st_ino, (again / "meta.json").stat().st_mtime_ns) == \
           (stamp.st_ino, stamp.st_mtime_ns)


def test_an_interrupted_prepare_continues_without_redoing_finished_shards(tiny_manifest, tmp_path, monkeypatch):
    """Shards of ~2 kB of text: source a is several shards; an interruption in its third encode leaves the
    finished shards in place (same inodes) and the rerun encodes only what was not finished."""
    from rungs.data.tokenizer import ByteTokenizer

    reference = prepare(tiny_manifest, tmp_path / "reference", vocab_size=257, tokenizer="byte",
                        shard_bytes=2_000)
    real = ByteTokenizer.encode_many
    calls = []

    def fail_on_third(self, texts):
        calls.append(len(texts))
        if len(calls) == 3:
            raise RuntimeError("simulated interruption")
        return real(self, texts)

    monkeypatch.setattr(ByteTokenizer, "encode_many", fail_on_third)
    out = tmp_path / "resumed"
    with pytest.raises(RuntimeError, match="simulated"):
        prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=2_000)
    assert not (out / "meta.json").exists()
    finished = {p.name: p.stat().st_ino for p in (out / "train" / "a").iterdir()}
    assert sorted(finished) == ["00000-0000.ids.json", "00000-0000.index.npy", "00000-0000.json",
                                "00000-0000.tokens.npy", "00000-0001.ids.json", "00000-0001.index.npy",
                                "00000-0001.json", "00000-0001.tokens.npy"]
    calls.clear()
    monkeypatch.setattr(ByteTokenizer, "encode_many", lambda self, texts: calls.append(len(texts)) or real(self, texts))
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=2_000)
    assert {p.name: p.stat().st_ino for p in (out / "train" / "a").iterdir() if p.name in finished} == finished
    total = sum(len(json.loads(p.read_text())["ids"]) for p in reference.rglob("*.ids.json"))
    done_before = sum(len(json.loads((out / "train" / "a" / f"00000-000{k}.ids.json").read_text())["ids"])
                      for k in (0, 1))
    assert sum(calls) == total - done_before  # every document encoded once over both runs
    meta, ref = (json.loads((d / "meta.json").read_text()) for d in (out, reference))
    assert len(ref["sources"][0]["shards"]) > 2
    assert meta == ref | {"manifest": meta["manifest"]}
    assert _files(out) == _files(reference)


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_ensure_prepared_caches_by_content_and_survives_a_race(tiny_manifest, tmp_path):
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(
        ensure_prepared(tiny_manifest, vocab_size=257, tokenizer="byte", cache_root=tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    assert PreparedCorpus.open(results[0]).train_sources == ["a", "b"]
    assert ensure_prepared(tiny_manifest, vocab_size=300, cache_root=tmp_path) != results[0]  # other tokenizer


def test_missing_file_is_named(tmp_path):
    manifest = write_manifest(tmp_path)
    (tmp_path / "b.jsonl").unlink()
    with pytest.raises(DataInputError, match=r"sources\[1\]\.files.*'b\.jsonl' matches no file"):
        load_manifest(manifest)
    with pytest.raises(DataInputError, match="manifest file not found"):
        load_manifest(tmp_path / "nope.yaml")


def test_shares_must_sum_to_one(tmp_path):
    manifest = write_manifest(tmp_path, shares=(0.6, 0.3))
    with pytest.raises(DataInputError, match=r"sources\.share: source shares sum to 0\.9; they must sum to 1"):
        load_manifest(manifest)


def test_empty_source_is_rejected(tmp_path):
    manifest = write_manifest(tmp_path)
    write_jsonl(tmp_path / "b.jsonl", [{"id": "blank", "text": "   \n"}])
    with pytest.raises(DataInputError, match=r"b\.jsonl: b: holds no non-empty document"):
        prepare(manifest, tmp_path / "out", vocab_size=300)
    assert not (tmp_path / "out").exists()


def test_bad_rows_and_duplicate_ids_are_reported(tmp_path):
    manifest = write_manifest(tmp_path)
    (tmp_path / "a.jsonl").write_text('{"id": "1", "text": "ok"}\nnot json\n')
    with pytest.raises(DataInputError, match="line 2 is not a JSON object"):
        prepare(manifest, tmp_path / "out", vocab_size=300)
    write_jsonl(tmp_path / "a.jsonl", [{"id": "same", "text": "one"}, {"id": "same", "text": "two"}])
    with pytest.raises(DataInputError, match="'same' appears twice"):
        prepare(manifest, tmp_path / "out", vocab_size=300)


def test_text_files_and_parquet_are_documents(tmp_path):
    pd = pytest.importorskip("pandas")
    try:
        pd.DataFrame({"id": ["p1", "p2"], "text": ["first parquet doc", "second"]}).to_parquet(tmp_path / "p.parquet")
    except ImportError:
        pytest.skip("no parquet engine installed")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "one.txt").write_text("a whole file is a document")
    (tmp_path / "m.yaml").write_text(
        "sources:\n  - {name: p, share: 0.5, files: [p.parquet]}\n  - {name: t, share: 0.5, files: ['docs/*.txt']}\n")
    m = load_manifest(tmp_path / "m.yaml")
    assert [(d.doc_id, d.text) for d in m.sources[0].documents()] == [("p1", "first parquet doc"), ("p2", "second")]
    assert [(d.doc_id, d.text) for d in m.sources[1].documents()] == [("docs/one.txt", "a whole file is a document")]
    out = prepare(tmp_path / "m.yaml", tmp_path / "out", vocab_size=257, tokenizer="byte")
    assert np.array_equal(PreparedCorpus.open(out).train_shard("t").document_tokens(0),
                          list(b"a whole file is a document"))


def test_another_shard_size_cuts_the_shards_again_and_the_same_flags_are_a_no_op(tiny_manifest, tiny_byte, tmp_path):
    """The shards of a finished directory are those of its `shard_bytes`: a rerun at another size gives the
    directory a fresh prepare at that size gives (not the old shards), and a rerun with the same size, any
    `split_bytes` or `workers`, is a no-op."""
    out = tmp_path / "out"
    small = prepare(tiny_manifest, tmp_path / "small", vocab_size=257, tokenizer="byte", shard_bytes=2_000)
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=2_000)
    assert len(json.loads((out / "meta.json").read_text())["sources"][0]["shards"]) > 2
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte")  # the default size: one shard a file
    got, want = _files(out), _files(tiny_byte)
    assert got.pop("progress.json") and want.pop("progress.json")
    assert got == want
    stamp = (out / "meta.json").stat()
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte")
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", split_bytes=3_000)  # changes no byte
    assert ((out / "meta.json").stat().st_ino, (out / "meta.json").stat().st_mtime_ns) == \
           (stamp.st_ino, stamp.st_mtime_ns)
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=2_000)  # and back
    got, want = _files(out), _files(small)
    assert got.pop("progress.json") and want.pop("progress.json")
    assert got == want


def test_ensure_prepared_repairs_an_unreadable_meta_json(tiny_manifest, tmp_path):
    target = ensure_prepared(tiny_manifest, vocab_size=257, tokenizer="byte", cache_root=tmp_path)
    meta = (target / "meta.json").read_bytes()
    (target / "meta.json").write_text("{")
    assert ensure_prepared(tiny_manifest, vocab_size=257, tokenizer="byte", cache_root=tmp_path) == target
    assert (target / "meta.json").read_bytes() == meta


def test_the_bpe_trains_on_a_long_run_without_whitespace_in_pieces(tiny_manifest):
    """A word's training time grows with the square of its length (HF's trainer): a word longer than
    `BPE_WORD_BYTES` is trained on as pieces of that length, so no learned token is longer; whole, a 20 kB
    run merged up to a 4,096-byte token. Encoding a longer run afterwards round-trips."""
    from rungs.data.tokenizer import train_bpe

    texts = [d.text for d in load_manifest(tiny_manifest).sources[0].documents()][:2]
    tok = train_bpe(texts + ["x" * 20_000], 300)
    # BPE_WORD_BYTES (1,024); ByteLevel's token strings have a character per byte
    assert max(len(token) for token in tok.hf.get_vocab()) <= 1_024
    run = "see " + "x" * 20_000 + " end"
    assert tok.decode(tok.encode(run)) == run


def test_a_literal_eos_inside_a_document_is_plain_text(tiny_manifest, tiny_bpe, tmp_path):
    """`<|endoftext|>` quoted in a document is its characters, not EOS (a false document boundary whose text
    `decode` drops): in `encode`, `encode_many`, a tokenizer sent to a worker (pickled), and in a prepare's
    shards with a given tokenizer.json (encoded as the byte tokenizer would: only the EOS after it)."""
    import pickle

    text = "Models split documents with <|endoftext|> between them."
    tok = PreparedCorpus.open(tiny_bpe).tokenizer
    for t in (tok, pickle.loads(pickle.dumps(tok))):
        ids = t.encode_many([text])[0].tolist()
        assert t.eos_id not in ids and ids == t.encode(text) and t.decode(ids) == text
    root = tmp_path / "corpus"
    write_jsonl(root / "a.jsonl", [{"id": "gpt", "text": text}, {"id": "other", "text": "a second document"}])
    write_jsonl(root / "x.jsonl", [{"id": "held", "text": "a held-out document"}])
    (root / "m.yaml").write_text("sources:\n  - {name: a, share: 1.0, files: [a.jsonl]}\n"
                                 "eval:\n  - {domain: x, files: [x.jsonl]}\n")
    out = prepare(root / "m.yaml", tmp_path / "out", vocab_size=300, tokenizer=str(tiny_bpe / "tokenizer.json"))
    corpus = PreparedCorpus.open(out)
    shard = corpus.train_shard("a")
    tokens = shard.document_tokens(0).tolist()
    assert corpus.eos_id not in tokens and corpus.tokenizer.decode(tokens) == text
    assert int((shard.tokens[0:shard.n_tokens] == corpus.eos_id).sum()) == 2  # one EOS after each document


def test_a_shard_file_lost_after_its_record_is_written_again_by_a_rerun(tiny_manifest, tmp_path):
    """A shard is finished only with all four of its files, a finished corpus only with every file of its
    shards and tables: a rerun writes what was lost (the rest kept, same inodes) back to the same bytes, with
    `meta.json` removed as well; a complete directory stays a no-op."""
    out = prepare(tiny_manifest, tmp_path / "out", vocab_size=257, tokenizer="byte", shard_bytes=2_000)
    want = _files(out)
    shards = sorted((out / "train" / "a").glob("*.tokens.npy"))
    assert len(shards) > 2
    kept = {p: p.stat().st_ino for p in (out / "train" / "a").iterdir() if not p.name.startswith(shards[1].name[:10])}
    shards[1].unlink()
    with pytest.raises(DataInputError, match=r"00000-0001\.tokens\.npy: is missing .*rerun the `ladder data prepare`"):
        PreparedCorpus.open(out).train_shard("a")
    for lost in (shards[1], shards[1].with_name(shards[1].name.replace(".tokens.npy", ".ids.json")),
                 out / "train" / "a.keys.npy", out / "eval" / "x.docs.npy"):
        lost.unlink(missing_ok=True)
        prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=2_000)
        assert _files(out) == want, lost
    assert {p: p.stat().st_ino for p in kept} == kept  # the other shards were not written again
    shards[-1].unlink()
    (out / "meta.json").unlink()
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=2_000)
    assert _files(out) == want
    stamp = (out / "meta.json").stat()
    prepare(tiny_manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=2_000)
    assert ((out / "meta.json").stat().st_ino, (out / "meta.json").stat().st_mtime_ns) == \
           (stamp.st_ino, stamp.st_mtime_ns)
