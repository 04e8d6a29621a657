"""One enormous document: split at MAX_DOCUMENT_BYTES into pieces that keep its id, memory bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rungs.data.corpus import PreparedCorpus
from rungs.data.manifest import MAX_DOCUMENT_BYTES, PART_SUFFIX, load_manifest, split_document
from rungs.data.prepare import prepare

from .conftest import demo_words

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("text", [
    "short\n",
    ("line of words\n" * 40) + "tail",
    "x" * 100 + " " + "y" * 300,  # no newline: cut at whitespace
    "z" * 700,  # no whitespace at all: cut at the limit
    "é✓🙂 mixed\n" * 50,  # multi-byte characters never cut in half
])
def test_split_document_pieces_are_bounded_and_concatenate_back(text):
    pieces = split_document(text, max_bytes=256)
    assert "".join(pieces) == text
    assert all(0 < len(p.encode("utf-8")) <= 256 for p in pieces)
    if len(text.encode("utf-8")) <= 256:
        assert pieces == [text]


def test_split_prefers_a_newline_then_whitespace_in_the_second_half():
    text = ("a" * 150 + "\n") + ("b" * 60 + " ") + "c" * 200
    first = split_document(text, max_bytes=256)[0]
    assert first == "a" * 150 + "\n"  # the newline at 151 beats the later space
    text = "a" * 50 + "\n" + "b" * 150 + " " + "c" * 200
    assert split_document(text, max_bytes=256)[0] == "a" * 50 + "\n" + "b" * 150 + " "  # newline too early


def test_a_long_text_file_becomes_pieces_that_keep_its_id_and_round_trip(tmp_path):
    words = demo_words()
    lines = [" ".join(words[i:i + 11]) + "\n" for i in range(0, len(words) - 11, 11)]
    text = "".join(lines * (MAX_DOCUMENT_BYTES * 5 // 2 // len("".join(lines)) + 1))  # ~2.5 MiB
    (tmp_path / "big.txt").write_text(text, encoding="utf-8")
    (tmp_path / "small.txt").write_text("a small document", encoding="utf-8")
    (tmp_path / "m.yaml").write_text("sources:\n  - {name: t, share: 1.0, files: ['*.txt']}\n")
    docs = list(load_manifest(tmp_path / "m.yaml").sources[0].documents())
    assert [d.doc_id for d in docs] == [f"big.txt{PART_SUFFIX}{k}" for k in range(3)] + ["small.txt"]
    assert "".join(d.text for d in docs[:3]) == text
    assert all(d.text.endswith("\n") for d in docs[:2])  # cut at line boundaries
    shard = PreparedCorpus.open(prepare(tmp_path / "m.yaml", tmp_path / "out", vocab_size=257,
                                        tokenizer="byte")).train_shard("t")
    assert shard.doc_ids == tuple(d.doc_id for d in docs)
    assert np.array_equal(np.concatenate([shard.document_tokens(k) for k in range(3)]),
                          np.frombuffer(text.encode("utf-8"), dtype=np.uint8))
    assert shard.index[:3, 2].max() <= MAX_DOCUMENT_BYTES


# VmHWM (this address space's high-water mark), not getrusage's ru_maxrss: Linux carries ru_maxrss across
# exec from the parent, so a child of a pytest process that once held 1.5 GB reported 1.5 GB before it ran.
_PEAK_RSS = textwrap.dedent("""
    import sys
    from pathlib import Path
    from rungs.data.prepare import prepare

    def hwm_bytes():
        line = next(row for row in open("/proc/self/status") if row.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    root = Path(sys.argv[1])
    before = hwm_bytes()
    prepare(root / "m.yaml", root / "out", vocab_size=300)
    print(before, hwm_bytes())
""")


@pytest.mark.slow
def test_a_16_mb_single_document_prepares_within_1_5_gb(tmp_path):
    """Was ~3 GB (the BPE trainer and encode_batch build ~100-150 bytes per byte of one string)."""
    words = demo_words()
    lines = [" ".join(words[i:i + 12]) + "\n" for i in range(0, len(words) - 12, 12)]
    block = "".join(lines)
    text = block * (16_000_000 // len(block) + 1)
    (tmp_path / "big.txt").write_text(text, encoding="utf-8")
    (tmp_path / "held.txt").write_text(" ".join(reversed(words[:400])), encoding="utf-8")  # no shared 13-gram
    (tmp_path / "m.yaml").write_text("sources:\n  - {name: a, share: 1.0, files: [big.txt]}\n"
                                     "eval:\n  - {domain: x, files: [held.txt]}\n")
    del text, block, lines
    run = subprocess.run([sys.executable, "-c", _PEAK_RSS, str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO, timeout=3600)  # a far guard; the run takes well under a minute on one core
    assert run.returncode == 0, run.stderr
    before, peak = map(int, run.stdout.split())
    assert peak < 1.5e9, f"peak RSS {peak / 1e6:.0f} MB (at start {before / 1e6:.0f} MB)"
    corpus = PreparedCorpus.open(tmp_path / "out")
    assert corpus.train_shard("a").n_docs == 16  # 16 MB in pieces of at most 1 MiB


def test_one_enormous_jsonl_line_is_split_under_its_own_id(tmp_path):
    text = ("word " * 20 + "\n") * (5 * MAX_DOCUMENT_BYTES // 2 // 101)  # ~2.5 MiB in one JSON line
    write = '{"id": "books/huge", "text": ' + json.dumps(text) + '}\n{"id": "books/small", "text": "tiny"}\n'
    (tmp_path / "a.jsonl").write_text(write, encoding="utf-8")
    (tmp_path / "m.yaml").write_text("sources:\n  - {name: a, share: 1.0, files: [a.jsonl]}\n")
    docs = list(load_manifest(tmp_path / "m.yaml").sources[0].documents())
    assert [d.doc_id for d in docs] == [f"books/huge{PART_SUFFIX}{k}" for k in range(3)] + ["books/small"]
    assert "".join(d.text for d in docs[:3]) == text
    assert all(len(d.text.encode()) <= MAX_DOCUMENT_BYTES for d in docs)
