"""The work `prepare` farms out, one input file at a time: scan (validate, hash ids, decontaminate) and
tokenize (into bounded shards). Plain functions of their arguments, so the same code runs in the
driver (`--workers 1`) or as Ray tasks, and gives the same bytes either way.

A file's documents are cut into shards of at most `shard_text_bytes` of UTF-8 text (a document is never
split across shards), so shard boundaries depend on the text alone: a rerun knows which documents a
finished shard holds without tokenizing them again. Shard `<split>/<set>/<file:05d>-<k:04d>` is
`.tokens.npy` (each document's ids then EOS), `.index.npy` (int64 [docs, 3]: start in the shard,
tokens with EOS, UTF-8 bytes) and `.ids.json` (document ids), each written to a hidden temporary and
renamed, then `.json` (counts, the tokens file's SHA-256 and the input key) last: a shard whose
`.json` carries the current key is finished, anything else is redone.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rungs.data.atomic import atomic_write_bytes, atomic_write_json, npy_bytes
from rungs.data.decontam import HeldOutIndex, ngram_hash_array
from rungs.data.errors import DataInputError
from rungs.data.manifest import DocumentSet
from rungs.data.tokenizer import TokenIdError, token_dtype

SHARD_TEXT_BYTES = 32 << 20
ENCODE_BATCH_DOCS = 256
# Encoding costs ~150x the text in memory (HF Encoding objects: ids, offsets, token strings), so a
# batch is also cut at this many bytes of text; with documents split at 1 MiB this bounds the peak.
ENCODE_BATCH_BYTES = 2 << 20


def id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "little")


def shard_stem(split: str, name: str, file_index: int, k: int) -> str:
    return f"{split}/{name}/{file_index:05d}-{k:04d}"


def scan_file(ds: DocumentSet, path: Path, *, held_out: HeldOutIndex | None = None,
              ngram_words: int | None = None) -> dict:
    """Read one file through: every document checked (`DataInputError` naming the file otherwise).

    Returns its document count and bytes, the 64-bit hashes of its ids (cross-file duplicate check),
    the documents `held_out` matches ([doc_id, [labels]]: decontamination of a training file) and,
    with `ngram_words`, every document's n-gram hashes (building the held-out index from an eval file).
    """
    docs, n_bytes, ids, removed, ngrams = 0, 0, [], [], []
    for doc in ds.file_documents(path):
        docs += 1
        n_bytes += len(doc.text.encode("utf-8"))
        ids.append(id_hash(doc.doc_id))
        if held_out is not None:
            hits = held_out.matches(doc.text)
            if hits:
                removed.append([doc.doc_id, hits])
        if ngram_words is not None:
            ngrams.append((f"{ds.name}\x00{doc.doc_id}", ngram_hash_array(doc.text, ngram_words)))
    return {"docs": docs, "bytes": n_bytes, "id_hashes": np.array(ids, dtype=np.uint64), "removed": removed,
            "ngrams": ngrams}


def _shard_done(out: Path, stem: str, key: str) -> dict | None:
    path = out / f"{stem}.json"
    if not path.exists():
        return None
    info = json.loads(path.read_text())
    return info if info.get("key") == key else None


def tokenize_file(ds: DocumentSet, path: Path, *, split: str, file_index: int, tokenizer, out: Path, key: str,
                  removed: frozenset[str] = frozenset(), shard_text_bytes: int = SHARD_TEXT_BYTES,
                  on_shard: Callable[[dict], None] | None = None) -> list[dict]:
    """Tokenize one file's documents (less `removed` ids) into shards under `out`; returns their infos.

    Finished shards (their `.json` under `key`) are kept: their documents are read past, not encoded.
    `tokenizer` is a tokenizer object or a callable returning one (built only if a shard needs it).
    """
    infos: list[dict] = []
    state = {"k": 0, "bytes": 0, "done": None}
    batch: list[str] = []
    pieces: list[np.ndarray] = []
    lengths: list[int] = []  # tokens with EOS per encoded document of the open shard
    rows: list[int] = []  # UTF-8 bytes per document of the open shard
    ids: list[str] = []
    tok_box = [tokenizer]

    def tok():
        if callable(tok_box[0]) and not hasattr(tok_box[0], "encode_many"):
            tok_box[0] = tok_box[0]()
        return tok_box[0]

    def open_shard() -> None:
        stem = shard_stem(split, ds.name, file_index, state["k"])
        state["done"] = _shard_done(out, stem, key)
        state["t0"] = time.perf_counter()

    def encode() -> None:
        if not batch:
            return
        t = tok()
        dtype = token_dtype(t.vocab_size)
        eos = np.array([t.eos_id], dtype=dtype)
        try:
            encoded = t.encode_many(batch)
        except TokenIdError as err:
            raise DataInputError(str(err), where=str(path), field="tokenizer") from None
        for ids_ in encoded:
            lengths.append(len(ids_) + 1)
            pieces.append(ids_.astype(dtype, copy=False))
            pieces.append(eos)
        batch.clear()

    def close_shard() -> None:
        stem = shard_stem(split, ds.name, file_index, state["k"])
        if state["done"] is not None:
            info = state["done"]
        else:
            encode()
            t = tok()
            tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=token_dtype(t.vocab_size))
            index = np.zeros((len(rows), 3), dtype=np.int64)
            if rows:
                index[:, 1] = lengths
                index[:, 2] = rows
                index[1:, 0] = np.cumsum(index[:-1, 1])
            blob = npy_bytes(tokens)
            (out / stem).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(out / f"{stem}.tokens.npy", blob)
            atomic_write_bytes(out / f"{stem}.index.npy", npy_bytes(index))
            atomic_write_json(out / f"{stem}.ids.json", {"ids": ids})
            info = {"key": key, "stem": stem, "docs": len(rows), "tokens": int(tokens.size),
                    "bytes": int(index[:, 2].sum()), "sha256": hashlib.sha256(blob).hexdigest()}
            atomic_write_json(out / f"{stem}.json", info)
            info = dict(info, seconds=time.perf_counter() - state["t0"])
        infos.append(info)
        if on_shard is not None:
            on_shard(info)
        pieces.clear()
        lengths.clear()
        rows.clear()
        ids.clear()
        state["k"] += 1
        state["bytes"] = 0

    open_shard()
    batch_bytes = 0
    for doc in ds.file_documents(path):
        if doc.doc_id in removed:
            continue
        n_bytes = len(doc.text.encode("utf-8"))
        if state["bytes"] and state["bytes"] + n_bytes > shard_text_bytes:
            close_shard()
            open_shard()
            batch_bytes = 0
        state["bytes"] += n_bytes
        if state["done"] is not None:
            continue
        ids.append(doc.doc_id)
        if len(batch) >= ENCODE_BATCH_DOCS or (batch and batch_bytes + len(doc.text) > ENCODE_BATCH_BYTES):
            encode()
            batch_bytes = 0
        batch.append(doc.text)
        batch_bytes += len(doc.text)  # characters: a cheap stand-in for bytes (<= 4x)
        rows.append(n_bytes)
    if state["bytes"] or not infos:
        close_shard()
    return infos
