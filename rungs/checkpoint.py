"""Checkpoints for exact resume: model, optimizer, sampler, clipper and trainer state, and every RNG.

Restoring all of it makes N steps + restart + N steps produce the same losses as 2N straight
(tested). Writes are atomic (temp file, then rename), so a job killed mid-save keeps the previous
checkpoint.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used to resume this job."""


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()  # dropout on a GPU draws from these
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINT_NAME


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
    tmp = path.with_suffix(".pt.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    log.debug("checkpoint at step %d written to %s", step, path)
    return path


def load_checkpoint(run_dir: Path, *, config_key: str) -> dict[str, Any] | None:
    """The checkpoint payload, or None when the run has none. Refuses one written by another config."""
    path = checkpoint_path(run_dir)
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {payload.get('format_version')}, expected {FORMAT_VERSION}")
    if payload["config_key"] != config_key:
        raise CheckpointError(
            f"{path}: written by a different configuration (key {payload['config_key']}, this job {config_key}); "
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
