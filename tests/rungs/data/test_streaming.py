"""Prepare at scale: many files per source, bounded shards, zstd and Parquet streams, the cheap cache
key and per-source progress (the same on Ray workers: test_parallel)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from rungs.data.corpus import PreparedCorpus
from rungs.data.manifest import load_manifest
from rungs.data.prepare import prepare

from .conftest import make_docs, many_files_manifest, tree_bytes, write_jsonl


def test_zstd_jsonl_and_parquet_are_read_as_streams(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = make_docs("z", 50, seed=5)
    with pa.CompressedOutputStream(str(tmp_path / "z.jsonl.zst"), "zstd") as f:
        f.write("".join(json.dumps(d) + "\n" for d in docs).encode())
    rows = make_docs("p", 2_500, seed=6, min_words=3, max_words=8, span=(7_000, 12_000))
    pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}),
                   tmp_path / "p.parquet", row_group_size=700)
    write_jsonl(tmp_path / "held.jsonl", make_docs("x", 5, seed=3, span=(12_000, 20_000)))
    (tmp_path / "m.yaml").write_text("sources:\n  - {name: z, share: 0.5, files: [z.jsonl.zst]}\n"
                                     "  - {name: p, share: 0.5, files: [p.parquet]}\n"
                                     "eval:\n  - {domain: x, files: [held.jsonl]}\n")
    m = load_manifest(tmp_path / "m.yaml")
    assert [(d.doc_id, d.text) for d in m.sources[0].documents()] == [(d["id"], d["text"]) for d in docs]
    assert [d.doc_id for d in m.sources[1].documents()] == [r["id"] for r in rows]
    out = prepare(tmp_path / "m.yaml", tmp_path / "out", vocab_size=257, tokenizer="byte")
    corpus = PreparedCorpus.open(out)
    assert corpus.train_shard("p").n_docs == 2_500
    assert bytes(corpus.train_shard("z").document_tokens(49).tolist()).decode() == docs[49]["text"]


def test_a_damaged_zstd_file_is_named(tmp_path):
    from rungs.data.errors import DataInputError

    (tmp_path / "z.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd garbage that is not a zstd frame")
    (tmp_path / "m.yaml").write_text("sources:\n  - {name: z, share: 1.0, files: [z.jsonl.zst]}\n")
    with pytest.raises(DataInputError, match=r"z\.jsonl\.zst: z: is not a readable zstd file"):
        prepare(tmp_path / "m.yaml", tmp_path / "out", vocab_size=257, tokenizer="byte")
    assert not (tmp_path / "out").exists()


def test_the_cache_key_reads_names_sizes_mtimes_and_the_ends_of_each_file(tmp_path):
    """Not every byte: a 3 MB file's key depends on its size, mtime, first and last 8 KiB only."""
    write_jsonl(tmp_path / "a.jsonl", make_docs("a", 40, seed=1))
    (tmp_path / "big.txt").write_bytes(b"x" * 3_000_000)
    (tmp_path / "m.yaml").write_text("sources:\n  - {name: a, share: 0.5, files: [a.jsonl]}\n"
                                     "  - {name: b, share: 0.5, files: [big.txt]}\n")
    key = load_manifest(tmp_path / "m.yaml").content_hash()
    big = tmp_path / "big.txt"
    st = big.stat()

    def edit(offset: int, byte: bytes, keep_mtime: bool) -> str:
        with open(big, "r+b") as f:
            f.seek(offset)
            f.write(byte)
        if keep_mtime:
            os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
        return load_manifest(tmp_path / "m.yaml").content_hash()

    assert edit(1_500_000, b"y", keep_mtime=True) == key  # the documented blind spot: the middle, same mtime
    assert edit(1_500_000, b"x", keep_mtime=False) != key  # any write moves the mtime
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert load_manifest(tmp_path / "m.yaml").content_hash() == key
    assert edit(10, b"y", keep_mtime=True) != key  # the head
    edit(10, b"x", keep_mtime=True)
    assert edit(2_999_990, b"y", keep_mtime=True) != key  # the tail


def test_files_outside_the_manifests_folder_are_keyed_and_prepared(tmp_path):
    """An absolute path (or ../) in `files`: keyed by its absolute path (was a ValueError from relative_to)."""
    write_jsonl(tmp_path / "elsewhere" / "a.jsonl", make_docs("a", 10, seed=1))
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "m.yaml").write_text(f"sources:\n  - {{name: a, share: 1.0, files: "
                                              f"['{tmp_path / 'elsewhere' / 'a.jsonl'}']}}\n")
    out = prepare(tmp_path / "here" / "m.yaml", tmp_path / "out", vocab_size=257, tokenizer="byte")
    assert PreparedCorpus.open(out).train_shard("a").n_docs == 10


def test_progress_reports_documents_megabytes_and_tokens_per_second_per_source(tmp_path, caplog):
    manifest = many_files_manifest(tmp_path / "corpus")
    with caplog.at_level(logging.INFO, logger="rungs.data.prepare"):
        prepare(manifest, tmp_path / "out", vocab_size=257, tokenizer="byte", shard_bytes=4_000)
    lines = [r.getMessage() for r in caplog.records if "tokens/s" in r.getMessage()]
    last_a = [line for line in lines if line.startswith("prepare: tokenize train/a:")][-1]
    assert last_a.startswith("prepare: tokenize train/a: 120 docs, ") and " MB, " in last_a
    assert any(line.startswith("prepare: tokenize eval/x: 10 docs") for line in lines)


def test_the_bpe_sample_is_bounded_and_deterministic(tmp_path):
    from rungs.data.prepare import bpe_sample

    manifest = load_manifest(many_files_manifest(tmp_path / "corpus"))
    small = list(bpe_sample(manifest, {}, sample_bytes=4_000))
    assert small == list(bpe_sample(manifest, {}, sample_bytes=4_000))
    per_source = {ds.name: [d.text for d in ds.documents()] for ds in manifest.sources}
    n_a = next(i for i, t in enumerate(small) if t not in per_source["a"])
    assert small[:n_a] == per_source["a"][:n_a]  # each source's first documents, in file order
    assert sum(len(t.encode()) for t in small[:n_a - 1]) < 2_000 <= sum(len(t.encode()) for t in small[:n_a])
    everything = list(bpe_sample(manifest, {}, sample_bytes=1 << 30))
    assert everything == per_source["a"] + per_source["b"]


def test_inputs_changed_since_a_finished_prepare_are_prepared_again(tmp_path):
    manifest = many_files_manifest(tmp_path / "corpus")
    out = prepare(manifest, tmp_path / "out", vocab_size=257, tokenizer="byte")
    write_jsonl(tmp_path / "corpus" / "a" / "part-9.jsonl", make_docs("a9", 3, seed=99))
    prepare(manifest, out, vocab_size=257, tokenizer="byte")
    assert PreparedCorpus.open(out).train_shard("a").n_docs == 123
    assert np.array_equal(PreparedCorpus.open(out).train_shard("a").document_tokens(0),
                          list(make_docs("a0", 1, seed=10)[0]["text"].encode()))
    (tmp_path / "corpus" / "a" / "part-0.jsonl").unlink()  # a file dropped: its shards go too
    (out / "train" / "old.tokens.npy").write_bytes(b"a file prepare did not write")  # kept: not prepare's
    prepare(manifest, out, vocab_size=257, tokenizer="byte")
    fresh = prepare(manifest, tmp_path / "fresh", vocab_size=257, tokenizer="byte")
    assert (out / "train" / "old.tokens.npy").read_bytes() == b"a file prepare did not write"
    assert sorted(tree_bytes(out)) == sorted([*tree_bytes(fresh), "train/old.tokens.npy"])


def test_a_rerun_with_another_shard_size_redoes_the_shards(tmp_path):
    """Shard boundaries depend on the shard size: a finished shard of another size is not reused."""
    manifest = many_files_manifest(tmp_path / "corpus")
    out = prepare(manifest, tmp_path / "out", vocab_size=257, tokenizer="byte", shard_bytes=4_000)
    (out / "meta.json").unlink()  # as if killed before the end
    prepare(manifest, out, vocab_size=257, tokenizer="byte", shard_bytes=1_000_000)
    fresh = prepare(manifest, tmp_path / "fresh", vocab_size=257, tokenizer="byte", shard_bytes=1_000_000)
    assert tree_bytes(out).keys() == tree_bytes(fresh).keys()
    assert {k: v for k, v in tree_bytes(out).items() if k != "progress.json"} == \
        {k: v for k, v in tree_bytes(fresh).items() if k != "progress.json"}


def test_the_tokenizer_is_loaded_once_per_process_not_once_per_file(tmp_path, monkeypatch):
    """A HF tokenizer loaded per input file is not all given back: +7 MB of RSS per file, which made peak
    RSS grow with the corpus (16x the demo: 96 files)."""
    import rungs.data.vocabulary as vocabulary

    loads = []
    real = vocabulary.load_tokenizer
    monkeypatch.setattr(vocabulary, "load_tokenizer", lambda *a, **k: loads.append(a) or real(*a, **k))
    manifest = many_files_manifest(tmp_path / "corpus")
    prepare(manifest, tmp_path / "out", vocab_size=300)
    assert len(loads) == 1  # 8 input files
