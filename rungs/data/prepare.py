"""Build tokenized shards from a manifest: `prepare` and `ensure_prepared`, the pipeline's entry points.

The stages, each a module of its own:

1. plan (`segments`): every input file is cut into segments by its own bytes (JSONL byte ranges aligned to
   line starts, BGZF members, zstd frames, Parquet row groups; anything else is one segment);
2. scan (`scanning`): every document checked, the held-out sets' n-grams hashed, the training files
   decontaminated against them (both ways), ids checked unique. Bad input stops here, before anything
   is written;
3. tokenizer (`vocabulary`): `decontamination.json`, then the tokenizer (trained on a bounded sample, or given);
4. tokenize (`filework`): one shard per segment, streamed to disk (`shard_writer`), each resumable on its own;
5. outputs (`outputs`): per set, the document table and the sampler's orders, then `meta.json` last.

Segments are the unit of parallel work: `workers=1` runs them in this process, `workers=N` as Ray tasks
on N local processes, `address` on a Ray cluster; `split_bytes` groups consecutive segments of a file
into one task. The output is the same bytes for any of these (and the same shards hash the same).
Memory per worker is bounded by the encode batch, one input line or row group and the open shard's
document table, not by the size of a file.

Every file is written to a temporary name and renamed into place; a shard is finished once its `.json`
is there, so a killed prepare resumes without redoing finished shards and a finished one is a no-op; a
temporary a killed prepare left behind is removed by the next run. Finished means for these inputs and this
`shard_bytes` (the shards' cut): a rerun at another size cuts the shards again, as a fresh prepare would
(`workers` and `split_bytes` change no byte, so they do not count); a `meta.json` that cannot be read is not
finished either. A prepare never deletes a file it did not write (`out_dir`): it refuses an `out_dir`
holding other files or another corpus (unless `overwrite`), and replaces only the files its own state names.
Token ids are range-checked against the vocabulary before they are cast to the shard dtype (a cast would
wrap silently on numpy 1.x).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import time
from pathlib import Path

from rungs.data.atomic import atomic_write_json, is_disk_full, remove_stale_temporaries
from rungs.data.corpus import FORMAT_VERSION
from rungs.data.errors import DataDiskFullError, DataInputError
from rungs.data.filework import ENCODE_BATCH_BYTES, ENCODE_BATCH_DOCS, SHARD_BYTES, SHARD_TEXT_BYTES, \
    tokenize_documents, tokenize_unit
from rungs.data.manifest import DEMO_MANIFEST, Manifest, load_manifest
from rungs.data.out_dir import OWNED_STEP, TOKENIZER_FILE, check_out_dir, owned_files, planned_files, read_state, \
    set_table_files
from rungs.data.outputs import Progress, write_meta, write_set_table
from rungs.data.relocation import MANIFEST_RELATIVE, relative_to_dir
from rungs.data.scanning import FileKey, ScanResult, scan, units_of
from rungs.data.segments import FilePlan, plan_file
from rungs.data.shard_writer import shard_files, shard_stem
from rungs.data.tokenizer import UINT16_VOCAB, BpeTokenizer
from rungs.data.vocabulary import TokenizerLoader, bpe_sample, tokenizer_file, tokenizer_file_vocab_size, \
    tokenizer_key, tokenizer_step
from rungs.data.workers import SourceProgress, ray_session, run_units

log = logging.getLogger(__name__)
__all__ = ["prepare", "ensure_prepared", "tokenize_documents", "input_key", "bpe_sample", "tokenizer_file_vocab_size",
           "ENCODE_BATCH_BYTES", "ENCODE_BATCH_DOCS", "SHARD_BYTES", "SHARD_TEXT_BYTES"]


def input_key(manifest: Manifest, tokenizer: str, vocab_size: int) -> str:
    # Vocabularies over 65,536 entries are keyed apart from anything prepared before ids were range
    # checked: numpy 1.x wrapped them into uint16 shards silently.
    wide = "|uint32" if vocab_size > UINT16_VOCAB else ""
    h = hashlib.sha256(f"v{FORMAT_VERSION}|{tokenizer}|{vocab_size}{wide}|".encode())
    h.update(manifest.content_hash().encode())
    return h.hexdigest()


def prepare(manifest_path: str | Path, out_dir: str | Path, *, vocab_size: int, tokenizer: str = "bpe",
            workers: int = 1, address: str | None = None, shard_bytes: int = SHARD_BYTES,
            split_bytes: int | None = None, overwrite: bool = False) -> Path:
    """Prepare the shards of `manifest_path` in `out_dir` (resumable, idempotent); returns `out_dir`.

    `workers` > 1 or a Ray `address` runs the segments as Ray tasks, `split_bytes` of a file's input to a
    task (default: one segment, `shard_bytes`, each); the output is the same bytes. Raises DataInputError
    for bad input (before `out_dir` is created), for an `out_dir` that holds files prepare did not write or
    (unless `overwrite`) a corpus of other inputs, and DataDiskFullError when the disk fills (no half-written
    file is left visible; a rerun continues).
    """
    fixed = None
    if tokenizer not in ("bpe", "byte"):
        fixed = tokenizer_file(Path(tokenizer), vocab_size)
    elif tokenizer == "bpe" and not 258 <= vocab_size <= 1 << 32:
        raise DataInputError(f"vocab_size must be at least 258 for a byte-level BPE, got {vocab_size}",
                             field="vocab_size")
    if workers < 1:
        raise DataInputError(f"workers must be at least 1, got {workers}", field="workers")
    for name, value in (("shard_bytes", shard_bytes), ("split_bytes", split_bytes)):
        if value is not None and value < 1:
            raise DataInputError(f"{name} must be at least 1, got {value}", field=name)
    manifest = load_manifest(manifest_path)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataInputError("exists and is not a directory; name a new or prepared output directory",
                             where=str(out), field="out")
    key = input_key(manifest, tokenizer_key(tokenizer), vocab_size)
    identity = {"manifest": str(manifest.path.resolve()), "tokenizer": tokenizer_key(tokenizer),
                "vocab_size": vocab_size}
    check_out_dir(out, manifest, key, identity, overwrite=overwrite)
    if _finished(out, key, shard_bytes):
        log.info("prepare: %s is already prepared for these inputs", out)
        return out
    t0 = time.perf_counter()
    per_task = -(-split_bytes // shard_bytes) if split_bytes is not None else 1
    try:
        plans = plan_inputs(manifest, shard_bytes, parallel=workers > 1 or address is not None)
        with ray_session(workers, address):
            scanned = scan(manifest, plans, per_task, workers, address)
            _prepare_into(out, key, identity, manifest, plans, scanned, tokenizer, vocab_size, fixed, workers,
                          address, shard_bytes, per_task)
    except OSError as err:
        if is_disk_full(err) and not isinstance(err, DataDiskFullError):
            raise DataDiskFullError(err.errno, f"disk full writing under {out} ({os.strerror(err.errno)}); "
                                               "free space there and rerun: finished steps are kept") from None
        raise
    log.info("prepare: done in %.1f s -> %s", time.perf_counter() - t0, out)
    return out


def _shard_key(key: str, shard_bytes: int) -> str:
    """What a shard's record carries: shards are cut by input position at `shard_bytes`, so another size (or
    shards cut by text before) gives other shards, which are redone."""
    return f"{key}:{shard_bytes}:input"


def _finished(out: Path, key: str, shard_bytes: int) -> bool:
    """Whether `out` holds the finished corpus of `key` cut at `shard_bytes`: its `meta.json` has this key,
    every set's first shard is recorded under this size (all the shards of a finished corpus are), and every
    file of its shards and document tables is there (a listing per folder: nothing is read or hashed). A
    `meta.json` that cannot be read is not finished: the directory is prepared again; nor is one whose file
    was lost since: the rerun writes what is missing (a finished shard is kept, a shard missing a file is
    written again)."""
    meta_path = out / "meta.json"
    if not meta_path.exists():
        return False
    meta = read_state(meta_path)
    if meta is None:
        log.warning("prepare: %s is not a meta.json prepare can read; preparing %s again", meta_path, out)
        return False
    if meta["key"] != key:
        return False
    entries = [e for field in ("sources", "eval") if isinstance(meta.get(field), list) for e in meta[field]]
    try:
        firsts = [read_state(out / f"{e['shards'][0]['stem']}.json") for e in entries]
    except (KeyError, IndexError, TypeError):
        firsts = []
    if firsts and all(r is not None and r["key"] == _shard_key(key, shard_bytes) for r in firsts):
        try:
            missing = _missing_file(out, meta)
        except (KeyError, TypeError):
            log.warning("prepare: %s is not a meta.json prepare can read; preparing %s again", meta_path, out)
            return False
        if missing is None:
            return True
        log.warning("prepare: %s is missing (lost since it was written); preparing %s again: the finished files are "
                    "kept and what is missing is written again", out / missing, out)
        return False
    log.info("prepare: %s holds shards of another --shard-bytes; cutting them again at %d input bytes",
             out, shard_bytes)
    return False


def _missing_file(out: Path, meta: dict) -> str | None:
    """The first file (relative to `out`) of a finished corpus's shards and document tables that is not there,
    or None; one directory listing per folder, so a corpus of many shards costs a few system calls."""
    listed: dict[str, set[str]] = {}
    for split, field in (("train", "sources"), ("eval", "eval")):
        for entry in meta[field]:
            wanted = set_table_files(split, entry["name"]) + [f for s in entry["shards"] for f in shard_files(s["stem"])]
            for rel in wanted:
                folder, _, name = rel.rpartition("/")
                if folder not in listed:
                    try:
                        listed[folder] = set(os.listdir(out / folder))
                    except OSError:
                        listed[folder] = set()
                if name not in listed[folder]:
                    return rel
    return None


def plan_inputs(manifest: Manifest, shard_bytes: int, *, parallel: bool = False) -> dict[FileKey, FilePlan]:
    """Every input file's segments (reads sizes, Parquet footers and compressed headers, not the data)."""
    plans: dict[FileKey, FilePlan] = {}
    for split, sets in (("train", manifest.sources), ("eval", manifest.eval_sets)):
        for ds in sets:
            for i, file in enumerate(ds.files):
                plan = plans[(split, ds.name, i)] = plan_file(file, shard_bytes, field=ds.name)
                if plan.reason and parallel:
                    log.info("prepare: %s is read by one worker: %s", file, plan.reason)
    return plans


def _prepare_into(out: Path, key: str, identity: dict, manifest: Manifest, plans: dict[FileKey, FilePlan], scanned: ScanResult,
                  tokenizer: str, vocab_size: int, fixed: BpeTokenizer | None, workers: int, address: str | None,
                  shard_bytes: int, per_task: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "train").mkdir(exist_ok=True)
    (out / "eval").mkdir(exist_ok=True)
    remove_stale_temporaries(out)
    if (out / "progress.json").exists() and read_state(out / "progress.json") is None:
        # Unreadable (check_out_dir found this directory prepare's by its meta.json): started over.
        log.warning("prepare: %s is not a progress.json prepare can read; starting over", out / "progress.json")
        (out / "progress.json").unlink()
    # Before progress.json starts over (--overwrite): what an earlier prepare wrote here and is still there.
    earlier = {f for f in owned_files(out) if (out / f).exists()}
    writes_tokenizer = tokenizer != "byte"
    if not writes_tokenizer and TOKENIZER_FILE in earlier:
        # An earlier prepare's tokenizer (its records say so), not part of a byte corpus: removed.
        (out / TOKENIZER_FILE).unlink()
        earlier.discard(TOKENIZER_FILE)
    progress = Progress(out, key)
    progress.state.update(identity)  # which corpus this is: the same manifest may resume or update it
    # where that manifest lies from here, so a project folder moved as a whole still finds it (meta.json, like
    # every shard, is the same bytes wherever `out` is: the relative path is kept here only)
    progress.state[MANIFEST_RELATIVE] = relative_to_dir(manifest.path, out)
    sets = [("train", ds) for ds in manifest.sources] + [("eval", ds) for ds in manifest.eval_sets]
    units = [u for split, ds in sets for i in range(len(ds.files))
             for u in units_of(split, ds, i, plans[(split, ds.name, i)], per_task)]
    # Recorded before anything else is written: a prepare killed halfway leaves only files the next one can
    # prove it wrote (and so may replace).
    stems = [shard_stem(u.split, u.spec.set_name, u.file_index, s.index) for u in units for s in u.segments]
    planned = planned_files(stems, [(split, ds.name) for split, ds in sets], tokenizer=writes_tokenizer)
    progress.mark(OWNED_STEP, {"files": sorted(earlier | planned)})
    (out / "meta.json").unlink(missing_ok=True)
    report = scanned.report
    if not progress.done("decontamination"):
        atomic_write_json(out / "decontamination.json", report)
        progress.mark("decontamination", {"removed": len(report["removed_train"]),
                                          "flagged": len(report["flagged_eval"])})
    by_file = {(name, i): frozenset().union(*segs) for (_, name, i), segs in scanned.removed.items()}
    tok = tokenizer_step(out, progress, tokenizer, vocab_size, manifest, by_file, fixed)
    shard_key = _shard_key(key, shard_bytes)
    calls = []
    for u in units:
        file_key = (u.split, u.spec.set_name, u.file_index)
        lines = scanned.first_lines[file_key]
        removed = scanned.removed.get(file_key)
        calls.append(((u,), {"tokenizer": TokenizerLoader(out, tok.kind), "out": out, "key": shard_key,
                             "first_lines": tuple(lines[s.index] for s in u.segments),
                             "removed": tuple(removed[s.index] if removed else frozenset() for s in u.segments)}))
    bar = SourceProgress(f"{split}/{ds.name}" for split, ds in sets)
    shards: dict[str, list[dict]] = {f"{split}/{ds.name}": [] for split, ds in sets}
    in_process = workers <= 1 and address is None
    if in_process:
        calls = [(a, dict(k, on_shard=lambda info, n=f"{a[0].split}/{a[0].spec.set_name}": bar.add(n, info)))
                 for a, k in calls]
    with bar.bar:
        for unit, infos in zip(units, run_units(tokenize_unit, calls, workers, address)):
            name = f"{unit.split}/{unit.spec.set_name}"
            shards[name].extend({k: v for k, v in info.items() if k not in ("key", "seconds")} for info in infos)
            if not in_process:
                for info in infos:
                    bar.add(name, info)
    entries = {name: write_set_table(out, split, ds.name, shards[name], progress)
               for split, ds in sets for name in [f"{split}/{ds.name}"]}
    write_meta(out, key, manifest, tok.to_json(), entries, owned=owned_files(out))


def ensure_prepared(manifest_path: str | Path | None = None, *, vocab_size: int, cache_root: Path = Path("runs/data"),
                    tokenizer: str = "bpe", workers: int = 1, address: str | None = None) -> Path:
    """The prepared directory for these inputs under `cache_root`, preparing it on first use.

    Keyed by the manifest's cheap content hash (names, sizes, mtimes or object versions, each file's head
    and tail), the tokenizer and the vocabulary; a file lock makes two processes racing for the same key
    prepare it once. `workers`/`address` as for `prepare` (default: in this process).
    """
    manifest = load_manifest(manifest_path or DEMO_MANIFEST)
    key = input_key(manifest, tokenizer_key(tokenizer), vocab_size)
    cache_root = Path(cache_root)
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise DataInputError("is not a directory; the prepared-corpus cache is a folder (data_cache_root)",
                             where=str(cache_root), field="data_cache_root") from None
    label = tokenizer if tokenizer in ("bpe", "byte") else "file"
    target = cache_root / f"{manifest.name}-{label}{vocab_size}-{key[:12]}"
    with open(cache_root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _finished(target, key, SHARD_BYTES):
                return target
            # The cache's own directory for this key: anything of another key there is a stale prepare's.
            return prepare(manifest.path, target, vocab_size=vocab_size, tokenizer=tokenizer, workers=workers,
                           address=address, overwrite=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
