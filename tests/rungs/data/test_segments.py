"""Large inputs cut into segments (in this process): each layout's segments read back exactly the whole
file's documents, whatever the shard size; what cannot be split says why; ids of lines without one and
error line numbers are those of the whole file."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest

from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from rungs.data.prepare import prepare
from rungs.data.readers import SegmentStats, iter_pieces, segment_documents, split_document
from rungs.data.segments import plan_file
from rungs.data.shard_writer import ShardWriter, npy_header

from . import formats
from .conftest import make_docs, write_jsonl


def _lines(n: int = 120, seed: int = 4) -> bytes:
    """JSONL with lines of very different lengths (one longer than several small shards), blank lines,
    CRLF endings and no newline after the last line."""
    rng = random.Random(seed)
    docs = make_docs("s", n, seed=seed, min_words=2, max_words=90)
    docs[40]["text"] = " ".join(d["text"] for d in docs[:12])  # ~7 kB: spans several 700-byte segments
    rows = []
    for i, d in enumerate(docs):
        rows.append(json.dumps(d, ensure_ascii=False) + ("\r\n" if i % 7 == 3 else "\n"))
        if rng.random() < 0.1:
            rows.append("\n")
    return "".join(rows).rstrip("\n").encode()


def _set(root: Path, name: str, text_field: str = "text"):
    (root / "m.yaml").write_text(f"sources:\n  - {{name: s, share: 1.0, files: [{name}], text_field: {text_field}}}\n")
    return load_manifest(root / "m.yaml").sources[0]


def _split_read(ds, shard_bytes: int) -> tuple[list, int, int]:
    """Every segment read on its own (lines before each from the counts of the ones before); the documents,
    segments and lines."""
    file = ds.files[0]
    plan = plan_file(file, shard_bytes)
    docs, lines = [], 0
    for segment in plan.segments:
        stats = SegmentStats()
        docs += [(d.doc_id, d.text) for d in segment_documents(file, plan, segment, ds.spec(file), first_line=lines,
                                                               stats=stats)]
        lines += stats.lines
    return docs, len(plan.segments), lines


LAYOUTS = {
    "jsonl": ("c.jsonl", lambda data: data),
    "bgzf": ("c.jsonl.gz", lambda data: formats.bgzf(data, 1_000)),
    "zstd_frames": ("c.jsonl.zst", lambda data: formats.zstd_frames(data, 1_000)[0]),
    "zstd_seekable": ("c.jsonl.zst", lambda data: formats.zstd_seekable(data, 1_000)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_segments_of_a_file_hold_exactly_its_documents_for_any_shard_size(layout, tmp_path):
    name, encode = LAYOUTS[layout]
    data = _lines()
    formats.write(tmp_path / name, encode(data))
    ds = _set(tmp_path, name)
    whole = [(d.doc_id, d.text) for d in ds.documents()]
    assert len(whole) == 120 and whole[3][1].endswith("é✓")
    for shard_bytes in (300, 700, 2_500, 1 << 30):
        docs, segments, lines = _split_read(ds, shard_bytes)
        assert docs == whole, (layout, shard_bytes)
        assert lines == data.count(b"\n") + 1  # every line counted once, the last has no newline
        assert (segments > 1) == (shard_bytes < (tmp_path / name).stat().st_size), (layout, shard_bytes, segments)


def test_parquet_row_groups_are_segments_and_keep_row_numbers_as_ids(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = make_docs("p", 400, seed=6, min_words=3, max_words=30)
    pq.write_table(pa.table({"body": [r["text"] for r in rows]}), tmp_path / "p.parquet", row_group_size=37)
    ds = _set(tmp_path, "p.parquet", text_field="body")
    whole = [(d.doc_id, d.text) for d in ds.documents()]
    assert whole[0] == ("p.parquet:0", rows[0]["text"]) and whole[-1][0] == "p.parquet:399"
    docs, segments, _ = _split_read(ds, 3_000)
    assert docs == whole and segments > 3


def test_what_cannot_be_split_is_one_segment_that_says_why(tmp_path):
    data = _lines()
    cases = {"m.jsonl.gz": formats.gzip_members(data, 1_000), "one.jsonl.zst": formats.zstd_frames(data, 1 << 20)[0],
             "doc.txt": data}
    expect = {"m.jsonl.gz": "not BGZF", "one.jsonl.zst": "one frame", "doc.txt": "one document"}
    formats.write(tmp_path / "plain.jsonl", data)
    plain = [(d.doc_id, d.text) for d in _set(tmp_path, "plain.jsonl").documents()]
    for name, blob in cases.items():
        formats.write(tmp_path / name, blob)
        plan = plan_file(tmp_path / name, 1_000)
        assert len(plan.segments) == 1 and expect[name] in plan.reason, (name, plan.reason)
        assert plan_file(tmp_path / name, 1 << 30).reason == ""  # within one shard: nothing to say
    for name in ("m.jsonl.gz", "one.jsonl.zst"):  # read whole, they hold the same documents
        assert [t for _, t in _split_read(_set(tmp_path, name), 1_000)[0]] == [t for _, t in plain]


def test_lines_without_ids_are_named_by_their_line_in_the_whole_file(tmp_path, caplog):
    """A later segment does not know the lines before it while it is scanned: it is scanned again once they
    are counted, and its ids are the ones the whole file's reader gives."""
    rows = make_docs("n", 90, seed=8, min_words=5, max_words=60)
    lines = [json.dumps({"text": r["text"]}) if i % 3 else json.dumps(r) for i, r in enumerate(rows)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines[:30]) + "\n\n" + "\n".join(lines[30:]) + "\n")
    write_jsonl(tmp_path / "held.jsonl", make_docs("x", 4, seed=3, span=(12_000, 20_000)))
    (tmp_path / "m.yaml").write_text("sources:\n  - {name: s, share: 1.0, files: [c.jsonl]}\n"
                                     "eval:\n  - {domain: x, files: [held.jsonl]}\n")
    whole = [d.doc_id for d in load_manifest(tmp_path / "m.yaml").sources[0].documents()]
    assert whole[1] == "c.jsonl:2" and whole[-1] == "c.jsonl:91"  # the blank line 31 counts
    with caplog.at_level(logging.INFO, logger="rungs.data.prepare"):
        out = prepare(tmp_path / "m.yaml", tmp_path / "out", vocab_size=257, tokenizer="byte", shard_bytes=1_500)
    assert any("scanning them again with their line numbers" in r.getMessage() for r in caplog.records)
    meta = json.loads((out / "meta.json").read_text())
    shards = meta["sources"][0]["shards"]
    assert len(shards) > 5
    ids = [i for s in shards for i in json.loads((out / f"{s['stem']}.ids.json").read_text())["ids"]]
    assert ids == whole


def test_a_bad_line_deep_in_a_split_file_is_named_by_its_line_number(tmp_path):
    rows = [json.dumps(d) for d in make_docs("b", 200, seed=9)]
    rows[150] = '{"id": "broken", "text": '
    (tmp_path / "c.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "m.yaml").write_text("sources:\n  - {name: s, share: 1.0, files: [c.jsonl]}\n")
    with pytest.raises(DataInputError, match=r"c\.jsonl: s: line 151 is not a JSON object"):
        prepare(tmp_path / "m.yaml", tmp_path / "out", vocab_size=257, tokenizer="byte", shard_bytes=2_000)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("seed", range(4))
def test_pieces_cut_from_a_stream_are_the_pieces_of_the_whole_text(seed):
    rng = random.Random(seed)
    alphabet = ["a", "b", " ", "\n", "é", "✓", "北", "\t", "𝔘"]
    text = "".join(rng.choice(alphabet) if rng.random() < 0.3 else "w" for _ in range(rng.randint(900, 3_000)))
    cuts = sorted(rng.sample(range(1, len(text)), 12))
    chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    for max_bytes in (64, 257, 1_000, 50_000):
        assert list(iter_pieces(iter(chunks), max_bytes)) == split_document(text, max_bytes)


def test_a_streamed_shard_is_the_bytes_np_save_writes(tmp_path):
    from rungs.data.atomic import npy_bytes

    rng = np.random.default_rng(0)
    batches = [[rng.integers(0, 70_000, rng.integers(0, 50)).astype(np.uint32) for _ in range(rng.integers(1, 9))]
               for _ in range(5)]
    with ShardWriter(tmp_path, "train/s/00000-0000", np.uint32, "k") as w:
        for b, batch in enumerate(batches):
            w.add([f"d{b}-{j}" for j in range(len(batch))], [len(x) * 3 for x in batch], batch, eos_id=69_999)
        info = w.finish()
    flat = np.concatenate([np.append(x, np.uint32(69_999)) for batch in batches for x in batch])
    assert (tmp_path / "train/s/00000-0000.tokens.npy").read_bytes() == npy_bytes(flat)
    assert info["tokens"] == flat.size and info["docs"] == sum(map(len, batches))
    assert len(npy_header(np.uint16, 0)) == len(npy_header(np.uint16, 10**15))  # room kept for the shape
    assert [p.name for p in (tmp_path / "train/s").iterdir() if ".tmp" in p.name] == []


def test_a_shards_memory_is_its_encode_batch_not_its_text(tmp_path):
    """Tokens stream to disk batch by batch: a shard of 8x the text peaks at the traced memory of 2x (full
    encode batches both), plus its document table (holding the shard's tokens cost ~3 copies of 2 bytes
    per byte of text here)."""
    import tracemalloc

    from rungs.data.filework import Unit, tokenize_unit
    from rungs.data.tokenizer import ByteTokenizer

    docs = make_docs("m", 200, seed=3, min_words=600, max_words=900)
    peaks = {}
    for copies in (2, 8):
        rows = [dict(d, id=f"{d['id']}@{k}") for k in range(copies) for d in docs]
        write_jsonl(tmp_path / f"c{copies}.jsonl", rows)
        ds = _set(tmp_path, f"c{copies}.jsonl")
        plan = plan_file(ds.files[0], 1 << 30)
        unit = Unit("train", 0, ds.files[0], ds.spec(ds.files[0]), plan)
        tracemalloc.start()
        infos = tokenize_unit(unit, tokenizer=ByteTokenizer(), out=tmp_path / f"out{copies}", key="k",
                              first_lines=(0,), removed=(frozenset(),))
        peaks[copies] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert infos[0]["docs"] == len(rows)
    text = sum(len(d["text"].encode()) for d in docs)
    assert peaks[8] < peaks[2] + 0.1 * 6 * text, (peaks, text)  # the table: ~0.03 B per byte of text here
    assert peaks[8] < 2 * 8 * text, (peaks, text)  # less than one copy of the shard's uint16 tokens
