"""Prepare on Ray workers (one local Ray for this file, 3 CPUs, started once): any number of workers and
any split of the inputs into tasks write the bytes one process writes, a large file included; bad input
found by a worker is the same typed error, with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from rungs.data.prepare import prepare

from . import formats
from .conftest import make_docs, many_files_manifest, tree_bytes, write_jsonl

SHARD_BYTES = 2_500


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """prepare joins a Ray this process already has: one start for the file, not one per prepare."""
    import ray

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def _large_files_manifest(root: Path) -> Path:
    """One source per layout a large file is split along, each file many shards; lines without ids in one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(root / "plain.jsonl", make_docs("j", 30, seed=1))
    lines = b"".join(json.dumps(d).encode() + b"\n" for d in make_docs("g", 45, seed=2, span=(7_000, 12_000)))
    formats.write(root / "members.jsonl.gz", formats.bgzf(lines, 1_500))
    lines = b"".join(json.dumps(d).encode() + b"\n" for d in make_docs("z", 45, seed=4, span=(7_000, 12_000)))
    formats.write(root / "frames.jsonl.zst", formats.zstd_seekable(lines, 1_500))
    rows = make_docs("p", 150, seed=5, min_words=3, max_words=20, span=(7_000, 12_000))
    pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}), root / "rows.parquet",
                   row_group_size=15)
    (root / "anon.jsonl").write_text("".join(json.dumps({"text": d["text"]}) + "\n"
                                             for d in make_docs("n", 25, seed=6, span=(7_000, 12_000))))
    write_jsonl(root / "held.jsonl", make_docs("x", 10, seed=3, span=(12_000, 20_000)))
    (root / "m.yaml").write_text("name: large\nsources:\n"
                                 "  - {name: plain, share: 0.3, files: [plain.jsonl]}\n"
                                 "  - {name: members, share: 0.2, files: [members.jsonl.gz]}\n"
                                 "  - {name: frames, share: 0.2, files: [frames.jsonl.zst]}\n"
                                 "  - {name: rows, share: 0.2, files: [rows.parquet]}\n"
                                 "  - {name: anon, share: 0.1, files: [anon.jsonl]}\n"
                                 "eval:\n  - {domain: x, files: [held.jsonl]}\n")
    return root / "m.yaml"


def test_a_large_file_split_over_1_2_or_3_workers_and_any_split_is_the_same_bytes(tmp_path):
    manifest = _large_files_manifest(tmp_path / "corpus")
    reference = prepare(manifest, tmp_path / "one", vocab_size=257, tokenizer="byte", shard_bytes=SHARD_BYTES)
    meta = json.loads((reference / "meta.json").read_text())
    assert all(len(s["shards"]) >= 4 for s in meta["sources"]), [len(s["shards"]) for s in meta["sources"]]
    whole = {ds.name: [d.doc_id for d in ds.documents()] for ds in load_manifest(manifest).sources}
    corpus = PreparedCorpus.open(reference)
    assert {name: list(corpus.train_shard(name).doc_ids) for name in whole} == whole  # file order, ids of the whole
    for workers, split_bytes in ((2, None), (3, 2 * SHARD_BYTES), (2, 3 * SHARD_BYTES + 1)):  # None: 1 shard a task
        out = prepare(manifest, tmp_path / f"w{workers}-{split_bytes}", vocab_size=257, tokenizer="byte",
                      shard_bytes=SHARD_BYTES, workers=workers, split_bytes=split_bytes)
        assert tree_bytes(out) == tree_bytes(reference), (workers, split_bytes)


def test_one_process_and_ray_workers_write_identical_shards_and_indices(tmp_path):
    manifest = many_files_manifest(tmp_path / "corpus")
    one = prepare(manifest, tmp_path / "one", vocab_size=300, shard_bytes=4_000)
    two = prepare(manifest, tmp_path / "two", vocab_size=300, shard_bytes=4_000, workers=2)
    assert tree_bytes(one) == tree_bytes(two)
    meta = json.loads((one / "meta.json").read_text())
    a_shards = meta["sources"][0]["shards"]
    assert len({s["stem"].rsplit("-", 1)[0] for s in a_shards}) == 4 and len(a_shards) > 4  # 4 files, cut further
    assert sum(s["docs"] for s in a_shards) == meta["sources"][0]["docs"] == 120
    corpus = PreparedCorpus.open(two)
    shard = corpus.train_shard("a")
    ids = [d.doc_id for d in load_manifest(manifest).sources[0].documents()]
    assert list(shard.doc_ids) == ids
    texts = {d.doc_id: d.text for d in load_manifest(manifest).sources[0].documents()}
    for i in (0, 29, 30, 119):  # across file and shard boundaries
        assert corpus.tokenizer.decode(shard.document_tokens(i).tolist()) == texts[ids[i]]
        start, n, _ = shard.index[i]
        assert shard.tokens[start + n - 1] == corpus.eos_id


def test_bad_input_found_by_a_ray_worker_is_the_same_typed_error_and_nothing_is_written(tmp_path):
    manifest = many_files_manifest(tmp_path / "corpus")
    (tmp_path / "corpus" / "a" / "part-2.jsonl").write_bytes(b'{"id": "ok", "text": "fine"}\n\xff\xfe bad bytes\n')
    with pytest.raises(DataInputError, match=r"part-2\.jsonl: a: is not UTF-8 text \(byte 0xff at offset 29\)"):
        prepare(manifest, tmp_path / "out", vocab_size=257, tokenizer="byte", workers=2)
    assert not (tmp_path / "out").exists()


