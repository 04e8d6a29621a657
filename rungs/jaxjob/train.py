"""`train_jax`: one training job on the JAX engine under the one loop (`rungs.loop.run_job`).

The same contract as `rungs.train.train` (same TrainResult, result files, MLflow metric names),
with the run tagged backend=jax and the jax version. XLA's compiled programs are kept in a
persistent compilation cache under runs/ (`compilation_cache_dir`), so a rerun or the next trial of
the same shapes loads its step instead of compiling it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import jax

from rungs.config import TrainConfig, parse_config
from rungs.jaxjob.engine import JaxEngine
from rungs.loop import TrainResult, run_job
from rungs.run_files import exclusive_run_dir
from rungs.torch_engine import lr_schedule

log = logging.getLogger(__name__)

CACHE_DIR_NAME = "jax_cache"


def compilation_cache_dir(run_dir: Path) -> Path:
    """`runs/jax_cache` for a run directory under a folder named runs (the nearest), else a
    `jax_cache` beside the run directory."""
    run_dir = Path(run_dir).resolve()
    for parent in run_dir.parents:
        if parent.name == "runs":
            return parent / CACHE_DIR_NAME
    return run_dir.parent / CACHE_DIR_NAME


def enable_compilation_cache(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def train_jax(config: TrainConfig | dict, run_dir: Path, resume: bool = True, progress: bool = True, *,
              stop_after: int | None = None, wait_for_run_dir: bool = True, mesh=None,
              cache_dir: Path | None = None) -> TrainResult:
    """Run (or resume) one JAX training job in `run_dir` (see rungs.train.train for the arguments)."""
    cfg = parse_config(config)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    enable_compilation_cache(Path(cache_dir) if cache_dir is not None else compilation_cache_dir(run_dir))
    with exclusive_run_dir(run_dir, wait=wait_for_run_dir):
        return run_job(cfg, JaxEngine(cfg, mesh=mesh), run_dir=run_dir, lr_multiplier=lr_schedule(cfg),
                       resume=resume, progress=progress, stop_after=stop_after)
