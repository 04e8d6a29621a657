"""Writing a prepared directory safely: every file via a hidden temporary and a rename, a full disk as a
typed error naming the file, and temporaries of a killed prepare removed by the next one."""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
from pathlib import Path

import numpy as np

from rungs.data.errors import DataDiskFullError
from rungs.run_files import process_alive

log = logging.getLogger("rungs.data.prepare")
_TMP_MARK = ".tmp"


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def temporary_for(path: Path) -> Path:
    """The hidden temporary `path` is written to before its rename (marked with this process's id)."""
    return path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}")


def disk_full_error(err: OSError, path: Path) -> DataDiskFullError:
    return DataDiskFullError(err.errno, f"disk full writing {path} ({os.strerror(err.errno)}); free space "
                                        f"on {path.parent} and rerun: finished steps are kept")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a hidden temporary and a rename: `path` is never half-written, and
    a failed write (a full disk) removes its temporary."""
    tmp = temporary_for(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if is_disk_full(err):
            raise disk_full_error(err, path) from None
        raise


def atomic_write_json(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode())


# `temporary_for`'s names (a `.npy`, `.npz` or `.json` file's, "x" while a shard's header is rewritten): only
# these are a writer's own temporaries; any other file is left alone.
_TMP_NAME = re.compile(r"\.[^/]+\.(npy|npz|json)" + re.escape(_TMP_MARK) + r"(?P<pid>[0-9]+)x?")
# The folders a prepare writes, relative to its output: the output itself, and `train/`, `eval/` two levels down.
PREPARE_FOLDERS = (".", "train", "train/*", "eval", "eval/*")


def remove_stale_temporaries(out: Path, folders: tuple[str, ...] = PREPARE_FOLDERS) -> None:
    """Temporaries of a writer that was killed mid-write (its process is gone): never trusted, removed.
    Only in the folders it writes (`folders`, glob patterns relative to `out`: a prepare's by default)."""
    candidates = [tmp for folder in folders for tmp in out.glob(f"{folder}/.*{_TMP_MARK}*")]
    for tmp in candidates:
        match = _TMP_NAME.fullmatch(tmp.name)
        if match and tmp.is_file() and not process_alive(int(match["pid"])):
            log.info("removing %s, left by a write that was killed", tmp)
            tmp.unlink(missing_ok=True)


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()
