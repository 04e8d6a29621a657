"""Build tokenized shards from a manifest: decontaminate, train the tokenizer, tokenize, index.

Layout of a prepared directory:

    meta.json                   written last: the key, tokenizer, per-set counts and shard hashes
    tokenizer.json              the HF BPE (absent for the byte tokenizer)
    decontamination.json        the both-ways overlap report
    train/<source>.tokens.npy   uint16 (uint32 for vocabularies over 65,535) tokens, each document + EOS
    train/<source>.index.npy    int64 [docs, 3]: start, tokens (with EOS), UTF-8 bytes of the text
    train/<source>.ids.json     document ids in index order
    eval/<domain>.*             the same for the held-out sets

Every file is written to a temporary name and renamed into place, and `progress.json` records the
steps done under the input key, so an interrupted prepare continues where it stopped and a
finished one is a no-op. Same inputs give byte-identical shards (same hashes).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rungs.data.decontam import decontaminate
from rungs.data.errors import DataInputError
from rungs.data.manifest import DEMO_MANIFEST, Manifest, load_manifest
from rungs.data.tokenizer import ByteTokenizer, load_tokenizer, train_bpe

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
ENCODE_BATCH_DOCS = 256


def input_key(manifest: Manifest, tokenizer: str, vocab_size: int) -> str:
    h = hashlib.sha256(f"v{FORMAT_VERSION}|{tokenizer}|{vocab_size}|".encode())
    h.update(manifest.content_hash().encode())
    return h.hexdigest()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _atomic_write_json(path: Path, payload: dict) -> None:
    _atomic_write_bytes(path, (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode())


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def tokenize_documents(tokenizer, texts: list[str], on_batch: Callable[[int], None] | None = None,
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of every text followed by EOS, concatenated, and the [docs, 3] index (start, tokens, bytes).

    `on_batch(n_docs)` is called after each batch of documents (progress display).
    """
    dtype = np.uint16 if tokenizer.vocab_size <= 65_536 else np.uint32
    pieces: list[np.ndarray] = []
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    index = np.zeros((len(texts), 3), dtype=np.int64)
    start = 0
    for b in range(0, len(texts), ENCODE_BATCH_DOCS):
        batch = texts[b:b + ENCODE_BATCH_DOCS]
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


class _Progress:
    """`progress.json`: the input key and the steps completed under it."""

    def __init__(self, out_dir: Path, key: str) -> None:
        self.path = out_dir / "progress.json"
        self.key = key
        state = json.loads(self.path.read_text()) if self.path.exists() else {}
        if state.get("key") != key:
            if state:
                log.info("prepare: inputs changed since the last attempt; starting over in %s", out_dir)
            state = {"key": key, "steps": {}}
        self.state = state

    def done(self, step: str) -> dict | None:
        return self.state["steps"].get(step)

    def mark(self, step: str, info: dict) -> None:
        self.state["steps"][step] = info
        _atomic_write_json(self.path, self.state)


def prepare(manifest_path: str | Path, out_dir: str | Path, *, vocab_size: int, tokenizer: str = "bpe") -> Path:
    """Prepare the shards of `manifest_path` in `out_dir` (resumable, idempotent); returns `out_dir`."""
    if tokenizer not in ("bpe", "byte"):
        raise DataInputError(f"tokenizer must be 'bpe' or 'byte', got {tokenizer!r}", field="tokenizer")
    if tokenizer == "bpe" and not 258 <= vocab_size <= 1 << 32:
        raise DataInputError(f"vocab_size must be at least 258 for a byte-level BPE, got {vocab_size}",
                             field="vocab_size")
    manifest = load_manifest(manifest_path)
    out = Path(out_dir)
    key = input_key(manifest, tokenizer, vocab_size)
    meta_path = out / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()).get("key") == key:
        log.info("prepare: %s is already prepared for these inputs", out)
        return out
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    (out / "train").mkdir(exist_ok=True)
    (out / "eval").mkdir(exist_ok=True)
    if meta_path.exists():
        meta_path.unlink()
    progress = _Progress(out, key)

    train_docs = {s.name: [(d.doc_id, d.text) for d in s.documents()] for s in manifest.sources}
    eval_docs = {e.name: [(d.doc_id, d.text) for d in e.documents()] for e in manifest.eval_sets}
    for label, sets in (("sources", train_docs), ("eval", eval_docs)):
        for name, docs in sets.items():
            if not docs:
                raise DataInputError("has no non-empty documents", where=str(manifest.path), field=f"{label}: {name}")
    log.info("prepare: read %d training and %d held-out documents",
             sum(map(len, train_docs.values())), sum(map(len, eval_docs.values())))

    report_path = out / "decontamination.json"
    if not progress.done("decontamination"):
        report = decontaminate(train_docs, eval_docs, manifest.ngram_words)
        _atomic_write_json(report_path, report.to_json())
        progress.mark("decontamination", {"removed": len(report.removed_train), "flagged": len(report.flagged_eval)})
    removed = {(r["source"], r["doc_id"]) for r in json.loads(report_path.read_text())["removed_train"]}
    train_docs = {s: [(i, t) for i, t in docs if (s, i) not in removed] for s, docs in train_docs.items()}
    for name, docs in train_docs.items():
        if not docs:
            raise DataInputError("every document was removed by decontamination", where=str(manifest.path),
                                 field=f"sources: {name}")

    tok = _tokenizer_step(out, progress, tokenizer, vocab_size, train_docs)
    shards: dict[str, dict] = {}
    bar = Progress(TextColumn("tokenize {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True,
                   disable=not sys.stderr.isatty())
    for split, sets in (("train", train_docs), ("eval", eval_docs)):
        for name, docs in sets.items():
            step = f"{split}/{name}"
            info = progress.done(step)
            if info is None:
                with bar:
                    task = bar.add_task(step, total=len(docs))
                    tokens, index = tokenize_documents(tok, [t for _, t in docs],
                                                       on_batch=lambda n, task=task: bar.advance(task, n))
                    bar.remove_task(task)
                blob = _npy_bytes(tokens)
                _atomic_write_bytes(out / split / f"{name}.tokens.npy", blob)
                _atomic_write_bytes(out / split / f"{name}.index.npy", _npy_bytes(index))
                _atomic_write_json(out / split / f"{name}.ids.json", {"ids": [i for i, _ in docs]})
                info = {"docs": len(docs), "tokens": int(tokens.size), "bytes": int(index[:, 2].sum()),
                        "sha256": hashlib.sha256(blob).hexdigest()}
                progress.mark(step, info)
                log.info("prepare: %s: %d docs, %d tokens, %d bytes", step, info["docs"], info["tokens"], info["bytes"])
            shards[step] = info

    meta = {
        "format_version": FORMAT_VERSION, "key": key, "manifest": str(manifest.path), "name": manifest.name,
        "tokenizer": tok.to_json(),
        "sources": [{"name": s.name, "domain": s.domain, "share": s.share, **shards[f"train/{s.name}"]}
                    for s in manifest.sources],
        "eval": [{"name": e.name, "domain": e.domain, **shards[f"eval/{e.name}"]} for e in manifest.eval_sets],
    }
    _atomic_write_json(meta_path, meta)
    log.info("prepare: done in %.1f s -> %s", time.perf_counter() - t0, out)
    return out


def _tokenizer_step(out: Path, progress: _Progress, kind: str, vocab_size: int,
                    train_docs: dict[str, list[tuple[str, str]]]):
    if kind == "byte":
        return ByteTokenizer()
    if progress.done("tokenizer"):
        return load_tokenizer(out, {"kind": "bpe"})
    log.info("prepare: training a byte-level BPE with %d entries", vocab_size)
    tok = train_bpe((t for docs in train_docs.values() for _, t in docs), vocab_size)
    blob = tok.hf.to_str(pretty=False).encode()
    _atomic_write_bytes(out / "tokenizer.json", blob)
    progress.mark("tokenizer", {"sha256": hashlib.sha256(blob).hexdigest(), "vocab_size": tok.vocab_size})
    return tok


def ensure_prepared(manifest_path: str | Path | None = None, *, vocab_size: int, cache_root: Path = Path("runs/data"),
                    tokenizer: str = "bpe") -> Path:
    """The prepared directory for these inputs under `cache_root`, preparing it on first use.

    Keyed by the manifest's content hash, the tokenizer and the vocabulary; a file lock makes two
    processes racing for the same key prepare it once.
    """
    manifest = load_manifest(manifest_path or DEMO_MANIFEST)
    key = input_key(manifest, tokenizer, vocab_size)
    cache_root = Path(cache_root)
    cache_root.mkdir(parents=True, exist_ok=True)
    target = cache_root / f"{manifest.name}-{tokenizer}{vocab_size}-{key[:12]}"
    with open(cache_root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            meta = target / "meta.json"
            if meta.exists() and json.loads(meta.read_text()).get("key") == key:
                return target
            return prepare(manifest.path, target, vocab_size=vocab_size, tokenizer=tokenizer)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
