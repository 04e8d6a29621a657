"""Checkpoints of the JAX engine with orbax: exact resume, resume onto another device count, and a
checkpoint of another config refused.

Layout, in the run directory: `checkpoint_jax/` holds `arrays/` (an orbax StandardCheckpointer
tree: the parameters, router biases and optimizer state as a flat dict of leaves) and `meta.json`
(the config key, the step, the number of leaves, the sampler's and the clipper's state and the
loop's state, all plain JSON). A save writes a fresh `checkpoint_jax.tmp`, meta.json last, then
moves the old checkpoint to `checkpoint_jax.old` and the new one into its place, so a kill mid-save
leaves the previous checkpoint whole; a kill between those two renames leaves no `checkpoint_jax`
but both whole, and `load` takes the new one (a `.tmp` with a readable meta.json, else the `.old`).
The optimizer state is stored as its flattened leaves, and restored into the structure of a freshly
initialised state of the same config; arrays are restored onto the shardings of that template, so a
job saved on 4 devices resumes on 2 (or 1): orbax reshards on read.

With several processes (`rungs.jaxjob.distributed`) every process calls `save` and `load` (orbax
writes and reads each process's shards, so the run directory must be one shared filesystem);
process 0 alone makes, renames and removes the directories and writes meta.json, between barriers,
so no process writes into a directory another is replacing.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from rungs.identity import accepted_keys
from rungs.run_files import CheckpointError

# orbax logs every metadata-store open and close at INFO through absl (134 lines for one cpu-demo L3
# job): the job's own log says when it checkpoints.
logging.getLogger("absl").setLevel(logging.WARNING)
log = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_DIR", "save", "load", "exists"]

CHECKPOINT_DIR = "checkpoint_jax"
META_FILE = "meta.json"
ARRAYS_DIR = "arrays"


def _leaf_name(i: int) -> str:
    return f"leaf_{i:05d}"


def _paths(run_dir: Path) -> tuple[Path, Path, Path]:
    """The checkpoint, the save in progress and the checkpoint being replaced."""
    run_dir = Path(run_dir)
    return run_dir / CHECKPOINT_DIR, run_dir / (CHECKPOINT_DIR + ".tmp"), run_dir / (CHECKPOINT_DIR + ".old")


def _complete(directory: Path) -> bool:
    """Whether a save finished writing `directory`: its meta.json, written after every array, reads."""
    try:
        return isinstance(json.loads((directory / META_FILE).read_text()), dict)
    except (OSError, ValueError):
        return False


def _current(run_dir: Path) -> Path | None:
    """The directory holding the run's checkpoint, None without one. `checkpoint_jax` where it is;
    where a save was killed between its two renames there is none, and the new checkpoint (`.tmp`,
    complete) or else the previous one (`.old`) is the checkpoint."""
    final, tmp, old = _paths(run_dir)
    if final.exists():
        return final if (final / META_FILE).is_file() else None
    return next((d for d in (tmp, old) if _complete(d)), None)


def exists(run_dir: Path) -> bool:
    return _current(run_dir) is not None


def _recover(run_dir: Path) -> None:
    """Rename the checkpoint a save killed between its renames left (`_current`) to `checkpoint_jax`.
    Collective with several processes: process 0 renames, the others wait for it."""
    final = _paths(run_dir)[0]
    if jax.process_index() == 0:
        current = _current(run_dir)
        if current is not None and current != final:
            log.warning("%s: a save was interrupted between its renames; %s is the checkpoint", final, current.name)
            current.rename(final)
    _barrier("checkpoint_jax: recovered")


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def save(run_dir: Path, *, state: Any, config_key: str, meta: dict[str, Any]) -> Path:
    """Write `state` (any pytree of arrays) and `meta` (JSON-able) atomically; the checkpoint's path.
    Collective with several processes; `meta` must be the same on each (process 0 writes it)."""
    final, tmp, old = _paths(run_dir)
    main = jax.process_index() == 0
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier("checkpoint_jax: tmp made")
    leaves = jax.tree.leaves(state)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save((tmp / ARRAYS_DIR).absolute(), {_leaf_name(i): leaf for i, leaf in enumerate(leaves)})
        ckpt.wait_until_finished()
    _barrier("checkpoint_jax: arrays written")
    if main:
        record = {"config_key": config_key, "n_leaves": len(leaves), "jax_version": jax.__version__} | meta
        (tmp / META_FILE).write_text(json.dumps(record, indent=1, default=float))
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    _barrier("checkpoint_jax: renamed")
    return final


def read_meta(run_dir: Path, config_key: str | tuple[str, ...]) -> dict[str, Any] | None:
    """The checkpoint's meta record, None without a checkpoint; CheckpointError for another config."""
    current = _current(run_dir)
    if current is None:
        return None
    path = current / META_FILE
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: unreadable JAX checkpoint ({err}); start over with --fresh") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: unreadable JAX checkpoint (not a JSON object); start over with --fresh")
    accepted = accepted_keys(config_key)  # the job's key first, then the keys older code wrote for it
    if meta.get("config_key") not in accepted:
        raise CheckpointError(f"{path}: checkpoint of config {meta.get('config_key')}, this job's config is "
                              f"{accepted[0]}; use another run directory or start over with --fresh")
    return meta


def load(run_dir: Path, *, template: Any, config_key: str | tuple[str, ...]) -> tuple[Any, dict[str, Any]] | None:
    """(state, meta) restored into `template`'s structure, dtypes and shardings; None without a checkpoint.
    Collective with several processes."""
    _recover(run_dir)
    meta = read_meta(run_dir, config_key)
    if meta is None:
        return None
    path = Path(run_dir) / CHECKPOINT_DIR / ARRAYS_DIR
    leaves, treedef = jax.tree.flatten(template)
    if meta.get("n_leaves") != len(leaves):
        raise CheckpointError(f"{path}: {meta.get('n_leaves')} arrays saved, this job's state has {len(leaves)}")
    target = {_leaf_name(i): jax.ShapeDtypeStruct(np.shape(leaf), leaf.dtype, sharding=getattr(leaf, "sharding", None))
              for i, leaf in enumerate(leaves)}
    with ocp.StandardCheckpointer() as ckpt:
        try:
            restored = ckpt.restore(path.absolute(), target)
        except (ValueError, FileNotFoundError) as err:
            raise CheckpointError(f"{path}: cannot restore the JAX checkpoint ({str(err)[:300]})") from None
    return jax.tree.unflatten(treedef, [restored[_leaf_name(i)] for i in range(len(leaves))]), meta
