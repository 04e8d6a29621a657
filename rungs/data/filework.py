"""The work `prepare` farms out, one task per run of segments of one input file (`Unit`): scan (validate,
hash ids, decontaminate) and tokenize (one streamed shard per segment, `rungs.data.shard_writer`).
Plain functions of their arguments, so the same code runs in the driver (`--workers 1`) or as Ray
tasks, and gives the same bytes either way.

A segment's documents are those that start in it (`rungs.data.segments`), so shard boundaries depend
on the file alone: a rerun knows a finished shard's segment and skips it unread. Memory per task is
one encode batch (`ENCODE_BATCH_DOCS` documents, about `ENCODE_BATCH_BYTES` of text), one input line or
row group, and 16 bytes and an id per document of the open shard.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rungs.data.decontam import HeldOutIndex, ngram_hash_array
from rungs.data.errors import DataInputError
from rungs.data.readers import FileSpec, SegmentStats, segment_documents
from rungs.data.segments import FilePlan, Segment
from rungs.data.shard_writer import ShardWriter, shard_files, shard_stem
from rungs.data.storage import DataFile
from rungs.data.tokenizer import TokenIdError, token_dtype

SHARD_BYTES = 32 << 20  # input bytes per shard (compressed bytes for members, uncompressed for Parquet)
SHARD_TEXT_BYTES = SHARD_BYTES  # the name before shards were cut by input position
ENCODE_BATCH_DOCS = 256
# Encoding costs ~150x the text in memory (HF Encoding objects: ids, offsets, token strings), so a
# batch is also cut at this many bytes of text; with documents split at 1 MiB this bounds the peak.
ENCODE_BATCH_BYTES = 2 << 20
__all__ = ["Unit", "scan_unit", "tokenize_unit", "tokenize_documents", "id_hash", "shard_stem", "SHARD_BYTES",
           "ENCODE_BATCH_DOCS", "ENCODE_BATCH_BYTES"]


def id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Unit:
    """One task: consecutive segments of one file of one set."""

    split: str  # "train" or "eval"
    file_index: int
    file: DataFile
    spec: FileSpec
    plan: FilePlan  # the file's format; `plan.segments` are this task's segments

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self.plan.segments


def scan_unit(unit: Unit, *, first_lines: tuple[int | None, ...] | None = None, held_out: HeldOutIndex | None = None,
              ngram_words: int | None = None) -> list[dict]:
    """Read each segment through: every document checked (`DataInputError` naming the file otherwise).

    Per segment: its document count and bytes, its JSONL lines (and whether an id-less line was named
    without knowing the lines before it), the 64-bit hashes of its ids (the duplicate check), the
    documents `held_out` matches ([doc_id, [labels]]: decontamination of a training file) and, with
    `ngram_words`, every document's n-gram hashes (building the held-out index from an eval file)."""
    results = []
    for j, segment in enumerate(unit.segments):
        stats = SegmentStats()
        docs, n_bytes, ids, removed, ngrams = 0, 0, [], [], []
        first = first_lines[j] if first_lines is not None else None

        def read() -> Iterator[tuple[str, str]]:
            nonlocal docs, n_bytes
            for doc in segment_documents(unit.file, unit.plan, segment, unit.spec, first_line=first, stats=stats):
                docs += 1
                n_bytes += len(doc.text.encode("utf-8"))
                ids.append(id_hash(doc.doc_id))
                if ngram_words is not None:
                    ngrams.append((f"{unit.spec.set_name}\x00{doc.doc_id}", ngram_hash_array(doc.text, ngram_words)))
                yield doc.doc_id, doc.text

        if held_out is None:
            for _ in read():
                pass
        else:  # matched a batch of documents at a time
            removed = [[doc_id, found] for doc_id, found in held_out.matching(read()) if found]
        results.append({"docs": docs, "bytes": n_bytes, "lines": stats.lines, "anonymous": stats.anonymous,
                        "id_hashes": np.array(ids, dtype=np.uint64), "removed": removed, "ngrams": ngrams})
    return results


def _shard_done(out: Path, stem: str, key: str) -> dict | None:
    """The record of a finished shard: its `.json` under `key`, with its other three files there (a file
    lost since is written again with the rest of the shard). None when the shard is to be (re)built."""
    path = out / f"{stem}.json"
    if not path.exists():
        return None
    info = json.loads(path.read_text())
    if info.get("key") != key or not all((out / f).exists() for f in shard_files(stem)):
        return None
    return info


def tokenize_unit(unit: Unit, *, tokenizer, out: Path, key: str, first_lines: tuple[int, ...],
                  removed: tuple[frozenset[str], ...], on_shard: Callable[[dict], None] | None = None) -> list[dict]:
    """Tokenize each segment's documents (less its `removed` ids) into its shard under `out`; their infos.

    A finished shard (its `.json` under `key`) is kept and its segment not read. `tokenizer` is a
    tokenizer object or a callable returning one (built only if a shard needs it)."""
    infos: list[dict] = []
    box = [tokenizer]

    def tok():
        if callable(box[0]) and not hasattr(box[0], "encode_many"):
            box[0] = box[0]()
        return box[0]

    for j, segment in enumerate(unit.segments):
        stem = shard_stem(unit.split, unit.spec.set_name, unit.file_index, segment.index)
        info = _shard_done(out, stem, key)
        if info is None:
            info = _tokenize_segment(unit, segment, first_lines[j], removed[j], tok(), out, stem, key)
        infos.append(info)
        if on_shard is not None:
            on_shard(info)
    return infos


def _tokenize_segment(unit: Unit, segment: Segment, first_line: int, removed: frozenset[str], tok, out: Path,
                      stem: str, key: str) -> dict:
    texts: list[str] = []
    ids: list[str] = []
    sizes: list[int] = []
    weights: list[float] = []
    chars = 0
    with ShardWriter(out, stem, token_dtype(tok.vocab_size), key) as writer:
        def flush() -> None:
            nonlocal chars
            if not texts:
                return
            try:
                encoded = tok.encode_many(texts)
            except TokenIdError as err:
                raise DataInputError(str(err), where=str(unit.file), field="tokenizer") from None
            writer.add(ids, sizes, encoded, tok.eos_id, weights)
            texts.clear()
            ids.clear()
            sizes.clear()
            weights.clear()
            chars = 0

        for doc in segment_documents(unit.file, unit.plan, segment, unit.spec, first_line=first_line):
            if doc.doc_id in removed:
                continue
            if len(texts) >= ENCODE_BATCH_DOCS or (texts and chars + len(doc.text) > ENCODE_BATCH_BYTES):
                flush()
            texts.append(doc.text)
            ids.append(doc.doc_id)
            weights.append(doc.weight)
            sizes.append(len(doc.text.encode("utf-8")))
            chars += len(doc.text)  # characters: a cheap stand-in for bytes (<= 4x)
        flush()
        return writer.finish()


def tokenize_documents(tokenizer, texts: list[str], on_batch: Callable[[int], None] | None = None,
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of every text followed by EOS, concatenated, and the [docs, 3] index (start, tokens, bytes).

    In memory (for tests, benchmarks and small inputs; `prepare` streams segments through
    `tokenize_unit`). An id outside the vocabulary raises `TokenIdError`.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    pieces: list[np.ndarray] = []
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    index = np.zeros((len(texts), 3), dtype=np.int64)
    start = 0
    for b, batch in _batches(texts):
        for j, (text, ids) in enumerate(zip(batch, tokenizer.encode_many(batch))):
            n = len(ids) + 1
            index[b + j] = (start, n, len(text.encode("utf-8")))
            pieces.append(ids.astype(dtype, copy=False))
            pieces.append(eos)
            start += n
        if on_batch is not None:
            on_batch(len(batch))
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)
    return tokens, index


def _batches(texts: list[str]):
    """(first index, texts) batches of at most ENCODE_BATCH_DOCS texts and about ENCODE_BATCH_BYTES."""
    begin = 0
    while begin < len(texts):
        end, size = begin, 0
        while end < len(texts) and end - begin < ENCODE_BATCH_DOCS and \
                (end == begin or size + len(texts[end]) <= ENCODE_BATCH_BYTES):
            size += len(texts[end])
            end += 1
        yield begin, texts[begin:end]
        begin = end
