"""Corpus manifests: which documents make up each training source and each held-out domain.

A manifest is YAML, paths relative to the manifest file (or to `base`):

    name: demo
    sources:                       # training sources; shares sum to 1
      - {name: code, domain: code, share: 0.45, files: [corpus/code.jsonl.gz]}
    eval:                          # held-out sets, one per domain
      - {domain: code, files: [corpus/eval_code.jsonl.gz]}
    decontamination: {ngram_words: 13}
    base: s3://bucket/corpus       # optional: where relative `files` are (default: the manifest's folder)

`files` entries may be globs, and local paths or object-store URLs (`s3://`, `gs://`, `hf://`:
`rungs.data.storage`); a local entry that matches only folders is refused (a folder's files are read only
when a glob names them), as is a file of a compression or archive format the readers do not read. The formats and how a file is read are `rungs.data.readers`'; how a large file
is cut for parallel work is `rungs.data.segments`'. Every file must hold at least one non-empty
document; an empty, binary or non-UTF-8 file is refused with an error naming the file, as is an id that
appears twice within a set (`checked_documents` applies both checks to one file). A document's
collection is its id up to the first '/' (`metamath/set.mm#3` is in `metamath`); the sampler gives
each collection of a source the same share of every rung's unique subset.
"""

from __future__ import annotations

import glob
import hashlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from rungs.data.errors import DataInputError
from rungs.data.readers import MAX_DOCUMENT_BYTES, PART_SUFFIX, Document, FileSpec, segment_documents, \
    split_document, whole_plan
from rungs.data.segments import unsupported_format
from rungs.data.storage import FINGERPRINT_BYTES, DataFile, RemoteFile, fingerprints, is_url, list_remote

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Document", "DocumentSet", "Manifest", "load_manifest", "split_document", "file_fingerprint",
           "checked_documents", "duplicate_id", "MAX_DOCUMENT_BYTES", "PART_SUFFIX", "FINGERPRINT_BYTES",
           "DEMO_MANIFEST"]
SHARE_TOLERANCE = 1e-6
DEMO_MANIFEST = Path(__file__).resolve().parent / "demo" / "manifest.yaml"


@dataclass(frozen=True)
class DocumentSet:
    """One training source (with a share) or one held-out domain (share None)."""

    name: str
    domain: str
    files: tuple[DataFile, ...]
    share: float | None = None
    text_field: str = "text"
    id_field: str = "id"
    base: Path | str = field(default=Path("."))  # a folder, or a URL prefix

    def rel(self, file: DataFile) -> str:
        """The file's name in ids and in the cache key: relative to the base where it is under it."""
        if isinstance(file, RemoteFile):
            prefix = str(self.base).rstrip("/") + "/"
            return file.url[len(prefix):] if isinstance(self.base, str) and file.url.startswith(prefix) else file.url
        return str(file.relative_to(self.base)) if isinstance(self.base, Path) and file.is_relative_to(self.base) \
            else str(file)

    def spec(self, file: DataFile) -> FileSpec:
        return FileSpec(self.name, self.rel(file), self.text_field, self.id_field)

    def documents(self) -> Iterator[Document]:
        """Every non-empty document in file order, those over `MAX_DOCUMENT_BYTES` as their pieces.

        Ids are checked unique across the set here with a set of every id (fine for a small set);
        `prepare` streams segments and checks ids with 64-bit hashes."""
        seen: set[str] = set()
        for path in self.files:
            for doc in self.file_documents(path):
                if doc.doc_id in seen:
                    raise DataInputError(duplicate_id(doc.doc_id), where=str(path), field=self.name)
                seen.add(doc.doc_id)
                yield doc

    def file_documents(self, path: DataFile) -> Iterator[Document]:
        """The non-empty documents of one of this set's files (long ones as pieces), read start to end and
        checked as `checked_documents` checks them."""
        return checked_documents(path, self.spec(path))


def checked_documents(path: DataFile, spec: FileSpec) -> Iterator[Document]:
    """The non-empty documents of one file (long ones as pieces), read start to end, checked as `prepare`'s
    scan checks a file: a DataInputError naming it (with `prepare`'s message) when it holds no document, or
    one id twice. Ids are checked by their 64-bit hashes (8 bytes a document) once the file is read through
    (the repeated id is then found by reading it again); a reader that stops early has no id check."""
    import numpy as np

    from rungs.data.filework import id_hash

    plan = whole_plan(path)
    hashes = array("Q")
    for doc in segment_documents(path, plan, plan.segments[0], spec, first_line=0):
        hashes.append(id_hash(doc.doc_id))
        yield doc
    if not hashes:
        raise DataInputError(EMPTY_FILE, where=str(path), field=spec.set_name)
    repeated = repeated_id(path, spec, np.frombuffer(hashes, dtype=np.uint64))
    if repeated is not None:
        raise DataInputError(duplicate_id(repeated), where=str(path), field=spec.set_name)


EMPTY_FILE = "holds no non-empty document (an empty file?)"


def duplicate_id(doc_id: str) -> str:
    """The message for an id that appears twice in a set (prepare's, curate's)."""
    return f"document id {doc_id!r} appears twice; ids must be unique within a set"


def repeated_id(path: DataFile, spec: FileSpec, hashes: np.ndarray) -> str | None:
    """The first id of the file that appears twice in it, given its documents' id hashes (`id_hash`, in file
    order); None when no two hashes are equal, or only two different ids share one (a collision, not a repeat)."""
    import numpy as np

    from rungs.data.filework import id_hash

    ordered = np.sort(hashes)
    shared = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not shared:
        return None
    seen: set[str] = set()
    plan = whole_plan(path)
    for doc in segment_documents(path, plan, plan.segments[0], spec, first_line=0):
        if id_hash(doc.doc_id) in shared:
            if doc.doc_id in seen:
                return doc.doc_id
            seen.add(doc.doc_id)
    return None


@dataclass(frozen=True)
class Manifest:
    path: Path
    name: str
    sources: tuple[DocumentSet, ...]
    eval_sets: tuple[DocumentSet, ...]
    ngram_words: int = 13

    def content_hash(self) -> str:
        """The cache key of its shards: SHA-256 over the manifest text and, per data file, its name and
        fingerprint (`rungs.data.storage.fingerprints`: size, mtime or object version, and a hash of its
        first and last `FINGERPRINT_BYTES`).

        Reading every byte at every job start cost ~23 CPU-minutes at 1 TB; this reads 16 KiB per
        file. An edit that keeps a local file's size and mtime and touches neither end goes unnoticed
        (touch the file, or prepare into a new directory)."""
        h = hashlib.sha256(self.path.read_bytes())
        files = [(ds, f) for ds in self.sources + self.eval_sets for f in ds.files]
        for (ds, f), fingerprint in zip(files, fingerprints([f for _, f in files])):
            h.update(ds.rel(f).encode())
            h.update(fingerprint.encode())
        return h.hexdigest()


def file_fingerprint(path: DataFile) -> str:
    """Size, mtime (ns) or object version, and SHA-256 of the first and last FINGERPRINT_BYTES of a file."""
    return fingerprints([path])[0]


def _resolve_files(entry: dict, base: Path | str, where: str, label: str,
                   ) -> tuple[tuple[DataFile, ...], list[tuple[str, list[Path]]]]:
    """The files `entry`'s patterns match, and each local pattern that matched only folders (with them)."""
    patterns = entry.get("files")
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise DataInputError("needs `files`: a list of paths or globs relative to the manifest", where=where,
                             field=f"{label}.files")
    files: list[DataFile] = []
    only_folders: list[tuple[str, list[Path]]] = []
    for pattern in patterns:
        if is_url(pattern) or isinstance(base, str):
            url = pattern if is_url(pattern) or Path(pattern).is_absolute() else f"{str(base).rstrip('/')}/{pattern}"
            if not is_url(url):
                files.extend(_local_files(Path(url), pattern, where, label, only_folders))
                continue
            files.extend(list_remote(url, f"{label}.files"))
            continue
        files.extend(_local_files(base / pattern, pattern, where, label, only_folders))
    return tuple(files), only_folders


def _local_files(full: Path, pattern: str, where: str, label: str,
                 only_folders: list[tuple[str, list[Path]]]) -> list[Path]:
    """The files `pattern` matches; a pattern that matches only folders is added to `only_folders`."""
    matches = sorted(Path(m) for m in glob.glob(str(full), recursive=True))
    if not matches:
        raise DataInputError(f"{pattern!r} matches no file (looked for {full})", where=where, field=f"{label}.files")
    files = [m for m in matches if m.is_file()]
    if not files:
        only_folders.append((pattern, matches))
    return files


def _folders_refused(pattern: str, folders: list[Path], *, empty: bool) -> str:
    """The message for a `files` entry that matches only folders (`empty`: the set has no file at all)."""
    shown = ", ".join(str(f) for f in folders[:3]) + (f" and {len(folders) - 3} more" if len(folders) > 3 else "")
    stem = pattern.rstrip("/")
    return (("has no non-empty documents: " if empty else "")
            + f"`files` entry {pattern!r} matches only folders ({shown}), and a folder's files are not read "
            f"unless named: use a glob such as '{stem}/*.jsonl', or '{stem}/**/*' for every file under it")


_SOURCE_KEYS = {"name", "domain", "share", "files", "text_field", "id_field"}
_EVAL_KEYS = {"domain", "name", "files", "text_field", "id_field"}


def load_manifest(path: str | Path) -> Manifest:
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise DataInputError("manifest file not found", where=where)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise DataInputError(f"is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start})",
                             where=where) from None
    except yaml.YAMLError as err:
        raise DataInputError(f"not valid YAML ({' '.join(str(err).split())})", where=where) from None
    if not isinstance(raw, dict):
        raise DataInputError("expected a mapping with `sources` and `eval`", where=where)
    unknown = set(raw) - {"name", "description", "sources", "eval", "decontamination", "base"}
    if unknown:
        raise DataInputError(f"unknown keys {sorted(unknown)}; valid: name, description, sources, eval, decontamination, "
                             "base", where=where)
    base = _base(raw.get("base"), path.resolve().parent, where)
    sources = tuple(_document_set(e, i, base, where, train=True) for i, e in enumerate(raw.get("sources") or []))
    if not sources:
        raise DataInputError("needs at least one training source", where=where, field="sources")
    evals = tuple(_document_set(e, i, base, where, train=False) for i, e in enumerate(raw.get("eval") or []))
    for label, sets in (("sources", sources), ("eval", evals)):
        names = [s.name for s in sets]
        if len(set(names)) != len(names):
            raise DataInputError(f"names must be unique, got {names}", where=where, field=label)
    total = sum(s.share for s in sources)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise DataInputError(f"source shares sum to {total:.6g}; they must sum to 1 "
                             f"({', '.join(f'{s.name}={s.share:g}' for s in sources)})", where=where, field="sources.share")
    decon = raw.get("decontamination") or {}
    if not isinstance(decon, dict) or set(decon) - {"ngram_words"}:
        raise DataInputError(f"expected a mapping with only `ngram_words`, got {decon!r}", where=where,
                             field="decontamination")
    ngram = decon.get("ngram_words", 13)
    if not isinstance(ngram, int) or isinstance(ngram, bool) or ngram < 4:
        raise DataInputError(f"ngram_words must be an integer >= 4, got {ngram!r}", where=where,
                             field="decontamination.ngram_words")
    return Manifest(path=path.resolve(), name=str(raw.get("name", path.stem)), sources=sources, eval_sets=evals,
                    ngram_words=ngram)


def _base(value: object, folder: Path, where: str) -> Path | str:
    """Where relative `files` are: the manifest's folder, a folder relative to it, or a URL prefix."""
    if value is None:
        return folder
    if not isinstance(value, str) or not value:
        raise DataInputError(f"expected a folder or a URL prefix (s3://bucket/corpus), got {value!r}", where=where,
                             field="base")
    if is_url(value):
        return value.rstrip("/")
    return (folder / value).resolve()


def _document_set(entry: object, i: int, base: Path | str, where: str, *, train: bool) -> DocumentSet:
    label = f"{'sources' if train else 'eval'}[{i}]"
    if not isinstance(entry, dict):
        raise DataInputError("expected a mapping", where=where, field=label)
    unknown = set(entry) - (_SOURCE_KEYS if train else _EVAL_KEYS)
    if unknown:
        raise DataInputError(f"unknown keys {sorted(unknown)}; valid: {sorted(_SOURCE_KEYS if train else _EVAL_KEYS)}",
                             where=where, field=label)
    domain = entry.get("domain")
    name = entry.get("name", domain)
    if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
        raise DataInputError(f"needs a `name` of letters, digits, '-' or '_', got {name!r}", where=where, field=label)
    share = None
    if train:
        share = entry.get("share")
        if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1:
            raise DataInputError(f"share must be a number in (0, 1], got {share!r}", where=where, field=f"{label}.share")
        share = float(share)
    files, only_folders = _resolve_files(entry, base, where, label)
    if only_folders:  # the files in a folder are not read unless a glob names them (`prepare` saw no file here)
        pattern, folders = only_folders[0]
        raise DataInputError(_folders_refused(pattern, folders, empty=not files), where=where,
                             field=f"{'sources' if train else 'eval'}: {name}" if not files else f"{label}.files")
    for file in files:
        unsupported = unsupported_format(file.name)
        if unsupported is not None:
            raise DataInputError(unsupported, where=str(file), field=name)
    return DocumentSet(name=name, domain=str(domain or name), files=files, share=share,
                       text_field=str(entry.get("text_field", "text")), id_field=str(entry.get("id_field", "id")),
                       base=base)
