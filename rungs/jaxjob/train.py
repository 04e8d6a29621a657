"""`train_jax`: one training job on the JAX engine under the one loop (`rungs.loop.run_job`).

The same contract as `rungs.train.train` (same TrainResult, result files, MLflow metric names),
with the run tagged backend=jax and the jax version. XLA's compiled programs are kept in a
persistent compilation cache under runs/ (`compilation_cache_dir`; JAX_COMPILATION_CACHE_DIR names another), so a
rerun or the next trial of the same shapes loads its step instead of compiling it.

A job uses every device it sees (`jax.devices()`: this process's, or after
`rungs.jaxjob.distributed.initialize` every process's): a (data, expert) mesh whose expert axis is
the config's `jax_mesh_expert` (`trial_mesh`). Several processes run this same function (the Ray
workers of one trial, `rungs.parallel.launch.launch_ray`); process 0 holds the run directory and
writes every file, as rank 0 of the sharded PyTorch job does.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import jax
from jax.sharding import Mesh

from rungs.config import TrainConfig, TrainConfigError, parse_config
from rungs.jaxjob.engine import JaxEngine, check_config
from rungs.jaxjob.sharding import default_expert_axis, make_mesh
from rungs.loop import TrainResult, run_job
from rungs.run_files import RunDirError, exclusive_run_dir, file_in_the_way, make_run_dir
from rungs.torch_engine import lr_schedule

log = logging.getLogger(__name__)

CACHE_DIR_NAME = "jax_cache"
CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"


def compilation_cache_dir(run_dir: Path) -> Path:
    """The directory named by JAX_COMPILATION_CACHE_DIR (JAX's own variable: one cache for every job that
    sees it, across sweeps and run folders) when set; else `runs/jax_cache` for a run directory under a
    folder named runs (the nearest), else a `jax_cache` beside the run directory."""
    shared = os.environ.get(CACHE_DIR_ENV)
    if shared:
        return Path(shared)
    run_dir = Path(run_dir).resolve()
    for parent in run_dir.parents:
        if parent.name == "runs":
            return parent / CACHE_DIR_NAME
    return run_dir.parent / CACHE_DIR_NAME


def enable_compilation_cache(path: Path) -> None:
    """Keep compiled programs in `path` (created if needed); RunDirError when it cannot be a directory."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        blocker = file_in_the_way(path)
        why = f"{blocker} is a file" if blocker is not None else (err.strerror or str(err))
        raise RunDirError(f"{path}: cannot hold the JAX compilation cache: {why}; name a directory with "
                          f"{CACHE_DIR_ENV}") from None
    if jax.config.jax_compilation_cache_dir not in (None, str(path)):
        # JAX opens its cache once per process, at the first compile: without a reset, a process that
        # already compiled for another directory (a Ray worker's second trial, a test session) would
        # keep writing there.
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def trial_mesh(cfg: TrainConfig, devices: list | None = None) -> Mesh | None:
    """The mesh a trial trains on: every device in `devices` (default `jax.devices()`, all processes'),
    `cfg.jax_mesh_expert` of them on the expert axis (default `default_expert_axis`), the rest on the
    data axis. None on a single device: the one-device job, unsharded."""
    devices = list(jax.devices() if devices is None else devices)
    n, experts = len(devices), cfg.n_experts
    expert = cfg.jax_mesh_expert
    if expert is None:
        expert = default_expert_axis(n, experts, cfg.group_size)
    elif n % expert or experts % expert:
        raise TrainConfigError(f"the expert axis must divide both the {n} device(s) this job sees and n_experts="
                               f"{experts}; valid: {[s for s in range(1, n + 1) if n % s == 0 and experts % s == 0]} "
                               "(or leave it unset)", key="jax_mesh_expert")
    if n == 1:
        return None
    return make_mesh(n // expert, expert, devices)


def train_jax(config: TrainConfig | dict, run_dir: Path, resume: bool = True, progress: bool = True, *,
              stop_after: int | None = None, wait_for_run_dir: bool = True, mesh: Mesh | None = None,
              cache_dir: Path | None = None) -> TrainResult:
    """Run (or resume) one JAX training job in `run_dir` (see rungs.train.train for the arguments).

    `mesh`: the devices to train on; None: `trial_mesh(cfg)`, every device JAX sees. In a
    multi-process job every process calls this with the same arguments."""
    cfg = parse_config(config)
    check_config(cfg)
    if mesh is None:
        mesh = trial_mesh(cfg)
    run_dir = Path(run_dir)
    main = jax.process_index() == 0
    if main:
        make_run_dir(run_dir)
    enable_compilation_cache(Path(cache_dir) if cache_dir is not None else compilation_cache_dir(run_dir))
    # Process 0 holds the run directory for the whole job (one job per trial: rungs.run_files); the
    # others wait at the loop's first barrier for it, then read what it wrote.
    with exclusive_run_dir(run_dir, wait=wait_for_run_dir) if main else contextlib.nullcontext():
        return run_job(cfg, JaxEngine(cfg, mesh=mesh), run_dir=run_dir, lr_multiplier=lr_schedule(cfg),
                       resume=resume, progress=progress and main, stop_after=stop_after)
