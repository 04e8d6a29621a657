"""Writers of the compressed layouts a large input can be split along, built from the format specs (the
readers under test use neither these nor any shared code): BGZF (gzip members that state their size,
as bgzip writes), zstd in several frames, and zstd's seekable format (its seek table at the end)."""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path


def bgzf(data: bytes, block_bytes: int = 4_096) -> bytes:
    """BGZF: one gzip member per `block_bytes` of input (cut anywhere, lines included), each with the
    extra subfield 'BC' holding its total size - 1, then the empty end-of-file member."""
    out = bytearray()
    for begin in range(0, len(data), block_bytes):
        chunk = data[begin:begin + block_bytes]
        deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
        body = deflate.compress(chunk) + deflate.flush()
        size = 12 + 6 + len(body) + 8
        out += b"\x1f\x8b\x08\x04" + b"\x00" * 4 + b"\x00\xff" + struct.pack("<HccHH", 6, b"B", b"C", 2, size - 1)
        out += body + struct.pack("<II", zlib.crc32(chunk), len(chunk) & 0xFFFFFFFF)
    out += bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")  # the BGZF EOF block
    return bytes(out)


def gzip_members(data: bytes, block_bytes: int = 4_096) -> bytes:
    """Plain multi-member gzip (`cat a.gz b.gz`): members that do not state their size."""
    return b"".join(gzip.compress(data[b:b + block_bytes], mtime=0) for b in range(0, len(data), block_bytes))


def zstd_frames(data: bytes, block_bytes: int = 4_096, skippable: bool = True) -> tuple[bytes, list[int]]:
    """One zstd frame per `block_bytes` of input (and a skippable frame after the first); the file and
    each frame's compressed size."""
    import pyarrow as pa

    frames = []
    for begin in range(0, len(data), block_bytes):
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, "zstd") as f:
            f.write(data[begin:begin + block_bytes])
        frames.append(sink.getvalue().to_pybytes())
    skip = struct.pack("<II", 0x184D2A50, 5) + b"notes" if skippable else b""  # user data between frames
    return frames[0] + skip + b"".join(frames[1:]), [len(frames[0]) + len(skip)] + [len(f) for f in frames[1:]]


def zstd_seekable(data: bytes, block_bytes: int = 4_096) -> bytes:
    """The seekable format: frames, then a skippable frame (magic 0x184D2A5E) holding each frame's
    compressed and decompressed size and a footer (frame count, descriptor, magic 0x8F92EAB1)."""
    body, sizes = zstd_frames(data, block_bytes, skippable=False)
    plain = [len(data[b:b + block_bytes]) for b in range(0, len(data), block_bytes)]
    entries = b"".join(struct.pack("<II", c, d) for c, d in zip(sizes, plain))
    footer = struct.pack("<IBI", len(sizes), 0, 0x8F92EAB1)
    return body + struct.pack("<II", 0x184D2A5E, len(entries) + len(footer)) + entries + footer


def write(path: Path, blob: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob)
    return path
