"""Reading the documents of one segment of an input file (`rungs.data.segments`), as a stream.

Formats by extension: `.jsonl`/`.jsonl.gz`/`.jsonl.zst` (one JSON object per line with `text` and
optionally `id`; field names configurable), `.parquet` (columns `text` and optionally `id`, a row
group at a time) and any other file as text (`.txt`, `.txt.gz`, ...: the whole file is one document,
its id the file's name relative to the manifest). Nothing holds more than one line, one row group or
two document pieces in memory, whatever the file's size. Other compressions and archives (`.bz2`, `.xz`,
`.lz4`, `.zip`, ...) are refused by suffix when the manifest is loaded (`segments.unsupported_format`), and
by their first bytes where a file fails to read as UTF-8 (`segments.format_of_bytes`), naming the formats
that are read.

A document longer than `MAX_DOCUMENT_BYTES` (1 MiB of UTF-8) is split into pieces of at most that
many bytes, cut after the last newline in the piece's second half (else after the last whitespace,
else at the limit), so that the pieces concatenate back to the document exactly. Piece k keeps the
document's id with the suffix `#part<k>` (`books/war-and-peace.txt#part3`): provenance, the
collection and decontamination stay per document while tokenizer memory stays bounded (encoding a
string costs ~150x its size). A text file is cut into the same pieces while it streams.

A JSONL line without an id (or with a null one) is named `<file>:<line>` by its line number in the whole
file, a Parquet row with a null id `<file>:<row>`; an id must otherwise be a string or a number (an object,
a list or a boolean is refused with its line or row: `str()` would make up an id). A reader of
a later segment learns the lines before it from the scan (`first_line`); read without it, the
segment reports `anonymous` and its ids are provisional. A JSONL text or id must be text UTF-8 can encode:
a lone surrogate escape (`\\ud800`, which `json` decodes without complaint) is refused with its line.
"""

from __future__ import annotations

import codecs
import gzip
import io
import itertools
import json
import numbers
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from rungs.data.errors import DataInputError
from rungs.data.segments import FilePlan, Segment, file_kind, format_of_bytes
from rungs.data.storage import DataFile, RemoteFile, check_unchanged, open_binary, size_of

MAX_DOCUMENT_BYTES = 1 << 20  # longer documents are split into pieces of at most this many bytes
PART_SUFFIX = "#part"
_CHUNK = 1 << 20
UTF8_BOM = codecs.BOM_UTF8  # what a file saved "UTF-8 with BOM" starts with


# A JSONL record's optional sampling weight (`ladder data mix` with `diversity: weight` writes it): the
# sampler draws the document within its source in proportion to it (rungs.data.sampler). Absent: 1.
WEIGHT_FIELD = "weight"


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    weight: float = 1.0


@dataclass(frozen=True)
class FileSpec:
    """What a reader needs of the set a file belongs to (small: it travels with every task)."""

    set_name: str
    rel: str  # the file's name in default ids: relative to the manifest's base
    text_field: str = "text"
    id_field: str = "id"


@dataclass
class SegmentStats:
    lines: int = 0  # JSONL lines that start in the segment, blank ones included
    anonymous: bool = False  # a line without an id was named with an unknown `first_line`


def whole_plan(file: DataFile) -> FilePlan:
    """The plan that reads a file start to end in one segment."""
    kind, codec = file_kind(file.name)
    if kind == "parquet":
        from rungs.data.segments import plan_file

        plan = plan_file(file, 1 << 62)
        return FilePlan(kind, codec, (plan.whole,))
    return FilePlan(kind, codec, (Segment(0, 0, size_of(file)),))


def segment_documents(file: DataFile, plan: FilePlan, segment: Segment, spec: FileSpec, *,
                      first_line: int | None = None, stats: SegmentStats | None = None) -> Iterator[Document]:
    """The non-empty documents that start in `segment` (long ones as pieces), in file order.

    Bad content is a DataInputError naming the file (and the line); `first_line` is the number of lines
    before the segment (0 for the first; None: unknown)."""
    stats = stats if stats is not None else SegmentStats()
    if isinstance(file, RemoteFile):
        check_unchanged(file)
    try:
        if plan.kind == "jsonl":
            records = _jsonl(file, plan.codec, segment, spec, first_line, stats)
        elif plan.kind == "parquet":
            records = _parquet(file, segment, spec)
        else:
            yield from _text(file, plan.codec, spec)
            return
        for doc in records:
            if not doc.text.strip():
                continue
            pieces = split_document(doc.text)
            if len(pieces) == 1:
                yield doc
                continue
            for k, piece in enumerate(pieces):
                yield Document(f"{doc.doc_id}{PART_SUFFIX}{k}", piece, doc.weight)
    except UnicodeDecodeError:
        raise DataInputError(_format_of(file, plan.codec) or
                             f"is not UTF-8 text ({_first_non_utf8(file, plan.codec)}); convert it to UTF-8 or drop "
                             "it from the manifest", where=str(file), field=spec.set_name) from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise DataInputError(f"is not a readable gzip file ({err or type(err).__name__})", where=str(file),
                             field=spec.set_name) from None
    except IsADirectoryError:
        raise DataInputError("is a directory, not a file", where=str(file), field=spec.set_name) from None
    except OSError as err:
        if plan.codec != "zstd":
            raise
        raise DataInputError(f"is not a readable zstd file ({err})", where=str(file), field=spec.set_name) from None


class _Region(io.RawIOBase):
    """Bytes [start, stop) of an open binary file, read with seeks (several regions share one file)."""

    def __init__(self, f, start: int, stop: int) -> None:
        self.f, self.pos, self.stop = f, start, stop

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.stop - self.pos)
        if n <= 0:
            return 0
        self.f.seek(self.pos)
        data = self.f.read(n)
        buffer[:len(data)] = data
        self.pos += len(data)
        return len(data)


class _ZstdRaw(io.RawIOBase):
    """A pyarrow zstd stream as a raw binary file."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.stream.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def decoded(f, codec: str, start: int, stop: int) -> io.BufferedReader:
    """The decompressed bytes of raw range [start, stop) (whole members or frames when compressed)."""
    region = _Region(f, start, stop)
    if codec == "gzip":
        return io.BufferedReader(gzip.GzipFile(fileobj=io.BufferedReader(region, _CHUNK), mode="rb"), _CHUNK)
    if codec == "zstd":
        import pyarrow as pa

        stream = pa.CompressedInputStream(pa.PythonFile(io.BufferedReader(region, _CHUNK), mode="r"), "zstd")
        return io.BufferedReader(_ZstdRaw(stream), _CHUNK)
    return io.BufferedReader(region, _CHUNK)


def _last_byte(f, codec: str, start: int, stop: int) -> bytes:
    if not codec:
        f.seek(stop - 1)
        return f.read(1)
    last = b""
    stream = decoded(f, codec, start, stop)
    for block in iter(lambda: stream.read(_CHUNK), b""):
        last = block[-1:]
    return last


def segment_lines(f, codec: str, segment: Segment, size: int) -> Iterator[bytes]:
    """The lines that start in `segment`, each whole (the last one finished from the bytes after it)."""
    skip = segment.prev >= 0 and _last_byte(f, codec, segment.prev, segment.start) != b"\n"
    stream = decoded(f, codec, segment.start, segment.stop)
    if skip and not stream.readline().endswith(b"\n"):
        return  # the line in progress runs through the whole segment: none starts here
    while line := stream.readline():
        if not line.endswith(b"\n") and segment.stop < size:
            line += decoded(f, codec, segment.stop, size).readline()
        yield line


def lines_before(file: DataFile, codec: str, segment: Segment) -> int:
    """Lines that start before `segment` (an error message's line number; reads the file up to it)."""
    if segment.start == 0:
        return 0
    count, last = 0, b""
    with open_binary(file) as f:
        stream = decoded(f, codec, 0, segment.start)
        for block in iter(lambda: stream.read(_CHUNK), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (0 if last == b"\n" else 1)


def _jsonl(file: DataFile, codec: str, segment: Segment, spec: FileSpec, first_line: int | None,
           stats: SegmentStats) -> Iterator[Document]:
    known = first_line if first_line is not None else (0 if segment.index == 0 else None)
    with open_binary(file) as f:
        for local, raw in enumerate(segment_lines(f, codec, segment, size_of(file)), 1):
            stats.lines += 1
            if not raw.strip():
                continue
            if local == 1 and segment.start == 0 and raw.startswith(UTF8_BOM):  # a file saved "UTF-8 with BOM"
                raw = raw[len(UTF8_BOM):]
            line = raw.decode("utf-8")
            try:
                row = json.loads(line)
                text = row[spec.text_field]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                number = (known if known is not None else lines_before(file, codec, segment)) + local
                raise DataInputError((_format_of(file, codec) if number == 1 else None) or
                                     f"line {number} is not a JSON object with a {spec.text_field!r} string ({err})",
                                     where=str(file), field=spec.set_name) from None
            if not isinstance(text, str):  # a number or a list is not a document: str() would make one up
                number = (known if known is not None else lines_before(file, codec, segment)) + local
                raise DataInputError(not_text(f"line {number}", spec.text_field, text), where=str(file),
                                     field=spec.set_name)
            weight = 1.0
            if WEIGHT_FIELD in row:
                weight = row[WEIGHT_FIELD]
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
                    number = (known if known is not None else lines_before(file, codec, segment)) + local
                    raise DataInputError(f"line {number}: field {WEIGHT_FIELD!r} is {weight!r}; a document's weight "
                                         "must be a positive finite number", where=str(file), field=spec.set_name)
                weight = float(weight)
            doc_id = row.get(spec.id_field)
            if doc_id is not None and not isinstance(doc_id, str):
                if not is_number(doc_id):
                    number = (known if known is not None else lines_before(file, codec, segment)) + local
                    raise DataInputError(not_an_id(f"line {number}", spec.id_field, doc_id, "<file>:<line>"),
                                         where=str(file), field=spec.set_name)
                doc_id = str(doc_id)
            # A lone surrogate comes only from an escape (the line decoded as UTF-8), and is not ASCII: a line of
            # ASCII (an O(1) flag), or one without a backslash (a memchr), costs no encode.
            if (not text.isascii() or not (doc_id or "").isascii()) and b"\\" in raw:
                for field, value in ((spec.text_field, text), (spec.id_field, doc_id or "")):
                    bad = unencodable(value)
                    if bad is not None:  # a lone surrogate escape (\ud800): json decodes it, UTF-8 cannot encode it
                        number = (known if known is not None else lines_before(file, codec, segment)) + local
                        raise DataInputError(f"line {number}: field {field!r} holds a lone surrogate escape "
                                             f"(\\u{ord(value[bad]):04x} at character {bad}), which is not text UTF-8 "
                                             "can encode; fix the escape in the file or drop the record",
                                             where=str(file), field=spec.set_name)
            if doc_id is not None:
                yield Document(doc_id, text, weight)
                continue
            if known is None:
                stats.anonymous = True
            yield Document(f"{spec.rel}:{(known or 0) + local}", text, weight)


def unencodable(value: str) -> int | None:
    """Where `value` first holds a character UTF-8 cannot encode (a lone surrogate, which a JSON escape such as
    `\\ud800` makes), or None. Nothing to do for ASCII (an O(1) flag), else one encode (~1 GB/s; a regex search
    for surrogates is ~5x slower)."""
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start
    return None


def not_text(position: str, field: str, value) -> str:
    """The message for a document whose text is not a string (`position`: "line 3", "row 7")."""
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return (f"{position}: field {field!r} is {type(value).__name__} {shown}, not a string; a document's text "
            f"must be a string (convert it in the file, or drop the record)")


def is_number(value) -> bool:
    """An int, float or decimal (a JSON or Parquet number), not a boolean: an id may be one."""
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def not_an_id(position: str, field: str, value, default: str) -> str:
    """The message for an id that is neither a string nor a number (nor null: no id)."""
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return (f"{position}: field {field!r} is {type(value).__name__} {shown}; a document's id must be a string or a "
            f"number, or null for none (the document is then named {default}): fix it in the file, or drop "
            "the record")


def _parquet(file: DataFile, segment: Segment, spec: FileSpec) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = open_binary(file) if isinstance(file, RemoteFile) else str(file)
    try:
        pf = pq.ParquetFile(source)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise DataInputError(f"is not a readable Parquet file ({str(err).splitlines()[0] if str(err) else err!r})",
                             where=str(file), field=spec.set_name) from None
    columns = pf.schema_arrow.names
    if spec.text_field not in columns:
        raise DataInputError(f"no {spec.text_field!r} column (columns: {columns})", where=str(file), field=spec.set_name)
    if segment.stop <= segment.start:
        return
    wanted = [spec.text_field] + ([spec.id_field] if spec.id_field in columns else [])
    row = segment.first_row
    for group in range(segment.start, segment.stop):  # one row group at a time: all of them would be pre-buffered
        for batch in pf.iter_batches(batch_size=128, columns=wanted, row_groups=[group]):
            column = batch.column(spec.text_field)
            texts = column.to_pylist()
            if column.null_count or not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
                if bad is not None:  # a null or a number is not a document: str() would make one up
                    raise DataInputError(not_text(f"row {row + bad} (counting from 0)", spec.text_field, texts[bad]),
                                         where=str(file), field=spec.set_name)
            ids = batch.column(spec.id_field).to_pylist() if spec.id_field in columns else [None] * len(texts)
            for i, (doc_id, text) in enumerate(zip(ids, texts)):
                if doc_id is None:  # no id column, or a null in it
                    doc_id = f"{spec.rel}:{row + i}"
                elif not isinstance(doc_id, str):
                    if not is_number(doc_id):
                        raise DataInputError(not_an_id(f"row {row + i} (counting from 0)", spec.id_field, doc_id,
                                                       "<file>:<row>"), where=str(file), field=spec.set_name)
                    doc_id = str(doc_id)
                yield Document(doc_id, str(text))
            row += len(texts)


def _text(file: DataFile, codec: str, spec: FileSpec) -> Iterator[Document]:
    """The whole file as one document, cut into pieces as it streams (universal newlines, as text mode reads)."""
    with open_binary(file) as f:
        # utf-8-sig: a byte-order mark at the start (a file saved "UTF-8 with BOM") is not the document's text
        stream = io.TextIOWrapper(decoded(f, codec, 0, size_of(file)), encoding="utf-8-sig")
        seen = [0]

        def chunks() -> Iterator[str]:
            for chunk in iter(lambda: stream.read(_CHUNK), ""):
                if "\x00" in chunk:
                    raise DataInputError(_format_of(file, codec) or f"looks binary (a NUL byte at character "
                                         f"{seen[0] + chunk.index(chr(0))}); a text document must be UTF-8 text",
                                         where=str(file), field=spec.set_name)
                seen[0] += len(chunk)
                yield chunk

        pieces = iter_pieces(chunks())
        head: list[str] = []  # up to the first piece with any text: a document of only whitespace is none
        for piece in pieces:
            head.append(piece)
            if piece.strip():
                break
        else:
            return
        following = next(pieces, None)
        if following is None and len(head) == 1:
            yield Document(spec.rel, head[0])
            return
        rest = head + ([following] if following is not None else [])
        for k, piece in enumerate(itertools.chain(rest, pieces)):
            yield Document(f"{spec.rel}{PART_SUFFIX}{k}", piece)


def split_document(text: str, max_bytes: int = MAX_DOCUMENT_BYTES) -> list[str]:
    """`text` as pieces of at most `max_bytes` UTF-8 bytes that concatenate back to it exactly.

    Each piece ends after its last newline in its second half, else after its last whitespace
    there, else at the limit (a character boundary). A text within the limit is one piece.
    """
    if max_bytes < 4:
        raise ValueError(f"max_bytes must hold one UTF-8 character (>= 4), got {max_bytes}")
    if len(text) <= max_bytes // 4 or len(text.encode("utf-8")) <= max_bytes:
        return [text]
    return list(iter_pieces(iter([text]), max_bytes))


def iter_pieces(chunks: Iterator[str], max_bytes: int = MAX_DOCUMENT_BYTES) -> Iterator[str]:
    """`split_document` over a text that arrives in chunks, holding at most ~2·max_bytes characters."""
    buf, done = "", False

    def fill() -> None:
        nonlocal buf, done
        while not done and len(buf) <= max_bytes:
            chunk = next(chunks, None)
            if chunk is None:
                done = True
            else:
                buf += chunk

    fill()
    if done and len(buf.encode("utf-8")) <= max_bytes:
        if buf:
            yield buf
        return
    while buf:
        window = buf[:max_bytes]
        encoded = window.encode("utf-8")
        if len(encoded) > max_bytes:  # keep whole characters within max_bytes
            window = encoded[:max_bytes].decode("utf-8", errors="ignore")
        if len(window) < len(buf) or not done:
            half = len(window) // 2
            cut = window.rfind("\n", half) + 1
            if not cut:
                cut = max(window.rfind(c, half) for c in " \t\r\f\v") + 1
            window = window[:cut] if cut else window
        yield window
        buf = buf[len(window):]
        fill()


def _format_of(file: DataFile, codec: str) -> str | None:
    """For a file that did not read as UTF-8 text: the message naming what its first bytes say it is (a
    compression prepare does not read, an archive, gzip or zstd without its suffix), or None."""
    try:
        with open_binary(file) as f:
            head = decoded(f, codec, 0, size_of(file)).read(16)
    except (OSError, EOFError, zlib.error):
        return None
    return format_of_bytes(head, file.name, codec)


def _first_non_utf8(file: DataFile, codec: str) -> str:
    """Where the first invalid UTF-8 byte of a (possibly compressed) file is, for the error message."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open_binary(file) as f:
        stream = decoded(f, codec, 0, size_of(file))
        for block in iter(lambda: stream.read(_CHUNK), b""):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                return f"byte 0x{block[err.start]:02x} at offset {offset + err.start}"
            offset += len(block)
    return "truncated multi-byte character at the end"
