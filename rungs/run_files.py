"""Files of a run directory, without any framework: atomic writes that say when the disk is full,
JSON-lines logs, and the one-job-per-directory lock. Used by the training loop (rungs.loop), which
imports no torch, and by the checkpoint modules.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

LOCK_FILE = "job.lock"


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used to resume this job (damaged, unsafe, or another config's)."""


class DiskFullError(OSError):
    """A write ran out of space (ENOSPC/EDQUOT). Says which file; nothing half-written is left behind."""


class RunDirError(RuntimeError):
    """A run directory that cannot hold a job (a file in its place, a path that cannot be created)."""


class RunDirBusyError(RunDirError):
    """Another live job holds this run directory."""


# --- atomic writes that say when the disk is full ---

def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def _disk_full(path: Path, err: OSError) -> DiskFullError:
    return DiskFullError(err.errno, f"disk full writing {path} ({os.strerror(err.errno)}); free space on "
                                    f"{path.parent} and rerun: the job resumes from its last checkpoint")


class _Writer:
    """A file object for torch.save that remembers the OSError a write raised: torch reports a failed
    write as an opaque RuntimeError ("inline_container.cc ... file write failed")."""

    def __init__(self, f) -> None:
        self.f = f
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.f.flush()


def _write_atomic(path: Path, write: Callable[[Any], None], *, commit: bool = True) -> Path:
    """Write `path` via `path.tmp` (fsynced); rename it into place when `commit`. Returns the tmp path
    when not committing. Any failure removes the tmp file; a full disk raises DiskFullError."""
    tmp = path.with_name(path.name + ".tmp")
    writer = None
    try:
        with open(tmp, "wb") as f:
            writer = _Writer(f)
            write(writer)
            f.flush()
            os.fsync(f.fileno())
        if commit:
            os.replace(tmp, path)
            _fsync_dir(path.parent)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        cause = writer.error if writer is not None and writer.error is not None else err
        if is_disk_full(cause):
            raise _disk_full(path, cause) from err
        raise
    return path if commit else tmp


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json_atomic(path: Path, data: Any, **dumps_kwargs: Any) -> Path:
    """`path` holds either its old content or all of `data`, never a prefix (result.json, eval.json)."""
    text = json.dumps(data, **dumps_kwargs) + "\n"
    return _write_atomic(Path(path), lambda f: f.write(text.encode()))


def append_jsonl(records: list[dict[str, Any]], path: Path) -> None:
    """Append records as JSON lines (one per line); the clip-event log."""
    if not records:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")


def drop_jsonl_after(path: Path, completed_steps: int) -> None:
    """Keep only records of steps a checkpoint covers (0-based "step" < completed_steps), rewriting the
    file atomically. A line that does not parse is the tail of an append a kill cut short: its step
    ran after the last checkpoint (the events of a step are appended before that step's checkpoint),
    so it is dropped with the rest of them, and the job resumes instead of failing on it."""
    if not path.is_file():
        return
    kept, torn = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            step = json.loads(line)["step"]
        except (ValueError, TypeError, KeyError):
            torn += 1
            continue
        if isinstance(step, int) and step < completed_steps:
            kept.append(line + "\n")
    if torn:
        log.warning("%s: dropped %d unreadable line(s), the end of a write cut short", path, torn)
    text = "".join(kept)
    _write_atomic(path, lambda f: f.write(text.encode()))


# --- one job per run directory ---

def file_in_the_way(path: Path) -> Path | None:
    """The file standing where `path` or one of its parent directories would be, None if there is none."""
    return next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)


def make_run_dir(run_dir: Path) -> Path:
    """Create `run_dir` (and its parents) if needed; RunDirError when a file stands where it would be."""
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise RunDirError(f"{run_dir}: cannot be a run directory: {file_in_the_way(run_dir) or run_dir} is a file; "
                          "name a directory (--run-dir)") from None
    return run_dir


@contextlib.contextmanager
def exclusive_run_dir(run_dir: Path, *, wait: bool = True, poll_seconds: float = 1.0) -> Iterator[None]:
    """Hold `run_dir/job.lock` (flock, exclusive) for the body. A second job on the same directory waits
    for the first to end (`wait`) or raises RunDirBusyError naming the holder. A holder that dies
    (even by SIGKILL) releases the lock with its file descriptors."""
    run_dir = make_run_dir(run_dir)
    lock_path = run_dir / LOCK_FILE
    with open(lock_path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            if not wait:
                raise RunDirBusyError(f"{run_dir}: in use by another job ({holder}); one job per run directory. "
                                      "Wait for it to finish, or use another --run-dir") from None
            log.warning("%s: in use by another job (%s); waiting for it to finish", run_dir, holder)
            while True:  # polling (not a blocking flock) keeps Ctrl-C working
                time.sleep(poll_seconds)
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    continue
        try:
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            f.flush()
        except OSError:  # a full disk: the lock holds anyway, only the holder's name is missing
            pass
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
