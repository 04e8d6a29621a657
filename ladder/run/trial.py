"""What runs on a Ray worker for one trial: the training job, wrapped with the sweep's bookkeeping.

The job itself (`rungs.train.train`) owns its MLflow run, its checkpoints and its resume; a trial
always calls it with `resume=True` in a run directory named by the trial key, so a retry or a rerun
after a killed driver continues the same run from its last checkpoint instead of starting a second.
Around it this wrapper counts attempts and tags the run with the sweep, the attempt and the outcome.
A diverged job returns normally (recorded, not retried); an exception propagates so that Ray Tune's
FailureConfig retries the trial.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from ladder.plan.memory import planned_expert_parallel, trial_capacity_factor
from ladder.run.sweep_runs import TAG_ATTEMPT, TAG_ERROR, TAG_KEY, TAG_LABEL, TAG_OUTCOME, TAG_SWEEP, tag_run
from rungs.tracking import EXPERIMENT_KIND_TAGS

log = logging.getLogger(__name__)

ATTEMPTS_FILE = "attempts"
RUN_ID_FILE = "mlflow_run_id"  # the training job's own record of its MLflow run (rungs.tracking)


def next_attempt(run_dir: Path) -> int:
    path = run_dir / ATTEMPTS_FILE
    attempt = int(path.read_text().strip() or 0) + 1 if path.is_file() else 1
    path.write_text(f"{attempt}\n")
    return attempt


def _run_id(run_dir: Path) -> str | None:
    path = run_dir / RUN_ID_FILE
    return path.read_text().strip() or None if path.is_file() else None


def _record_failure(payload: dict, run_dir: Path, tags: dict, err: BaseException) -> None:
    """Mark the attempt failed in MLflow; when the job died before creating its run, leave a
    FAILED run carrying the key so `ladder sweep status` can show why."""
    from mlflow.tracking import MlflowClient

    uri = payload["config"]["tracking_uri"]
    tags = {**tags, TAG_OUTCOME: "failed", TAG_ERROR: f"{type(err).__name__}: {err}"[:4000]}
    run_id = _run_id(run_dir)
    try:
        if run_id is not None:
            tag_run(uri, run_id, tags, status="FAILED")
            return
        client = MlflowClient(uri)
        name = payload["config"]["experiment_name"]
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name, tags=EXPERIMENT_KIND_TAGS)
        run = client.create_run(exp_id, run_name=f"failed-{payload['key'][:8]}",
                                tags={k: str(v) for k, v in tags.items()})
        client.set_terminated(run.info.run_id, status="FAILED")
    except Exception:  # the tracking store is down too: the exception we re-raise says enough
        log.exception("could not record the failure of trial %s in MLflow", payload["key"])


def expert_parallel_size(payload: dict) -> int:
    """The ep a trial launches with: the spec's `resources.ep` when set, else the memory planner's
    (`ladder.plan.memory.planned_expert_parallel`): a launch detail, not part of the trial key."""
    res = payload["resources"]
    if res.get("ep") is not None:
        return int(res["ep"])
    return planned_expert_parallel(payload["config"], workers=res["workers"], gpu=res["gpus"] > 0)


def launch_config(payload: dict, ep: int) -> dict:
    """The config a multi-worker torch trial of `ep` launches with: its own, plus the memory planner's
    capacity factor under expert parallelism when the spec fixes neither capacity_factor nor
    capacity_per_expert (`ladder.plan.memory.trial_capacity_factor`: all-to-all buffers at 1.5x the
    balanced load instead of ep x). A launch detail like ep: the trial key is computed before it and
    stays the same; the job's checkpoint key includes it, the same on every retry."""
    config = payload["config"]
    factor = trial_capacity_factor(config, ep)
    if factor is None or config.get("capacity_factor") == factor:
        return config
    return {**config, "capacity_factor": factor}


def _train(payload: dict, run_dir: Path):
    """One process: `rungs.train.train` (a JAX job there shards over every device the process sees).
    Several workers: `rungs.launch.launch_ray` starts Ray Train workers (one per GPU, each declaring
    its CPUs/GPUs) from inside this Tune trial: for backend=torch a `TorchTrainer` with expert
    parallelism of `expert_parallel_size` at `launch_config`'s capacity factor, for backend=jax one JAX process per worker over one mesh
    (its expert axis the config's `jax_mesh_expert`); rank 0 alone tracks, so the trial is still one
    MLflow run."""
    res = payload["resources"]
    if res["workers"] > 1:
        from rungs.launch import launch_ray

        common = dict(run_dir=run_dir, num_workers=res["workers"], use_gpu=res["gpus"] > 0, cpus_per_worker=res["cpus"],
                      storage_path=Path(payload["storage_path"]))
        if payload["config"].get("backend") == "jax":  # the torch memory planner's ep does not apply
            log.info("trial %s: %d JAX workers", payload["key"], res["workers"])
            return launch_ray(payload["config"], **common)
        ep = expert_parallel_size(payload)
        config = launch_config(payload, ep)
        log.info("trial %s: %d workers as dp=%d x ep=%d, MoE capacity factor %s", payload["key"], res["workers"],
                 res["workers"] // ep, ep, config.get("capacity_factor"))
        return launch_ray(config, ep=ep, **common)
    from rungs.train import train

    return train(payload["config"], run_dir=run_dir, resume=True, progress=False)


def run_trial(payload: dict) -> dict:
    """Train one trial; return the metrics Tune records as its final result."""
    t0 = time.perf_counter()
    run_dir = Path(payload["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    attempt = next_attempt(run_dir)
    tags = {TAG_KEY: payload["key"], TAG_SWEEP: payload["sweep"], TAG_LABEL: payload["label"], TAG_ATTEMPT: attempt,
            **{f"coord.{k}": v for k, v in payload["coordinates"].items() if v is not None}}
    t_train = time.perf_counter()
    try:
        result = _train(payload, run_dir)
    except Exception as err:
        _record_failure(payload, run_dir, tags, err)
        raise
    train_call_seconds = time.perf_counter() - t_train
    outcome = "diverged" if result.diverged else "finished"
    bpb = [v for v in result.bpb.values() if v is not None and math.isfinite(v)]
    if result.run_id:
        summary = {"bpb_mean": f"{sum(bpb) / len(bpb):.6f}"} if bpb else {}
        # With a status: a job that returned its stored result after a kill between result.json and
        # closing its run must not leave the trial RUNNING. A diverged run is FINISHED and tagged
        # diverged (ladder.run.sweep_runs: recorded, not retried), as the training job itself marks it.
        tag_run(payload["config"]["tracking_uri"], result.run_id,
                {**tags, TAG_OUTCOME: outcome, "diverged": str(result.diverged).lower(), **summary}, status="FINISHED")
    train_loop_seconds = result.tokens / result.tokens_per_second if result.tokens_per_second else 0.0
    return {
        "outcome": outcome, "run_id": result.run_id, "attempt": attempt, "steps": result.steps,
        "final_loss": result.final_loss, "bpb_mean": sum(bpb) / len(bpb) if bpb else float("nan"),
        "tokens_per_second": result.tokens_per_second, "train_wall_seconds": result.wall_seconds,
        "train_loop_seconds": train_loop_seconds, "train_call_seconds": train_call_seconds,
        "worker_seconds": time.perf_counter() - t0,
    }
