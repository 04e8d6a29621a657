"""Build tokenized shards from a manifest: decontaminate, train the tokenizer, tokenize, index.

Streaming and parallel (#20): one input file is one unit of work (`rungs.data.filework`), run in this
process (`workers=1`) or as Ray tasks (`workers=N` local processes, or `address` of a Ray cluster);
documents are read as streams and never all held in memory. The steps:

1. scan the held-out files: check every document, hash its word n-grams (a sorted uint64 array);
2. scan the training files against it: check every document, find the contaminated ones (both ways);
   ids are checked unique per set by 64-bit hashes. Bad input stops here, before anything is written;
3. write `decontamination.json` and the tokenizer: a BPE is trained on a bounded, deterministic sample
   (each source's first `BPE_SAMPLE_BYTES / sources` bytes of clean documents, in file order);
4. tokenize every file into bounded shards (each resumable on its own);
5. per set, the document table (`<split>/<set>.docs.npy`, int64 [docs, 3]: start in the set's token
   stream, tokens with EOS, bytes; training sources also `.keys.npy` (the sampler's uint64 hash of the
   id), `.strata.npy` (document order by collection name, then key) and `.order.npy` (by key)), then
   `meta.json` last: the key, tokenizer, per-set counts, the shards with their counts and hashes.

Layout of a prepared directory:

    meta.json, tokenizer.json (absent for the byte tokenizer), decontamination.json, progress.json
    train/<source>/<file:05d>-<k:04d>.{tokens.npy,index.npy,ids.json,json}   shards (filework)
    train/<source>.{docs,keys,strata,order}.npy                             the source's document table
    eval/<domain>/...; eval/<domain>.docs.npy                               the same for the held-out sets

Every file is written to a temporary name and renamed into place; a shard is finished once its `.json`
is there, so a killed prepare resumes without redoing finished shards and a finished one is a no-op; a
temporary a killed prepare left behind is removed by the next run. Same inputs give byte-identical
output (same hashes), with any number of workers. Token ids are range-checked against the vocabulary
before they are cast to the shard dtype (a cast would wrap silently on numpy 1.x).

`tokenizer` is "bpe" (a byte-level BPE trained on the training sources), "byte", or the path of a
Hugging Face `tokenizer.json` with an `<|endoftext|>` token (a fixed vocabulary, e.g. a recipe's
131,072-entry one); `vocab_size` is then the model's vocabulary, which must hold every id.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from rungs.data.atomic import (_TMP_MARK, atomic_write_bytes, atomic_write_json, is_disk_full, npy_bytes,
                               remove_stale_temporaries)
from rungs.data.corpus import FORMAT_VERSION
from rungs.data.decontam import HeldOutIndex
from rungs.data.errors import DataDiskFullError, DataInputError
from rungs.data.filework import ENCODE_BATCH_BYTES, ENCODE_BATCH_DOCS, SHARD_TEXT_BYTES, id_hash, scan_file, \
    tokenize_file
from rungs.data.manifest import DEMO_MANIFEST, DocumentSet, Manifest, load_manifest
from rungs.data.subset import collection_of, subset_key
from rungs.data.tokenizer import EOS_TEXT, UINT16_VOCAB, BpeTokenizer, ByteTokenizer, load_tokenizer, token_dtype, \
    train_bpe
from rungs.data.workers import SourceProgress, ray_session, run_units

log = logging.getLogger(__name__)
BPE_SAMPLE_BYTES = 32 << 20  # the BPE's training text, split equally over the sources (the demo: all of it)
__all__ = ["prepare", "ensure_prepared", "tokenize_documents", "input_key", "ENCODE_BATCH_BYTES",
           "ENCODE_BATCH_DOCS", "SHARD_TEXT_BYTES"]


def input_key(manifest: Manifest, tokenizer: str, vocab_size: int) -> str:
    # Vocabularies over 65,536 entries are keyed apart from anything prepared before ids were range
    # checked: numpy 1.x wrapped them into uint16 shards silently (#20).
    wide = "|uint32" if vocab_size > UINT16_VOCAB else ""
    h = hashlib.sha256(f"v{FORMAT_VERSION}|{tokenizer}|{vocab_size}{wide}|".encode())
    h.update(manifest.content_hash().encode())
    return h.hexdigest()


def tokenize_documents(tokenizer, texts: list[str], on_batch: Callable[[int], None] | None = None,
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of every text followed by EOS, concatenated, and the [docs, 3] index (start, tokens, bytes).

    In memory (for tests, benchmarks and small inputs; `prepare` streams files through
    `filework.tokenize_file`). An id outside the vocabulary raises `TokenIdError`.
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
            size += len(texts[end])
            end += 1
        yield begin, texts[begin:end]
        begin = end


class _Progress:
    """`progress.json`: the input key and the steps completed under it (shards keep their own marks)."""

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
        atomic_write_json(self.path, self.state)


def prepare(manifest_path: str | Path, out_dir: str | Path, *, vocab_size: int, tokenizer: str = "bpe",
            workers: int = 1, address: str | None = None, shard_text_bytes: int = SHARD_TEXT_BYTES) -> Path:
    """Prepare the shards of `manifest_path` in `out_dir` (resumable, idempotent); returns `out_dir`.

    `workers` > 1 or a Ray `address` runs the per-file work as Ray tasks; the output is the same bytes.
    Raises DataInputError for bad input (before `out_dir` is created) and DataDiskFullError when the
    disk fills (no half-written file is left visible; a rerun continues).
    """
    fixed = None
    if tokenizer not in ("bpe", "byte"):
        fixed = _tokenizer_file(Path(tokenizer), vocab_size)
    elif tokenizer == "bpe" and not 258 <= vocab_size <= 1 << 32:
        raise DataInputError(f"vocab_size must be at least 258 for a byte-level BPE, got {vocab_size}",
                             field="vocab_size")
    if workers < 1:
        raise DataInputError(f"workers must be at least 1, got {workers}", field="workers")
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
    try:
        with ray_session(workers, address):
            report, removed = _scan(manifest, workers, address)
            return _prepare_into(out, key, manifest, report, removed, tokenizer, vocab_size, fixed, t0, workers,
                                 address, shard_text_bytes)
    except OSError as err:
        if is_disk_full(err) and not isinstance(err, DataDiskFullError):
            raise DataDiskFullError(err.errno, f"disk full writing under {out} ({os.strerror(err.errno)}); "
                                               "free space there and rerun: finished steps are kept") from None
        raise


def _units(sets: tuple[DocumentSet, ...]) -> list[tuple[DocumentSet, int, Path]]:
    return [(ds, i, path) for ds in sets for i, path in enumerate(ds.files)]


def _check_ids(ds: DocumentSet, per_file: list[np.ndarray], where: str, label: str) -> None:
    """Ids unique across the set's files (each file checked itself while read), by 64-bit hashes."""
    if len(per_file) < 2:
        return
    hashes = np.concatenate(per_file)
    owner = np.repeat(np.arange(len(per_file)), [len(h) for h in per_file])
    order = np.argsort(hashes, kind="stable")
    dup = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    if len(dup):
        second = int(owner[order][dup[0] + 1])
        target = int(hashes[order][dup[0]])
        path = ds.files[second]
        doc_id = next(d.doc_id for d in ds.file_documents(path) if id_hash(d.doc_id) == target)
        raise DataInputError(f"document id {doc_id!r} appears twice; ids must be unique within a set",
                             where=str(path), field=ds.name)


def _scan(manifest: Manifest, workers: int, address: str | None) -> tuple[dict, dict[tuple[str, int], frozenset]]:
    """Read every input once: check it, build the held-out n-gram index, decontaminate (both ways).

    Returns the decontamination report (`decontamination.json`) and, per (source, file index), the ids
    of the training documents removed."""
    n = manifest.ngram_words
    eval_units = _units(manifest.eval_sets)
    scanned = list(run_units(scan_file, [((ds, path), {"ngram_words": n}) for ds, _, path in eval_units],
                              workers, address))
    checked_eval: dict[str, int] = {}
    per_doc = []
    for (ds, _, _), res in zip(eval_units, scanned):
        checked_eval[ds.name] = checked_eval.get(ds.name, 0) + res["docs"]
        per_doc.extend(res["ngrams"])
    for ds in manifest.eval_sets:
        _check_ids(ds, [r["id_hashes"] for (d, _, _), r in zip(eval_units, scanned) if d is ds], str(manifest.path), "eval")
    del scanned
    held_out = HeldOutIndex.build(per_doc, n)
    del per_doc
    if workers > 1 or address is not None:
        import ray

        held_ref = ray.put(held_out)
    else:
        held_ref = held_out
    train_units = _units(manifest.sources)
    checked_train: dict[str, int] = {ds.name: 0 for ds in manifest.sources}
    removed_train: dict[tuple[str, str], list[str]] = {}
    flagged: dict[tuple[str, str], list[str]] = {}
    removed: dict[tuple[str, int], frozenset] = {}
    hashes: dict[str, list[np.ndarray]] = {ds.name: [] for ds in manifest.sources}
    for (ds, i, _), res in zip(train_units, run_units(scan_file, [((ds, path), {"held_out": held_ref})
                                                                   for ds, _, path in train_units], workers, address)):
        checked_train[ds.name] += res["docs"]
        hashes[ds.name].append(res["id_hashes"])
        removed[(ds.name, i)] = frozenset(doc_id for doc_id, _ in res["removed"])
        for doc_id, labels in res["removed"]:
            removed_train[(ds.name, doc_id)] = [lab.replace("\x00", "/") for lab in labels]
            for lab in labels:
                domain, eval_id = lab.split("\x00", 1)
                flagged.setdefault((domain, eval_id), []).append(f"{ds.name}/{doc_id}")
    for ds in manifest.sources:
        _check_ids(ds, hashes.pop(ds.name), str(manifest.path), "sources")
    for label, counts in (("sources", checked_train), ("eval", checked_eval)):
        for name, docs in counts.items():
            if not docs:
                raise DataInputError("has no non-empty documents", where=str(manifest.path), field=f"{label}: {name}")
    for ds in manifest.sources:
        gone = sum(1 for (src, _) in removed_train if src == ds.name)
        log.info("decontamination: %s: %d of %d training documents overlap a held-out set", ds.name, gone,
                 checked_train[ds.name])
        if gone == checked_train[ds.name]:
            raise DataInputError("every document was removed by decontamination", where=str(manifest.path),
                                 field=f"sources: {ds.name}")
    from rungs.data.decontam import DecontaminationReport

    report = DecontaminationReport(ngram_words=n, removed_train=removed_train, flagged_eval=flagged,
                                   train_docs_checked=checked_train,
                                   eval_docs_checked={e.name: checked_eval.get(e.name, 0) for e in manifest.eval_sets})
    log.info("prepare: scanned %d training and %d held-out documents", sum(checked_train.values()),
             sum(checked_eval.values()))
    return report.to_json(), removed


def _prepare_into(out: Path, key: str, manifest: Manifest, report: dict, removed: dict, tokenizer: str,
                  vocab_size: int, fixed: BpeTokenizer | None, t0: float, workers: int, address: str | None,
                  shard_text_bytes: int) -> Path:
    meta_path = out / "meta.json"
    out.mkdir(parents=True, exist_ok=True)
    (out / "train").mkdir(exist_ok=True)
    (out / "eval").mkdir(exist_ok=True)
    remove_stale_temporaries(out)
    if meta_path.exists():
        meta_path.unlink()
    progress = _Progress(out, key)
    if not progress.done("decontamination"):
        atomic_write_json(out / "decontamination.json", report)
        progress.mark("decontamination", {"removed": len(report["removed_train"]),
                                          "flagged": len(report["flagged_eval"])})
    tok = _tokenizer_step(out, progress, tokenizer, vocab_size, manifest, removed, fixed)
    kind = tok.kind

    sets = [("train", ds) for ds in manifest.sources] + [("eval", ds) for ds in manifest.eval_sets]
    shard_key = f"{key}:{shard_text_bytes}"  # boundaries depend on the shard size: another size redoes them
    calls = [((ds, path), {"split": split, "file_index": i, "tokenizer": _TokenizerLoader(out, kind), "out": out,
                           "key": shard_key, "shard_text_bytes": shard_text_bytes,
                           "removed": removed.get((ds.name, i), frozenset()) if split == "train" else frozenset()})
             for split, ds in sets for i, path in enumerate(ds.files)]
    bar = SourceProgress(f"{split}/{ds.name}" for split, ds in sets)
    shards: dict[str, list[dict]] = {f"{split}/{ds.name}": [] for split, ds in sets}
    in_process = workers <= 1 and address is None
    with bar.bar:
        for (args, kwargs), infos in zip(calls, run_units(
                tokenize_file, [(a, dict(k, on_shard=None)) for a, k in calls] if not in_process else
                [(a, dict(k, on_shard=lambda info, n=f"{k['split']}/{a[0].name}": bar.add(n, info))) for a, k in calls],
                workers, address)):
            name = f"{kwargs['split']}/{args[0].name}"
            shards[name].extend({k: v for k, v in info.items() if k not in ("key", "seconds")} for info in infos)
            if not in_process:
                for info in infos:
                    bar.add(name, info)

    entries = {}
    for split, ds in sets:
        name = f"{split}/{ds.name}"
        entries[name] = _write_set_table(out, split, ds.name, shards[name], progress, kind)
    meta = {
        "format_version": FORMAT_VERSION, "key": key, "manifest": str(manifest.path), "name": manifest.name,
        "tokenizer": tok.to_json(),
        "sources": [{"name": s.name, "domain": s.domain, "share": s.share, **entries[f"train/{s.name}"]}
                    for s in manifest.sources],
        "eval": [{"name": e.name, "domain": e.domain, **entries[f"eval/{e.name}"]} for e in manifest.eval_sets],
    }
    _remove_unlisted(out, meta)
    atomic_write_json(meta_path, meta)
    log.info("prepare: done in %.1f s -> %s", time.perf_counter() - t0, out)
    return out


def _remove_unlisted(out: Path, meta: dict) -> None:
    """Files under train/ and eval/ that this prepare did not write (shards of a file since dropped from
    the manifest, sets since renamed, the one-file-per-set layout before #20): removed, so that the
    directory holds exactly what `meta.json` lists."""
    keep = set()
    for split, entries in (("train", meta["sources"]), ("eval", meta["eval"])):
        for e in entries:
            keep.update(f"{split}/{e['name']}.{part}.npy" for part in ("docs", "keys", "order", "strata"))
            keep.update(f"{s['stem']}{ext}" for s in e["shards"] for ext in (".tokens.npy", ".index.npy",
                                                                            ".ids.json", ".json"))
    for split in ("train", "eval"):
        for path in sorted((out / split).rglob("*"), reverse=True):
            rel = str(path.relative_to(out))
            if path.is_dir():
                if not any(path.iterdir()):
                    path.rmdir()
            elif rel not in keep and _TMP_MARK not in path.name:
                log.info("prepare: removing %s, not part of this corpus", path)
                path.unlink()


class _TokenizerLoader:
    """Picklable: the prepared directory's tokenizer where a shard needs it (a Ray worker), loaded once per
    process: a HF tokenizer loaded per input file is not all given back (+7 MB per file measured)."""

    _loaded: tuple = (None, None)  # ((directory, kind, size, mtime), tokenizer) of the last load

    def __init__(self, out: Path, kind: str) -> None:
        self.out, self.kind = out, kind

    def __call__(self):
        path = self.out / "tokenizer.json"
        st = path.stat() if path.exists() else None
        ident = (str(self.out), self.kind, st and st.st_size, st and st.st_mtime_ns)
        if _TokenizerLoader._loaded[0] != ident:
            _TokenizerLoader._loaded = (ident, load_tokenizer(self.out, {"kind": self.kind}))
        return _TokenizerLoader._loaded[1]


def _write_set_table(out: Path, split: str, name: str, shards: list[dict], progress: _Progress, kind: str) -> dict:
    """The set's document table (and, for a source, the sampler's keys and orders) from its shards.

    Holds 8 bytes per document for the keys plus the sorts' indices; the shards are read one at a time."""
    step = f"{split}/{name}"
    info = progress.done(step)
    if info is not None and info.get("shards") == shards:
        return info
    tables, keys, codes, collections = [], [], [], {}
    start = 0
    for shard in shards:
        index = np.load(out / f"{shard['stem']}.index.npy")
        index[:, 0] += start
        start += shard["tokens"]
        tables.append(index)
        if split == "train":
            ids = json.loads((out / f"{shard['stem']}.ids.json").read_text())["ids"]
            keys.append(np.fromiter((subset_key(name, d) for d in ids), dtype=np.uint64, count=len(ids)))
            codes.append(np.fromiter((collections.setdefault(collection_of(d), len(collections)) for d in ids),
                                     dtype=np.int64, count=len(ids)))
    table = np.concatenate(tables) if tables else np.zeros((0, 3), np.int64)
    atomic_write_bytes(out / split / f"{name}.docs.npy", npy_bytes(table))
    info = {"docs": int(len(table)), "tokens": int(start), "bytes": int(table[:, 2].sum()), "shards": shards,
            "sha256": hashlib.sha256(b"".join(s["sha256"].encode() for s in shards)).hexdigest()}
    if split == "train":
        key_arr = np.concatenate(keys)
        names = sorted(collections)
        rank = np.empty(len(names), dtype=np.int64)
        for r, c in enumerate(names):
            rank[collections[c]] = r
        code_arr = rank[np.concatenate(codes)]
        atomic_write_bytes(out / split / f"{name}.keys.npy", npy_bytes(key_arr))
        atomic_write_bytes(out / split / f"{name}.order.npy", npy_bytes(np.argsort(key_arr, kind="stable")))
        atomic_write_bytes(out / split / f"{name}.strata.npy", npy_bytes(np.lexsort((key_arr, code_arr))))
        info["collections"] = [{"name": c, "docs": int((code_arr == r).sum()),
                                "tokens": int(table[code_arr == r, 1].sum())} for r, c in enumerate(names)]
    progress.mark(step, info)
    return info


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


def bpe_sample(manifest: Manifest, removed: dict[tuple[str, int], frozenset],
               sample_bytes: int = BPE_SAMPLE_BYTES) -> Iterator[str]:
    """The BPE's training text: each source's first `sample_bytes / sources` bytes of clean documents, in
    manifest and file order. Bounded and deterministic; the whole demo corpus fits (its largest source is
    4.5 MB), so its tokenizer is the one trained on every document before #20."""
    budget = sample_bytes // len(manifest.sources)
    for ds in manifest.sources:
        taken = 0
        for i, path in enumerate(ds.files):
            gone = removed.get((ds.name, i), frozenset())
            for doc in ds.file_documents(path):
                if taken >= budget:
                    break
                if doc.doc_id in gone:
                    continue
                taken += len(doc.text.encode("utf-8"))
                yield doc.text
            if taken >= budget:
                break


def _tokenizer_step(out: Path, progress: _Progress, kind: str, vocab_size: int, manifest: Manifest,
                    removed: dict, fixed: BpeTokenizer | None):
    if kind == "byte":
        return ByteTokenizer()
    if progress.done("tokenizer"):
        return load_tokenizer(out, {"kind": "bpe"})
    if fixed is not None:  # a tokenizer.json given by path: copied so that the directory is self-contained
        tok, blob = fixed, Path(kind).read_bytes()
    else:
        log.info("prepare: training a byte-level BPE with %d entries", vocab_size)
        tok = train_bpe(bpe_sample(manifest, removed), vocab_size)
        blob = tok.hf.to_str(pretty=False).encode()
    atomic_write_bytes(out / "tokenizer.json", blob)
    progress.mark("tokenizer", {"sha256": hashlib.sha256(blob).hexdigest(), "vocab_size": tok.vocab_size})
    return tok


def ensure_prepared(manifest_path: str | Path | None = None, *, vocab_size: int, cache_root: Path = Path("runs/data"),
                    tokenizer: str = "bpe", workers: int = 1, address: str | None = None) -> Path:
    """The prepared directory for these inputs under `cache_root`, preparing it on first use.

    Keyed by the manifest's cheap content hash (names, sizes, mtimes, each file's head and tail), the
    tokenizer and the vocabulary; a file lock makes two processes racing for the same key prepare it once.
    `workers`/`address` as for `prepare` (default: in this process).
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
            return prepare(manifest.path, target, vocab_size=vocab_size, tokenizer=tokenizer, workers=workers,
                           address=address)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# Names the benchmarks and older callers use.
_run_units, _ray_session = run_units, ray_session
