"""Checkpoints for exact resume: model, optimizer, sampler, clipper and trainer state, and every RNG.

Restoring all of it makes N steps + restart + N steps produce the same losses as 2N straight
(tested).

A checkpoint is data, never code: the payload holds only tensors and plain values (numbers,
strings, lists, dicts), and is read with `torch.load(weights_only=True)`, which refuses any other
object instead of unpickling it. A run directory may come from someone else (a shared `/runs`),
so a crafted `checkpoint.pt` must not run anything when a job resumes.

A checkpoint is also checked before it is read: `checkpoint.pt.sha256` (JSON: sha256, bytes, step)
records the payload's digest, and a truncated or bit-flipped file is refused with an error naming
it, rather than loaded and reported later as a divergence. The write order makes a kill at any
point leave one usable checkpoint: the payload goes to `checkpoint.pt.tmp` (fsynced), then the
digest file is replaced atomically (the commit point), then the payload is renamed into place. A
job killed before the commit keeps the previous checkpoint (the next save overwrites its `.tmp`); one killed
between the commit and the rename has its `.tmp` match the digest, and the load finishes the rename.

The run directory is one job's: `exclusive_run_dir` (rungs.run_files) holds an flock on `job.lock` for the whole job,
so two drivers never train one trial twice or share `checkpoint.pt.tmp`; the kernel drops the lock
of a holder that dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import random
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rungs.identity import accepted_keys
# Re-exported: the torch-free run-directory helpers live in rungs.run_files (the loop imports no torch).
from rungs.run_files import (LOCK_FILE, CheckpointError, DiskFullError, RunDirBusyError, RunDirError,  # noqa: F401
                             _fsync_dir, _write_atomic, exclusive_run_dir, is_disk_full, write_json_atomic)

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
CHECKSUM_SUFFIX = ".sha256"  # checkpoint.pt.sha256
FORMAT_VERSION = 2  # 1: pickled with numpy objects, loaded with weights_only=False (unsafe; refused)


# --- RNG state as plain data (weights_only=True refuses numpy objects) ---

def rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()  # dropout on a GPU draws from these
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))


# --- save and load ---

def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_NAME


def checksum_path(run_dir: Path) -> Path:
    return Path(run_dir) / (CHECKPOINT_NAME + CHECKSUM_SUFFIX)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_checkpoint(run_dir: Path, *, step: int, config_key: str, model: torch.nn.Module, optimizer: Any,
                    sampler: Any, extra: dict[str, Any]) -> Path:
    """Atomically write everything needed to continue after `step` completed steps."""
    path = checkpoint_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format_version": FORMAT_VERSION,
        "step": step,
        "config_key": config_key,
        "model": model.state_dict(),
        "buffers": {name: b for name, b in model.named_buffers()},
        "optimizer": optimizer.state_dict(),
        "sampler": sampler.state_dict(),
        "rng": rng_state(),
        "extra": extra,
    }
    tmp = _write_atomic(path, lambda f: torch.save(payload, f), commit=False)
    try:
        record = {"sha256": _sha256(tmp), "bytes": tmp.stat().st_size, "step": step, "format_version": FORMAT_VERSION}
        write_json_atomic(checksum_path(run_dir), record)  # the commit point (see the module docstring)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    log.debug("checkpoint at step %d written to %s", step, path)
    return path


def _verified_path(run_dir: Path) -> Path | None:
    """The checkpoint file after its digest matched, or None when the run has none."""
    path, digest_file = checkpoint_path(run_dir), checksum_path(run_dir)
    tmp = path.with_name(path.name + ".tmp")
    if not digest_file.is_file():
        if path.is_file():
            raise CheckpointError(f"{path}: no {digest_file.name} beside it (written by an older version, or "
                                  "damaged); refusing to load an unverified checkpoint: start over with --fresh "
                                  "(resume=False) or move the file aside")
        return None  # (a `.tmp` of a first write that never committed is overwritten by the next save)
    try:
        record = json.loads(digest_file.read_text())
        expected = str(record["sha256"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{digest_file}: unreadable checksum record ({err}); move it and {path.name} "
                              "aside or start over with --fresh") from None
    actual = _sha256(path) if path.is_file() else None
    if actual == expected:
        return path
    if tmp.is_file() and _sha256(tmp) == expected:  # killed between the commit and the rename
        os.replace(tmp, path)
        log.info("%s: completed the rename of a checkpoint written just before the job stopped", path)
        return path
    found = "missing" if actual is None else f"{path.stat().st_size} bytes with sha256 {actual[:16]}…"
    raise CheckpointError(f"{path}: checksum mismatch: {found}, recorded {record.get('bytes')} bytes with sha256 "
                          f"{expected[:16]}…; the file is truncated or damaged and is not loaded. Restore it, "
                          "or start over with --fresh (resume=False)")


def load_checkpoint(run_dir: Path, *, config_key: str | tuple[str, ...]) -> dict[str, Any] | None:
    """The checkpoint payload, or None when the run has none. Refuses a damaged or unsafe file and one
    written by another config (`config_key`: the job's key, or every key it accepts, its own first:
    `TrainConfig.resume_keys()`)."""
    path = _verified_path(run_dir)
    if path is None:
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as err:
        first = str(err).strip().splitlines()
        why = next((line.strip() for line in first if "Unsupported global" in line), first[0] if first else "")
        raise CheckpointError(f"{path}: not a plain-tensor checkpoint; refusing to unpickle it (it would be "
                              f"able to run code): {why[:300]}") from None
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        version = payload.get("format_version") if isinstance(payload, dict) else None
        raise CheckpointError(f"{path}: checkpoint format {version}, expected {FORMAT_VERSION}")
    if "config_key" not in payload or "step" not in payload:
        raise CheckpointError(f"{path}: checkpoint without config_key/step; not one this job wrote")
    accepted = accepted_keys(config_key)
    if payload["config_key"] not in accepted:
        raise CheckpointError(
            f"{path}: written by a different configuration (key {payload['config_key']}, this job {accepted[0]}); "
            "use a fresh run directory or resume=False")
    return payload


def restore(payload: dict[str, Any], *, model: torch.nn.Module, optimizer: Any, sampler: Any) -> int:
    """Load a payload into live objects; returns the number of completed steps."""
    model.load_state_dict(payload["model"])
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in payload["buffers"].items():
            if name in buffers:
                buffers[name].copy_(value)
    optimizer.load_state_dict(payload["optimizer"])
    sampler.load_state_dict(payload["sampler"])
    set_rng_state(payload["rng"])
    return int(payload["step"])


# The checkpoint each engine writes in a run directory, and the job that resumes it (the sharded and JAX
# names are rungs.parallel.engine.CHECKPOINT_DIR and rungs.jaxjob.checkpoint.CHECKPOINT_DIR, spelled here
# because those modules import what this one must not).
ENGINE_CHECKPOINTS = {CHECKPOINT_NAME: "the one-process PyTorch job (ladder train, rungs.train.train)",
                      "dist_checkpoint": "the sharded PyTorch job (rungs.launch, launch_ray)",
                      "checkpoint_jax": "the JAX job (backend=jax)"}


def refuse_other_engines_checkpoint(run_dir: Path, *, own: str) -> None:
    """For an engine that found no checkpoint of its own (`own`: its name in ENGINE_CHECKPOINTS): raise
    CheckpointError when another engine's checkpoint is there. Starting from step 0 beside it would
    silently discard that job's progress (and its clip-event log) instead of resuming it."""
    for name, writer in ENGINE_CHECKPOINTS.items():
        path = Path(run_dir) / name
        if name != own and path.exists():
            raise CheckpointError(f"{path}: a checkpoint of {writer}, which this job ({ENGINE_CHECKPOINTS[own]}) "
                                  "cannot resume; resume it with that job, use another run directory, or start "
                                  "over with --fresh (resume=False)")


def remove_checkpoint(run_dir: Path) -> None:
    """Forget a run's checkpoint (a fresh start in the same directory): every engine's, with the
    temporaries and the previous copy each keeps while it saves. One engine's `--fresh` that left another's
    behind was refused by `refuse_other_engines_checkpoint` on its first resume before a save of its own."""
    for name in ENGINE_CHECKPOINTS:
        for suffix in ("", ".tmp", ".old", CHECKSUM_SUFFIX):
            path = Path(run_dir) / (name + suffix)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
