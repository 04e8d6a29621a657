"""How one input file is cut into segments: the unit of parallel work and of output (one shard each).

The cut depends on the file and `shard_bytes` alone, never on the number of workers or on how the
segments are grouped into tasks, so any worker count and any split give the same shards:

- JSONL, uncompressed: byte ranges `[k·S, (k+1)·S)`; a line belongs to the range its first byte is in
  (a reader of range k skips the line in progress at its start and finishes the one running over its end);
- `.gz` written as BGZF (bgzip: each member states its size) and `.zst` with several frames: the
  members or frames that start in each `S` of compressed bytes, lines aligned the same way. Frames
  are found from the zstd seekable format's table at the end of the file (local or remote) or by
  walking frame headers (local files: reads a few bytes per 128 KiB block);
- Parquet: the row groups that start in each `S` of uncompressed data (from the footer);
- anything else is one segment, read by one worker, and `reason` says why when the file is larger
  than a shard: a gzip of one member (or not BGZF), a zstd file of one frame, a remote compressed
  file without a seek table (finding its members would mean reading it first), a text file (one
  document).

A `Segment` carries the raw byte range to decode (`start`, `stop`), and `prev`, where the member
before it starts (the byte before it, uncompressed): its last decoded byte says whether the
segment's first line starts at `start` or is the tail of the line before.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rungs.data.errors import DataInputError
from rungs.data.storage import DataFile, RemoteFile, open_binary, remote_errors, size_of

_ZSTD_MAGIC = 0xFD2FB528
_SEEKABLE_MAGIC = 0x8F92EAB1
_SEEK_TABLE_FRAME = 0x184D2A5E


@dataclass(frozen=True)
class Segment:
    index: int  # k in the shard stem <file>-<k>
    start: int  # bytes (JSONL) or the first row group (Parquet)
    stop: int
    prev: int = -1  # where the member before `start` starts; -1 for the first segment
    first_row: int = 0  # Parquet: the file's row number of the segment's first row


@dataclass(frozen=True)
class FilePlan:
    kind: str  # "jsonl", "parquet" or "text"
    codec: str  # "", "gzip" or "zstd"
    segments: tuple[Segment, ...]
    reason: str = ""  # why a file over one shard is one segment

    @property
    def whole(self) -> Segment:
        """One segment over the whole file (how a file is read start to end)."""
        if self.kind == "parquet":
            return Segment(0, self.segments[0].start, self.segments[-1].stop)
        return Segment(0, 0, self.segments[-1].stop)


# Compressions and archives prepare does not read: refused by suffix (`unsupported_format`, when the manifest
# is loaded) and by their first bytes where a file fails to read as text (`format_of_bytes`).
SUPPORTED_FORMATS = ".jsonl, .parquet or text, uncompressed or compressed as .gz (gzip, BGZF) or .zst (zstd)"
_UNSUPPORTED_SUFFIXES = {".bz2": "bzip2-compressed", ".xz": "xz-compressed", ".lzma": "LZMA-compressed",
                         ".lz4": "LZ4-compressed", ".zip": "a zip archive", ".7z": "a 7-Zip archive",
                         ".tar": "a tar archive", ".tgz": "a tar archive"}
_MAGIC = ((b"\xfd7zXZ\x00", "xz-compressed"), (b"\x04\x22\x4d\x18", "LZ4-compressed"), (b"PK\x03\x04", "a zip archive"),
          (b"PK\x05\x06", "a zip archive"), (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"))


def _unsupported(what: str) -> str:
    return (f"is {what}, a format prepare does not read (it reads {SUPPORTED_FORMATS}); decompress it, or "
            "recompress it as .gz or .zst, or drop it from the manifest")


def unsupported_format(name: str) -> str | None:
    """Why a file named `name` cannot be read (a compression or archive suffix prepare does not read, also
    under .gz or .zst: `x.tar.gz`), or None."""
    lowered = name.lower()
    bases = (lowered, lowered.removesuffix(".gz").removesuffix(".zst"))
    what = next((w for suffix, w in _UNSUPPORTED_SUFFIXES.items() if any(b.endswith(suffix) for b in bases)), None)
    return _unsupported(what) if what is not None else None


def format_of_bytes(head: bytes, name: str, codec: str) -> str | None:
    """What a file's first (decompressed) bytes say it is, when that is not text prepare can read: another
    compression or an archive, or gzip or zstd under a name without their suffix (`codec` ""). None otherwise."""
    if not codec and head.startswith(b"\x1f\x8b"):
        return f"is gzip-compressed, but its name does not end in .gz; rename it {name}.gz"
    if not codec and head.startswith(b"\x28\xb5\x2f\xfd"):
        return f"is zstd-compressed, but its name does not end in .zst; rename it {name}.zst"
    if head.startswith(b"BZh") and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return _unsupported("bzip2-compressed")
    what = next((w for magic, w in _MAGIC if head.startswith(magic)), None)
    return _unsupported(what) if what is not None else None


def file_kind(name: str) -> tuple[str, str]:
    codec = "gzip" if name.endswith(".gz") else "zstd" if name.endswith(".zst") else ""
    base = name.removesuffix(".gz").removesuffix(".zst")
    return ("jsonl" if base.endswith(".jsonl") else "parquet" if base.endswith(".parquet") else "text"), codec


def plan_file(file: DataFile, shard_bytes: int, *, field: str | None = None) -> FilePlan:
    kind, codec = file_kind(file.name)
    size = size_of(file)
    if kind == "parquet":
        return _parquet_plan(file, shard_bytes, field)
    if kind == "text":
        return _one(kind, codec, size, shard_bytes, "a text file is one document")
    if not codec:
        count = max(1, -(-size // shard_bytes))
        return FilePlan(kind, codec, tuple(Segment(k, k * shard_bytes, min((k + 1) * shard_bytes, size),
                                                   k * shard_bytes - 1 if k else -1) for k in range(count)))
    if size <= shard_bytes:
        return _one(kind, codec, size, shard_bytes, "")
    with remote_errors(str(file), field), open_binary(file) as f:
        if codec == "zstd":
            starts = _seek_table(f, size)
            if starts is None and isinstance(file, RemoteFile):
                return _one(kind, codec, size, shard_bytes, "a remote zstd file without a seek table (the seekable "
                            "format) is read from its start: its frames are found only by reading it")
            starts = starts if starts is not None else _zstd_frames(f, size)
            why = "a zstd file of one frame can only be read from its start; write it in several frames to split it"
        else:
            if isinstance(file, RemoteFile):
                return _one(kind, codec, size, shard_bytes, "a remote gzip file is read from its start: its members "
                            "are found only by reading it")
            starts = _bgzf_blocks(f, size)
            why = ("a gzip file that is not BGZF (bgzip) can only be read from its start: its members do not state "
                   "their sizes")
    if starts is None or len(starts) < 2:
        return _one(kind, codec, size, shard_bytes, why)
    return FilePlan(kind, codec, _group(starts, size, shard_bytes))


def _one(kind: str, codec: str, size: int, shard_bytes: int, why: str) -> FilePlan:
    return FilePlan(kind, codec, (Segment(0, 0, size),), why if size > shard_bytes else "")


def _group(starts: list[int], size: int, shard_bytes: int) -> tuple[Segment, ...]:
    """Members grouped by the `shard_bytes` cell their start falls in (cells without a start hold nothing)."""
    firsts = [i for i, s in enumerate(starts) if i == 0 or s // shard_bytes != starts[i - 1] // shard_bytes]
    bounds = firsts + [len(starts)]
    return tuple(Segment(k, starts[a], starts[b] if b < len(starts) else size, starts[a - 1] if a else -1)
                 for k, (a, b) in enumerate(zip(bounds, bounds[1:])))


def _read_at(f, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def _seek_table(f, size: int) -> list[int] | None:
    """Frame starts from the zstd seekable format's seek table (a skippable frame at the end), or None."""
    if size < 17:
        return None
    n_frames, descriptor, magic = struct.unpack("<IBI", _read_at(f, size - 9, 9))
    if magic != _SEEKABLE_MAGIC:
        return None
    entry = 12 if descriptor & 0x80 else 8
    table = 8 + n_frames * entry + 9
    if table > size:
        return None
    blob = _read_at(f, size - table, table)
    if struct.unpack("<II", blob[:8]) != (_SEEK_TABLE_FRAME, table - 8):
        return None
    starts, pos = [], 0
    for i in range(n_frames):
        starts.append(pos)
        pos += struct.unpack_from("<I", blob, 8 + i * entry)[0]
    return starts if pos == size - table else None


def _zstd_frames(f, size: int) -> list[int] | None:
    """Data frame starts, by walking frame and block headers (skippable frames join the frame before).
    None when the bytes are not a zstd stream (the reader then reports the file as unreadable)."""
    starts, pos = [], 0
    while pos < size:
        head = _read_at(f, pos, 14)
        if len(head) < 8:
            return None
        magic = struct.unpack_from("<I", head)[0]
        if 0x184D2A50 <= magic <= 0x184D2A5F:
            pos += 8 + struct.unpack_from("<I", head, 4)[0]
            continue
        if magic != _ZSTD_MAGIC:
            return None
        fhd = head[4]
        single = (fhd >> 5) & 1
        header = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + ((1 if single else 0), 2, 4, 8)[fhd >> 6]
        starts.append(0 if not starts else pos)
        block = pos + header
        while True:
            raw = _read_at(f, block, 3)
            if len(raw) < 3:
                return None
            bh = int.from_bytes(raw, "little")
            kind, n = (bh >> 1) & 3, bh >> 3
            if kind == 3:
                return None
            block += 3 + (1 if kind == 1 else n)
            if bh & 1:
                break
        pos = block + (4 if (fhd >> 2) & 1 else 0)
    return starts


def _bgzf_blocks(f, size: int) -> list[int] | None:
    """Member starts of a BGZF file (each member's extra field 'BC' holds its size), or None if any is not."""
    starts, pos = [], 0
    while pos < size:
        head = _read_at(f, pos, 12)
        if len(head) < 12 or head[:4] != b"\x1f\x8b\x08\x04":
            return None
        xlen = struct.unpack_from("<H", head, 10)[0]
        extra, at, block = _read_at(f, pos + 12, xlen), 0, None
        while at + 4 <= len(extra):
            slen = struct.unpack_from("<H", extra, at + 2)[0]
            if extra[at:at + 2] == b"BC" and slen == 2:
                block = struct.unpack_from("<H", extra, at + 4)[0] + 1
            at += 4 + slen
        if block is None:
            return None
        starts.append(pos)
        pos += block
    return starts


def _parquet_plan(file: DataFile, shard_bytes: int, field: str | None) -> FilePlan:
    import pyarrow.parquet as pq

    with remote_errors(str(file), field), open_binary(file) as f:
        try:
            meta = pq.ParquetFile(f).metadata
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise DataInputError(f"is not a readable Parquet file ({str(err).splitlines()[0] if str(err) else err!r})",
                                 where=str(file), field=field) from None
    groups = [(meta.row_group(i).total_byte_size, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    segments, cell, begin, rows, row, at = [], None, 0, 0, 0, 0
    for i, (n_bytes, n_rows) in enumerate(groups):
        if cell is not None and at // shard_bytes != cell:
            segments.append(Segment(len(segments), begin, i, first_row=rows))
            begin, rows = i, row
        cell = at // shard_bytes
        at += n_bytes
        row += n_rows
    segments.append(Segment(len(segments), begin, len(groups), first_row=rows))
    return FilePlan("parquet", "", tuple(segments))
