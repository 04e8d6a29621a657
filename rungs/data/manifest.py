"""Corpus manifests: which documents make up each training source and each held-out domain.

A manifest is YAML, paths relative to the manifest file:

    name: demo
    sources:                       # training sources; shares sum to 1
      - {name: code, domain: code, share: 0.45, files: [corpus/code.jsonl.gz]}
    eval:                          # held-out sets, one per domain
      - {domain: code, files: [corpus/eval_code.jsonl.gz]}
    decontamination: {ngram_words: 13}

`files` entries may be globs. Formats by extension: `.jsonl`/`.jsonl.gz`/`.jsonl.zst` (one JSON object
per line with `text` and optionally `id`; field names configurable with `text_field`/`id_field`),
`.txt` / `.txt.gz` / `.txt.zst` or any other text file (the whole file is one document, its id the
relative path) and `.parquet` (columns `text` and optionally `id`, read a row group at a time). Every
format is read as a stream: a file's documents are never all in memory. Every file must be UTF-8 text (or gzip of it) and
hold at least one non-empty document; anything else (an empty, binary or non-UTF-8 file) is refused
with an error naming the file.

A document longer than `MAX_DOCUMENT_BYTES` (1 MiB of UTF-8) is split into pieces of at most that
many bytes, cut after the last newline in the piece's second half (else after the last whitespace,
else at the limit), so that the pieces concatenate back to the document exactly. Piece k keeps the
document's id with the suffix `#part<k>` (`books/war-and-peace.txt#part3`): provenance, the
collection and decontamination stay per document while tokenizer memory stays bounded (encoding a
string costs ~150x its size). Every shipped demo document is far below the limit.

A document's collection is its id up to the first '/' (`metamath/set.mm#3` is in `metamath`); the
sampler gives each collection of a source the same share of every rung's unique subset.
"""

from __future__ import annotations

import codecs
import glob
import gzip
import hashlib
import io
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rungs.data.errors import DataInputError

SHARE_TOLERANCE = 1e-6
MAX_DOCUMENT_BYTES = 1 << 20  # longer documents are split into pieces of at most this many bytes
PART_SUFFIX = "#part"
DEMO_MANIFEST = Path(__file__).resolve().parent / "demo" / "manifest.yaml"


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str


@dataclass(frozen=True)
class DocumentSet:
    """One training source (with a share) or one held-out domain (share None)."""

    name: str
    domain: str
    files: tuple[Path, ...]
    share: float | None = None
    text_field: str = "text"
    id_field: str = "id"
    base: Path = field(default=Path("."))

    def documents(self) -> Iterator[Document]:
        """Every non-empty document in file order, those over `MAX_DOCUMENT_BYTES` as their pieces.

        Ids are checked unique across the set here with a set of every id (fine for a small set);
        `prepare` streams `file_documents` per file and checks across files with hashed ids."""
        seen: set[str] = set()
        for path in self.files:
            for doc in self.file_documents(path):
                if doc.doc_id in seen:
                    raise DataInputError(f"document id {doc.doc_id!r} appears twice; ids must be unique within a set",
                                         where=str(path), field=self.name)
                seen.add(doc.doc_id)
                yield doc

    def file_documents(self, path: Path) -> Iterator[Document]:
        """The non-empty documents of one of this set's files (long ones as pieces), ids unique in the file."""
        seen: set[str] = set()
        non_empty = 0
        for doc in _read_file(path, self):
            if doc.doc_id in seen:
                raise DataInputError(f"document id {doc.doc_id!r} appears twice; ids must be unique within a set",
                                     where=str(path), field=self.name)
            seen.add(doc.doc_id)
            if not doc.text.strip():
                continue
            non_empty += 1
            pieces = split_document(doc.text)
            if len(pieces) == 1:
                yield doc
                continue
            for k, piece in enumerate(pieces):
                piece_id = f"{doc.doc_id}{PART_SUFFIX}{k}"
                if piece_id in seen:
                    raise DataInputError(f"document id {piece_id!r} (a piece of the long document "
                                         f"{doc.doc_id!r}) appears twice", where=str(path), field=self.name)
                seen.add(piece_id)
                yield Document(piece_id, piece)
        if not non_empty:
            raise DataInputError("holds no non-empty document (an empty file?)", where=str(path), field=self.name)


def split_document(text: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> list[str]:
    """`text` as pieces of at most `max_bytes` UTF-8 bytes that concatenate back to it exactly.

    Each piece ends after its last newline in its second half, else after its last whitespace
    there, else at the limit (a character boundary). A text within the limit is one piece.
    """
    if max_bytes < 4:
        raise ValueError(f"max_bytes must hold one UTF-8 character (>= 4), got {max_bytes}")
    if len(text) <= max_bytes // 4 or len(text.encode("utf-8")) <= max_bytes:
        return [text]
    pieces, pos = [], 0
    while pos < len(text):
        window = text[pos:pos + max_bytes]
        encoded = window.encode("utf-8")
        if len(encoded) > max_bytes:  # keep whole characters within max_bytes
            window = encoded[:max_bytes].decode("utf-8", errors="ignore")
        if pos + len(window) < len(text):
            half = len(window) // 2
            cut = window.rfind("\n", half) + 1
            if not cut:
                cut = max(window.rfind(c, half) for c in " \t\r\f\v") + 1
            window = window[:cut] if cut else window
        pieces.append(window)
        pos += len(window)
    return pieces


@dataclass(frozen=True)
class Manifest:
    path: Path
    name: str
    sources: tuple[DocumentSet, ...]
    eval_sets: tuple[DocumentSet, ...]
    ngram_words: int = 13

    def content_hash(self) -> str:
        """The cache key of its shards: SHA-256 over the manifest text and, per data file, its name, size,
        modification time and a hash of its first and last `FINGERPRINT_BYTES` (`file_fingerprint`).

        Reading every byte at every job start cost ~23 CPU-minutes at 1 TB (#20); this reads 16 KiB per
        file. An edit that keeps a file's size and mtime and touches neither end goes unnoticed (touch
        the file, or prepare into a new directory)."""
        h = hashlib.sha256(self.path.read_bytes())
        for ds in self.sources + self.eval_sets:
            for f in ds.files:
                h.update(str(f.relative_to(ds.base) if f.is_relative_to(ds.base) else f).encode())
                h.update(file_fingerprint(f).encode())
        return h.hexdigest()


FINGERPRINT_BYTES = 8 << 10  # per end: 16 KiB a file, 16 MB for 1 TB in 1 GB files (cold disk: well under 1 s)


def file_fingerprint(path: Path) -> str:
    """Size, mtime (ns) and SHA-256 of the first and last FINGERPRINT_BYTES of a file."""
    st = os.stat(path)
    h = hashlib.sha256(f"{st.st_size}|{st.st_mtime_ns}|".encode())
    with open(path, "rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        if st.st_size > FINGERPRINT_BYTES:
            f.seek(max(FINGERPRINT_BYTES, st.st_size - FINGERPRINT_BYTES))
            h.update(f.read(FINGERPRINT_BYTES))
    return h.hexdigest()


def _open_binary(path: Path):
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.name.endswith(".zst"):
        import pyarrow as pa

        return pa.CompressedInputStream(pa.OSFile(str(path), "rb"), "zstd")
    return open(path, "rb")


def _open_text(path: Path):
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if path.name.endswith(".zst"):
        return io.TextIOWrapper(io.BufferedReader(_ZstdRaw(_open_binary(path))), encoding="utf-8")
    return open(path, encoding="utf-8")


class _ZstdRaw(io.RawIOBase):
    """A pyarrow zstd stream as a raw binary file (for io.TextIOWrapper)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.stream.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.stream.close()
        super().close()


def _read_file(path: Path, ds: DocumentSet) -> Iterator[Document]:
    """The documents of one file; an unreadable, binary or non-UTF-8 file is a DataInputError naming it."""
    try:
        yield from _read_documents(path, ds)
    except UnicodeDecodeError:
        raise DataInputError(f"is not UTF-8 text ({_first_non_utf8(path)}); convert it to UTF-8 or drop it from "
                             "the manifest", where=str(path), field=ds.name) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise DataInputError(f"is not a readable gzip file ({err or type(err).__name__})", where=str(path),
                             field=ds.name) from None
    except IsADirectoryError:
        raise DataInputError("is a directory, not a file", where=str(path), field=ds.name) from None
    except OSError as err:
        if not path.name.endswith(".zst"):
            raise
        raise DataInputError(f"is not a readable zstd file ({err})", where=str(path), field=ds.name) from None


def _first_non_utf8(path: Path) -> str:
    """Where the first invalid UTF-8 byte of a (possibly gzipped) file is, for the error message."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with _open_binary(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                return f"byte 0x{block[err.start]:02x} at offset {offset + err.start}"
            offset += len(block)
    return "truncated multi-byte character at the end"


def _read_documents(path: Path, ds: DocumentSet) -> Iterator[Document]:
    rel = str(path.relative_to(ds.base)) if path.is_relative_to(ds.base) else str(path)
    name = path.name.removesuffix(".gz").removesuffix(".zst")
    if name.endswith(".jsonl"):
        with _open_text(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    text = row[ds.text_field]
                except (json.JSONDecodeError, KeyError, TypeError) as err:
                    raise DataInputError(f"line {line_no} is not a JSON object with a {ds.text_field!r} string ({err})",
                                         where=str(path), field=ds.name) from None
                yield Document(str(row.get(ds.id_field, f"{rel}:{line_no}")), str(text))
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise DataInputError(f"is not a readable Parquet file ({str(err).splitlines()[0] if str(err) else err!r})",
                                 where=str(path), field=ds.name) from None
        columns = pf.schema_arrow.names
        if ds.text_field not in columns:
            raise DataInputError(f"no {ds.text_field!r} column (columns: {columns})", where=str(path), field=ds.name)
        wanted = [ds.text_field] + ([ds.id_field] if ds.id_field in columns else [])
        row = 0
        for batch in pf.iter_batches(batch_size=1024, columns=wanted):
            texts = batch.column(ds.text_field).to_pylist()
            ids = batch.column(ds.id_field).to_pylist() if ds.id_field in columns else \
                [f"{rel}:{row + i}" for i in range(len(texts))]
            row += len(texts)
            for doc_id, text in zip(ids, texts):
                yield Document(str(doc_id), str(text))
    else:
        with _open_text(path) as f:
            text = f.read()
        if "\x00" in text:
            raise DataInputError(f"looks binary (a NUL byte at character {text.index(chr(0))}); a text document "
                                 "must be UTF-8 text", where=str(path), field=ds.name)
        yield Document(rel, text)


def _resolve_files(entry: dict, base: Path, where: str, label: str) -> tuple[Path, ...]:
    patterns = entry.get("files")
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise DataInputError("needs `files`: a list of paths or globs relative to the manifest", where=where,
                             field=f"{label}.files")
    files: list[Path] = []
    for pattern in patterns:
        full = base / pattern
        matches = sorted(Path(m) for m in glob.glob(str(full), recursive=True))
        if not matches:
            raise DataInputError(f"{pattern!r} matches no file (looked for {full})", where=where, field=f"{label}.files")
        files.extend(m for m in matches if m.is_file())
    return tuple(files)


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
    unknown = set(raw) - {"name", "description", "sources", "eval", "decontamination"}
    if unknown:
        raise DataInputError(f"unknown keys {sorted(unknown)}; valid: name, description, sources, eval, decontamination",
                             where=where)
    base = path.resolve().parent
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


def _document_set(entry: object, i: int, base: Path, where: str, *, train: bool) -> DocumentSet:
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
    files = _resolve_files(entry, base, where, label)
    return DocumentSet(name=name, domain=str(domain or name), files=files, share=share,
                       text_field=str(entry.get("text_field", "text")), id_field=str(entry.get("id_field", "id")),
                       base=base)
