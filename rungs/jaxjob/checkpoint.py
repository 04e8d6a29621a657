"""Checkpoints of the JAX engine with orbax: exact resume, resume onto another device count, and a
checkpoint of another config refused.

Layout, in the run directory: `checkpoint_jax/` holds `arrays/` (an orbax StandardCheckpointer
tree: the parameters, router biases and optimizer state as a flat dict of leaves) and `meta.json`
(the config key, the step, the number of leaves, the sampler's and the clipper's state and the
loop's state, all plain JSON). A save writes a fresh `checkpoint_jax.tmp` and renames it over the
old one, so a kill mid-save leaves the previous checkpoint whole. The optimizer state is stored as
its flattened leaves, and restored into the structure of a freshly initialised state of the same
config; arrays are restored onto the shardings of that template, so a job saved on 4 devices
resumes on 2 (or 1): orbax reshards on read.

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

__all__ = ["CHECKPOINT_DIR", "save", "load", "remove", "exists"]

CHECKPOINT_DIR = "checkpoint_jax"
META_FILE = "meta.json"
ARRAYS_DIR = "arrays"


def _leaf_name(i: int) -> str:
    return f"leaf_{i:05d}"


def exists(run_dir: Path) -> bool:
    return (Path(run_dir) / CHECKPOINT_DIR / META_FILE).is_file()


def remove(run_dir: Path) -> None:
    for name in (CHECKPOINT_DIR, CHECKPOINT_DIR + ".tmp", CHECKPOINT_DIR + ".old"):
        shutil.rmtree(Path(run_dir) / name, ignore_errors=True)


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def save(run_dir: Path, *, state: Any, config_key: str, meta: dict[str, Any]) -> Path:
    """Write `state` (any pytree of arrays) and `meta` (JSON-able) atomically; the checkpoint's path.
    Collective with several processes; `meta` must be the same on each (process 0 writes it)."""
    run_dir = Path(run_dir)
    final, tmp, old = (run_dir / n for n in (CHECKPOINT_DIR, CHECKPOINT_DIR + ".tmp", CHECKPOINT_DIR + ".old"))
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
    path = Path(run_dir) / CHECKPOINT_DIR / META_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: unreadable JAX checkpoint ({err}); start over with --fresh") from None
    accepted = accepted_keys(config_key)  # the job's key first, then the keys older code wrote for it
    if meta.get("config_key") not in accepted:
        raise CheckpointError(f"{path}: checkpoint of config {meta.get('config_key')}, this job's config is "
                              f"{accepted[0]}; use another run directory or start over with --fresh")
    return meta


def load(run_dir: Path, *, template: Any, config_key: str | tuple[str, ...]) -> tuple[Any, dict[str, Any]] | None:
    """(state, meta) restored into `template`'s structure, dtypes and shardings; None without a checkpoint."""
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
