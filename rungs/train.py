"""One training job: a resolved config in, a trained rung and its held-out BPB out.

`train(config, run_dir=...)` is the entry point the orchestrator calls in-process and that
`ladder train` wraps: the one training loop (`rungs.loop`) driving the one-process PyTorch engine
(`rungs.torch_engine.TorchEngine`). It prepares the corpus if needed (cached), builds the model and
Muon+AdamW, and runs: bf16 autocast, gradient accumulation, activation gradient clipping, global
grad-norm clipping, LR schedule, periodic BPB on every held-out domain, divergence detection,
checkpoints with exact resume, and MLflow tracking. No orchestrator needs to be present.
"""

from __future__ import annotations

from pathlib import Path

from rungs.config import TrainConfig, parse_config
from rungs.loop import (CLIP_LOG_FILE, CONFIG_FILE, DATA_REPORT_FILE, EVAL_FILE, GRAD_NORM_WINDOW,  # noqa: F401
                        RESULT_FILE, TrainResult, run_job)
from rungs.run_files import exclusive_run_dir
from rungs.torch_engine import TorchEngine, _pick_threads, _train_step, lr_schedule  # noqa: F401


def train(config: TrainConfig | dict, *, run_dir: Path, resume: bool = True, progress: bool = True,
          stop_after: int | None = None, wait_for_run_dir: bool = True) -> TrainResult:
    """Run (or resume) one training job in `run_dir`.

    `stop_after` ends this invocation after that many completed steps with a checkpoint, as a
    preemption would; the next call with resume=True continues from there. The job holds the run
    directory's lock (rungs.run_files.exclusive_run_dir) throughout: a second job on the same
    directory waits for it (or, with wait_for_run_dir=False, raises RunDirBusyError).
    """
    cfg = parse_config(config)
    run_dir = Path(run_dir)
    if cfg.backend == "jax":  # the JAX engine under the same loop; jax is imported only for it
        from rungs.jaxjob.train import train_jax

        return train_jax(cfg, run_dir, resume=resume, progress=progress, stop_after=stop_after,
                         wait_for_run_dir=wait_for_run_dir)
    with exclusive_run_dir(run_dir, wait=wait_for_run_dir):
        return run_job(cfg, TorchEngine(cfg), run_dir=run_dir, lr_multiplier=lr_schedule(cfg), resume=resume,
                       progress=progress, stop_after=stop_after)
