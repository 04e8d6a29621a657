"""One shard written while it is encoded, so that a worker's memory does not grow with the shard.

Shard `<split>/<set>/<file:05d>-<k:04d>` is `.tokens.npy` (each document's ids then EOS), `.index.npy`
(int64 [docs, 3]: start in the shard, tokens with EOS, UTF-8 bytes) and `.ids.json` (document ids, and
their sampling weights when any is not 1),
then `.json` (counts, the tokens file's SHA-256 and the input key) last: a shard whose `.json`
carries the current key is finished, anything else is redone.

The token ids stream batch by batch into the `.tokens.npy` temporary behind a placeholder header;
the real header (the same length: numpy pads the shape for growth) is written over it at the end,
the file hashed by reading it back, and renamed into place. The bytes are exactly `np.save`'s. The
document table (16 bytes and an id per document) is the only thing kept until the shard closes.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path

import numpy as np

from rungs.data.atomic import atomic_write_bytes, atomic_write_json, disk_full_error, is_disk_full, npy_bytes, \
    temporary_for
from rungs.data.errors import DataDiskFullError


def npy_header(dtype: np.dtype, n: int) -> bytes:
    """The `.npy` header `np.save` writes for a 1-D array of `n` items of `dtype`."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": (n,)})
    return buf.getvalue()


SHARD_PARTS = (".tokens.npy", ".index.npy", ".ids.json", ".json")  # a shard's files; the `.json` is written last


def shard_stem(split: str, name: str, file_index: int, k: int) -> str:
    return f"{split}/{name}/{file_index:05d}-{k:04d}"


def shard_files(stem: str) -> list[str]:
    """A shard's four files (relative paths, as its stem)."""
    return [f"{stem}{part}" for part in SHARD_PARTS]


class ShardWriter:
    """`with ShardWriter(...) as w: w.add(...); info = w.finish()`: nothing is visible until `finish`
    renames it into place; an error (a full disk: `DataDiskFullError` naming the file) removes the temporary."""

    def __init__(self, out: Path, stem: str, dtype: np.dtype, key: str) -> None:
        self.out, self.stem, self.dtype, self.key = out, stem, np.dtype(dtype), key
        self.path = out / f"{stem}.tokens.npy"
        self.tmp = temporary_for(self.path)
        self.lengths: list[int] = []  # tokens with EOS per document
        self.n_bytes: list[int] = []  # UTF-8 bytes per document
        self.ids: list[str] = []
        self.weights: list[float] = []
        self.tokens = 0
        self.t0 = time.perf_counter()
        self._finished = False

    def __enter__(self) -> ShardWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._opened = open(self.tmp, "wb")  # noqa: SIM115 - held across add() calls, closed in finish/__exit__
        self._file = self._opened.__enter__()
        self._header = npy_header(self.dtype, 0)
        try:
            self._file.write(self._header)
        except BaseException as err:
            self.__exit__(type(err), err, None)
            raise
        return self

    def add(self, doc_ids: list[str], n_bytes: list[int], encoded: list[np.ndarray], eos_id: int,
            weights: list[float] | None = None) -> None:
        """One encoded batch: each document's ids (already `dtype`, range-checked) followed by EOS, and its
        sampling weight (None: 1 each)."""
        if not encoded:
            return
        lengths = [len(ids) + 1 for ids in encoded]
        flat = np.empty(sum(lengths), dtype=self.dtype)
        ends = np.cumsum(lengths)
        for ids, end, n in zip(encoded, ends, lengths):
            flat[end - n:end - 1] = ids
        flat[ends - 1] = eos_id
        self._file.write(memoryview(flat).cast("B"))
        self.tokens += int(flat.size)
        self.lengths.extend(lengths)
        self.n_bytes.extend(n_bytes)
        self.ids.extend(doc_ids)
        self.weights.extend(weights if weights is not None else [1.0] * len(doc_ids))

    def finish(self) -> dict:
        header = npy_header(self.dtype, self.tokens)
        if len(header) == len(self._header):
            self._file.seek(0)
            self._file.write(header)
            self._close()
        else:  # a numpy whose header does not keep room for the shape: copy behind the real header
            self._close()
            self._rewrite(header)
        with open(self.tmp, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
        os.replace(self.tmp, self.path)
        index = np.zeros((len(self.lengths), 3), dtype=np.int64)
        if self.lengths:
            index[:, 1] = self.lengths
            index[:, 2] = self.n_bytes
            index[1:, 0] = np.cumsum(index[:-1, 1])
        atomic_write_bytes(self.out / f"{self.stem}.index.npy", npy_bytes(index))
        # Weights ride beside the ids only when some document has one other than 1: an unweighted
        # corpus's files (and its shards' records) stay what they were.
        weighted = any(w != 1.0 for w in self.weights)
        atomic_write_json(self.out / f"{self.stem}.ids.json",
                          {"ids": self.ids, **({"weights": self.weights} if weighted else {})})
        info = {"key": self.key, "stem": self.stem, "docs": len(self.lengths), "tokens": self.tokens,
                "bytes": int(sum(self.n_bytes)), "sha256": sha}
        if weighted:
            info["weighted_tokens"] = float(np.dot(np.asarray(self.weights), np.asarray(self.lengths, np.float64)))
        atomic_write_json(self.out / f"{self.stem}.json", info)
        self._finished = True
        return dict(info, seconds=time.perf_counter() - self.t0)

    def _close(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            opened.__exit__(None, None, None)

    def _rewrite(self, header: bytes) -> None:
        moved = self.tmp.with_name(self.tmp.name + "x")
        os.replace(self.tmp, moved)
        try:
            with open(moved, "rb") as src, open(self.tmp, "wb") as dst:
                src.seek(len(self._header))
                dst.write(header)
                while block := src.read(1 << 20):
                    dst.write(block)
        finally:
            moved.unlink(missing_ok=True)

    def __exit__(self, kind, err, tb) -> None:
        if self._finished:
            return
        if getattr(self, "_opened", None) is not None:
            opened, self._opened = self._opened, None
            try:
                opened.__exit__(kind, err, tb)
            except OSError:
                pass
        self.tmp.unlink(missing_ok=True)
        if err is not None and is_disk_full(err) and not isinstance(err, DataDiskFullError):
            raise disk_full_error(err, self.path) from None
