"""Where corpus files live: a local path or an object-store URL, read the same way.

A manifest's `files` entry may be a URL of any fsspec protocol: `s3://bucket/key` (s3fs), `gs://bucket/key`
(gcsfs), `hf://datasets/org/name/path` (huggingface_hub) — the back ends install with the `remote`
extra. Credentials come from the usual environment of each back end (`AWS_ACCESS_KEY_ID`/`AWS_PROFILE`/
`~/.aws` and `AWS_ENDPOINT_URL_S3` for S3-compatible stores; `GOOGLE_APPLICATION_CREDENTIALS`; `HF_TOKEN`),
on every machine that reads: a Ray worker opens the objects itself.

A remote file is listed once (`RemoteFile`: URL, size and version: the ETag, generation or blob id) and
read through seekable, buffered ranges, so the readers stream it exactly as a local file. Its
cache-key fingerprint is its size, version and the hash of its first and last `FINGERPRINT_BYTES`
(two ranged reads, fetched concurrently for all files), never a full read. A read checks the
object still has the listed size and version, so a corpus rewritten during a prepare is refused, not
mixed. Every failure is a `DataInputError` that names the URL: a missing bucket or object, a denied
request, an object that changed or cannot be read.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rungs.data.errors import DataInputError

FINGERPRINT_BYTES = 8 << 10  # per end: 16 KiB a file, 16 MB for 1 TB in 1 GB files (cold disk: well under 1 s)
REMOTE_BLOCK_BYTES = 8 << 20  # one ranged GET; sequential reads stay well above a worker's tokenizing rate
# What changes when an object is rewritten, by back end (S3 ETag, GCS generation, Hub blob id / LFS hash).
VERSION_FIELDS = ("ETag", "etag", "generation", "VersionId", "blob_id", "md5Hash")
_BACKENDS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "hf": "huggingface_hub"}


@dataclass(frozen=True)
class RemoteFile:
    """An object in a store, as listed when the manifest was loaded."""

    url: str
    size: int
    version: str

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rpartition("/")[2]

    def __str__(self) -> str:
        return self.url


DataFile = Path | RemoteFile


def is_url(entry: str) -> bool:
    """`proto://...` (not a Windows drive letter): read through fsspec."""
    head, sep, _ = entry.partition("://")
    return bool(sep) and len(head) > 1 and head.replace("+", "").replace("-", "").isalnum()


def _filesystem(url: str):
    import fsspec.core

    protocol = url.partition("://")[0]
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:
        extra = _BACKENDS.get(protocol)
        hint = f"install {extra} (pip install 'scaling-ladder[remote]')" if extra else "no fsspec back end is known for it"
        raise DataInputError(f"cannot read {protocol}:// URLs: {hint} ({' '.join(str(err).split())[:200]})",
                             where=url) from None


def _version(info: dict) -> str:
    fields = [f"{k}={info[k]}" for k in VERSION_FIELDS if info.get(k) not in (None, "")]
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and lfs.get("sha256"):
        fields.append(f"sha256={lfs['sha256']}")
    return "|".join(fields)


def _message(err: BaseException, url: str) -> str:
    """One line for a failed request, saying what to check."""
    text = " ".join(str(err).split()) or type(err).__name__
    if type(err).__name__ == "FileExpired":
        return "changed while it was being read (its ETag moved); rerun to prepare the new version"
    if isinstance(err, FileNotFoundError):
        if "bucket" in text.lower():
            return f"the bucket does not exist ({text})"
        return "no such object"
    if isinstance(err, PermissionError) or type(err).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return (f"access denied ({text}): check the credentials this process and every Ray worker see "
                "(AWS_* / ~/.aws, GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN) and the object's permissions")
    return f"could not be read ({type(err).__name__}: {text[:300]})"


@contextmanager
def remote_errors(url: str, field: str | None = None) -> Iterator[None]:
    """Turn a back end's failure into one DataInputError naming `url` (data errors pass through)."""
    try:
        yield
    except DataInputError:
        raise
    except (OSError, ValueError, RuntimeError) as err:
        raise DataInputError(_message(err, url), where=url, field=field) from None
    except Exception as err:  # botocore/google-auth credential errors are not OSErrors
        if type(err).__module__.split(".")[0] in ("botocore", "google", "huggingface_hub", "aiohttp", "requests"):
            raise DataInputError(_message(err, url), where=url, field=field) from None
        raise


def list_remote(pattern: str, field: str) -> list[RemoteFile]:
    """The objects a URL (or a URL glob) names, sorted; a missing bucket, no match or a denied listing is named."""
    fs, path = _filesystem(pattern)
    protocol = pattern.partition("://")[0]
    with remote_errors(pattern, field):
        if any(c in path for c in "*?["):
            found = fs.glob(path, detail=True)
            if not found:
                root = path.split("*")[0].split("?")[0].split("[")[0].rpartition("/")[0] or path.partition("/")[0]
                fs.info(root)  # a missing bucket says so; an existing folder with no match falls through
                raise DataInputError(f"{pattern!r} matches no object", where=pattern, field=field)
        else:
            found = {path: fs.info(path)}
    files = []
    for name, info in sorted(found.items()):
        if info.get("type", "file") != "file":
            continue
        files.append(RemoteFile(f"{protocol}://{str(name).removeprefix(protocol + '://')}", int(info["size"]),
                                _version(info)))
    if not files:
        raise DataInputError(f"{pattern!r} names no object (a folder?)", where=pattern, field=field)
    return files


def size_of(file: DataFile) -> int:
    return file.size if isinstance(file, RemoteFile) else os.stat(file).st_size


def check_unchanged(file: RemoteFile) -> None:
    """The object still has the size and version it was listed with (a corpus rewritten mid-prepare is refused)."""
    fs, path = _filesystem(file.url)
    with remote_errors(file.url):
        info = fs.info(path)
    if int(info["size"]) != file.size or _version(info) != file.version:
        raise DataInputError(f"changed since this prepare listed it (size {file.size:,} -> {int(info['size']):,}, "
                             f"version {file.version!r} -> {_version(info)!r}); rerun to prepare the new version",
                             where=file.url)


def open_binary(file: DataFile):
    """A seekable binary file over a local path or an object (ranged reads of REMOTE_BLOCK_BYTES)."""
    if not isinstance(file, RemoteFile):
        return open(file, "rb", buffering=1 << 20)
    fs, path = _filesystem(file.url)
    with remote_errors(file.url):
        raw = fs.open(path, "rb", block_size=REMOTE_BLOCK_BYTES, cache_type="readahead")
    return _Guarded(raw, file.url)


class _Guarded(io.RawIOBase):
    """A remote file whose failures are DataInputErrors naming its URL (for readers that see only bytes)."""

    def __init__(self, raw, url: str) -> None:
        self.raw, self.url = raw, url

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with remote_errors(self.url):
            data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with remote_errors(self.url):
            return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.raw.close()
        super().close()


def fingerprints(files: list[DataFile]) -> list[str]:
    """Per file: SHA-256 of its size, mtime (local) or version (remote), and its first and last
    FINGERPRINT_BYTES. Remote ends are fetched concurrently, two ranged reads per object."""
    out: list[str | None] = [None] * len(files)
    remote: dict[tuple, list[int]] = {}
    for i, f in enumerate(files):
        if isinstance(f, RemoteFile):
            fs, _ = _filesystem(f.url)
            remote.setdefault((type(fs), id(fs)), []).append(i)
        else:
            out[i] = _local_fingerprint(f)
    for indices in remote.values():
        fs, _ = _filesystem(files[indices[0]].url)
        paths, starts, ends, owners = [], [], [], []
        for i in indices:
            f = files[i]
            _, path = _filesystem(f.url)
            for start, end in _ends(f.size):
                paths.append(path)
                starts.append(start)
                ends.append(end)
                owners.append(i)
        with remote_errors(files[indices[0]].url):
            blobs = fs.cat_ranges(paths, starts, ends, on_error="return") if paths else []
        parts: dict[int, list[bytes]] = {i: [] for i in indices}
        for i, blob in zip(owners, blobs):
            if isinstance(blob, BaseException):
                with remote_errors(files[i].url):
                    raise blob
            parts[i].append(bytes(blob))
        for i in indices:
            f = files[i]
            h = hashlib.sha256(f"{f.size}|{f.version}|".encode())
            for blob in parts[i]:
                h.update(blob)
            out[i] = h.hexdigest()
    return [str(h) for h in out]


def _ends(size: int) -> list[tuple[int, int]]:
    """The byte ranges a fingerprint reads: the head, and the tail where it does not overlap the head."""
    ranges = [(0, min(size, FINGERPRINT_BYTES))] if size else []
    if size > FINGERPRINT_BYTES:
        ranges.append((max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES), size))
    return ranges


def _local_fingerprint(path: Path) -> str:
    st = os.stat(path)
    h = hashlib.sha256(f"{st.st_size}|{st.st_mtime_ns}|".encode())
    with open(path, "rb") as f:
        for start, end in _ends(st.st_size):
            f.seek(start)
            h.update(f.read(end - start))
    return h.hexdigest()
