"""Build tokenized shards from a manifest: decontaminate, train the tokenizer, tokenize, index.

Layout of a prepared directory:

    meta.json                   written last: the key, tokenizer, per-set counts and shard hashes
    tokenizer.json              the HF BPE (absent for the byte tokenizer)
    decontamination.json        the both-ways overlap report
    train/<source>.tokens.npy   uint16 (uint32 for vocabularies over 65,536 entries) tokens, each document + EOS
    train/<source>.index.npy    int64 [docs, 3]: start, tokens (with EOS), UTF-8 bytes of the text
    train/<source>.ids.json     document ids in index order
    eval/<domain>.*             the same for the held-out sets

Every file is written to a temporary name and renamed into place, and `progress.json` records the
steps done under the input key, so an interrupted prepare (killed, or out of disk) continues where it
stopped and a finished one is a no-op; a temporary file a killed prepare left behind is removed by
the next run. Same inputs give byte-identical shards (same hashes). Every input file is read and
checked, and the tokenizer's vocabulary checked against `vocab_size`, before the output directory is
created, so bad input leaves nothing behind. Token ids are range-checked against the vocabulary
before they are cast to the shard dtype (a cast would wrap silently on numpy 1.x).

`tokenizer` is "bpe" (a byte-level BPE trained on the training sources), "byte", or the path of a
Hugging Face `tokenizer.json` with an `<|endoftext|>` token (a fixed vocabulary, e.g. a recipe's
131,072-entry one); `vocab_size` is then the model's vocabulary, which must hold every id.
"""

from __future__ import annotations

import errno
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
from rungs.data.errors import DataDiskFullError, DataInputError
from rungs.data.manifest import DEMO_MANIFEST, Manifest, load_manifest
from rungs.data.tokenizer import (EOS_TEXT, UINT16_VOCAB, BpeTokenizer, ByteTokenizer, TokenIdError, load_tokenizer,
                                  token_dtype, train_bpe)

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
ENCODE_BATCH_DOCS = 256
# Encoding costs ~150x the text in memory (HF Encoding objects: ids, offsets, token strings), so a
# batch is also cut at this many bytes of text; with documents split at 1 MiB this bounds the peak.
ENCODE_BATCH_BYTES = 2 << 20
_TMP_MARK = ".tmp"


def input_key(manifest: Manifest, tokenizer: str, vocab_size: int) -> str:
    # Vocabularies over 65,536 entries are keyed apart from anything prepared before ids were range
    # checked: numpy 1.x wrapped them into uint16 shards silently (#20).
    wide = "|uint32" if vocab_size > UINT16_VOCAB else ""
    h = hashlib.sha256(f"v{FORMAT_VERSION}|{tokenizer}|{vocab_size}{wide}|".encode())
    h.update(manifest.content_hash().encode())
    return h.hexdigest()


def _is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a hidden temporary and a rename: `path` is never half-written, and
    a failed write (a full disk) removes its temporary."""
    tmp = path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if _is_disk_full(err):
            raise DataDiskFullError(err.errno, f"disk full writing {path} ({os.strerror(err.errno)}); free space "
                                               f"on {path.parent} and rerun: finished steps are kept") from None
        raise


def _remove_stale_temporaries(out: Path) -> None:
    """Temporaries of a prepare that was killed mid-write (its process is gone): never trusted, removed."""
    for tmp in out.glob(f"**/.*{_TMP_MARK}*"):
        pid = tmp.name.rpartition(_TMP_MARK)[2]
        if pid.isdigit() and not _process_alive(int(pid)):
            log.info("prepare: removing %s, left by a prepare that was killed mid-write", tmp)
            tmp.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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

    Tokens are `token_dtype(tokenizer.vocab_size)`; an id outside the vocabulary raises `TokenIdError`.
    Batches hold at most `ENCODE_BATCH_DOCS` documents and (beyond their first) `ENCODE_BATCH_BYTES`
    of text. `on_batch(n_docs)` is called after each batch of documents (progress display).
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
        while end < len(texts) and end - begin < ENCODE_BATCH_DOCS and (end == begin or size + len(texts[end]) <= ENCODE_BATCH_BYTES):
            size += len(texts[end])  # characters: a cheap stand-in for bytes (<= 4x)
            end += 1
        yield begin, texts[begin:end]
        begin = end


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
    """Prepare the shards of `manifest_path` in `out_dir` (resumable, idempotent); returns `out_dir`.

    Raises DataInputError for bad input (before `out_dir` is created) and DataDiskFullError when the
    disk fills (no half-written file is left visible; a rerun continues).
    """
    fixed = None
    if tokenizer not in ("bpe", "byte"):
        fixed = _tokenizer_file(Path(tokenizer), vocab_size)
    elif tokenizer == "bpe" and not 258 <= vocab_size <= 1 << 32:
        raise DataInputError(f"vocab_size must be at least 258 for a byte-level BPE, got {vocab_size}",
                             field="vocab_size")
    manifest = load_manifest(manifest_path)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataInputError("exists and is not a directory; name a new or prepared output directory",
                             where=str(out), field="out")
    key = input_key(manifest, _tokenizer_key(tokenizer), vocab_size)
    meta_path = out / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()).get("key") == key:
        log.info("prepare: %s is already prepared for these inputs", out)
        return out
    t0 = time.perf_counter()
    train_docs, eval_docs = _read_documents(manifest)
    try:
        return _prepare_into(out, key, manifest, train_docs, eval_docs, tokenizer, vocab_size, fixed, t0)
    except OSError as err:
        if _is_disk_full(err) and not isinstance(err, DataDiskFullError):
            raise DataDiskFullError(err.errno, f"disk full writing under {out} ({os.strerror(err.errno)}); "
                                               "free space there and rerun: finished steps are kept") from None
        raise


def _read_documents(manifest: Manifest) -> tuple[dict, dict]:
    """Every document of every set, checked (each file readable UTF-8 with a document; no set empty)."""
    train_docs = {s.name: [(d.doc_id, d.text) for d in s.documents()] for s in manifest.sources}
    eval_docs = {e.name: [(d.doc_id, d.text) for d in e.documents()] for e in manifest.eval_sets}
    for label, sets in (("sources", train_docs), ("eval", eval_docs)):
        for name, docs in sets.items():
            if not docs:
                raise DataInputError("has no non-empty documents", where=str(manifest.path), field=f"{label}: {name}")
    log.info("prepare: read %d training and %d held-out documents",
             sum(map(len, train_docs.values())), sum(map(len, eval_docs.values())))
    return train_docs, eval_docs


def _prepare_into(out: Path, key: str, manifest: Manifest, train_docs: dict, eval_docs: dict, tokenizer: str,
                  vocab_size: int, fixed: BpeTokenizer | None, t0: float) -> Path:
    meta_path = out / "meta.json"
    progress = _Progress(out, key) if (out / "progress.json").exists() else None
    if progress is not None and progress.done("decontamination"):
        report = json.loads((out / "decontamination.json").read_text())
    else:
        report = decontaminate(train_docs, eval_docs, manifest.ngram_words).to_json()
    removed = {(r["source"], r["doc_id"]) for r in report["removed_train"]}
    train_docs = {s: [(i, t) for i, t in docs if (s, i) not in removed] for s, docs in train_docs.items()}
    for name, docs in train_docs.items():
        if not docs:
            raise DataInputError("every document was removed by decontamination", where=str(manifest.path),
                                 field=f"sources: {name}")

    out.mkdir(parents=True, exist_ok=True)
    (out / "train").mkdir(exist_ok=True)
    (out / "eval").mkdir(exist_ok=True)
    _remove_stale_temporaries(out)
    if meta_path.exists():
        meta_path.unlink()
    if progress is None:
        progress = _Progress(out, key)
    if not progress.done("decontamination"):
        _atomic_write_json(out / "decontamination.json", report)
        progress.mark("decontamination", {"removed": len(report["removed_train"]),
                                          "flagged": len(report["flagged_eval"])})

    tok = _tokenizer_step(out, progress, tokenizer, vocab_size, train_docs, fixed)
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
                    try:
                        tokens, index = tokenize_documents(tok, [t for _, t in docs],
                                                           on_batch=lambda n, task=task: bar.advance(task, n))
                    except TokenIdError as err:
                        raise DataInputError(str(err), where=tokenizer, field="tokenizer") from None
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


def _tokenizer_key(tokenizer: str) -> str:
    if tokenizer in ("bpe", "byte"):
        return tokenizer
    return "file:" + hashlib.sha256(Path(tokenizer).read_bytes()).hexdigest()


def tokenizer_file_vocab_size(path: Path) -> int:
    """Entries of a HF `tokenizer.json` (with its added tokens): the default model vocabulary for it."""
    return _tokenizer_file(path, None).vocab_size


def _tokenizer_file(path: Path, vocab_size: int | None) -> BpeTokenizer:
    """A fixed tokenizer from a HF `tokenizer.json`, checked to fit a model vocabulary of `vocab_size`."""
    if not path.is_file():
        raise DataInputError("is neither 'bpe', 'byte' nor a tokenizer.json file", where=str(path), field="tokenizer")
    from tokenizers import Tokenizer

    try:
        hf = Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust loader raises a bare Exception for any malformed file
        raise DataInputError(f"is not a Hugging Face tokenizer.json ({' '.join(str(err).split())})",
                             where=str(path), field="tokenizer") from None
    if hf.token_to_id(EOS_TEXT) is None:
        raise DataInputError(f"has no {EOS_TEXT!r} token to end documents with", where=str(path), field="tokenizer")
    tok = BpeTokenizer(hf)
    if vocab_size is not None and tok.vocab_size > vocab_size:
        raise DataInputError(f"the tokenizer has {tok.vocab_size:,} entries, more than vocab_size {vocab_size:,}: "
                             f"its ids up to {tok.vocab_size - 1:,} would not fit the model's embedding",
                             where=str(path), field="vocab_size")
    return tok


def _tokenizer_step(out: Path, progress: _Progress, kind: str, vocab_size: int,
                    train_docs: dict[str, list[tuple[str, str]]], fixed: BpeTokenizer | None):
    if kind == "byte":
        return ByteTokenizer()
    if progress.done("tokenizer"):
        return load_tokenizer(out, {"kind": "bpe"})
    if fixed is not None:  # a tokenizer.json given by path: copied so that the directory is self-contained
        tok, blob = fixed, Path(kind).read_bytes()
    else:
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
    key = input_key(manifest, _tokenizer_key(tokenizer), vocab_size)
    cache_root = Path(cache_root)
    cache_root.mkdir(parents=True, exist_ok=True)
    label = tokenizer if tokenizer in ("bpe", "byte") else "file"
    target = cache_root / f"{manifest.name}-{label}{vocab_size}-{key[:12]}"
    with open(cache_root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            meta = target / "meta.json"
            if meta.exists() and json.loads(meta.read_text()).get("key") == key:
                return target
            return prepare(manifest.path, target, vocab_size=vocab_size, tokenizer=tokenizer)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
