"""Sharded training jobs: the one loop (`rungs.loop`) on the sharded engine, its Ray Train launch
(for both backends), and a torchrun entry point.

`train_sharded(config, run_dir=...)` runs in every worker of an initialised process group (Ray
Train's `TorchTrainer` or `torchrun` set it up; gloo on CPU, NCCL on GPU): `rungs.loop.run_job`
driving `rungs.parallel.engine.ShardedTorchEngine`. The loop is the single-process job's, so the
sharded job has everything it has (eval.json every `eval_interval` steps, data_report.json, the
divergence rule, crash -> FAILED marking, wall_seconds summed over restarts, the same MLflow
metrics); rank 0 alone tracks and writes the files, so one trial is one MLflow run however many
workers it has.

    launch_ray(config, run_dir=..., num_workers=2)           # Ray Train, N workers
    torchrun --nproc-per-node 2 -m rungs.launch --config cfg.json --run-dir runs/x [--ep 2]

A backend=jax config launches the same way with one Ray Train worker per JAX process: the workers
join one `jax.distributed` job (`rungs.jaxjob.distributed.initialize`; rank 0's node hosts the
coordinator, CPU collectives over gloo) and each runs `rungs.jaxjob.train.train_jax`, the one loop on
the JAX engine over a mesh of every process's devices (`rungs.jaxjob.train.trial_mesh`); process 0
alone tracks and writes the files, so the trial is one MLflow run here too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rungs.config import TrainConfig, TrainConfigError, parse_config
from rungs.data.errors import DataInputError
from rungs.loop import RESULT_FILE, TrainResult, finished_result, run_job
from rungs.parallel.distributed import DistributedError, setup
from rungs.parallel.engine import CHECKPOINT_DIR, ShardedTorchEngine  # noqa: F401
from rungs.run_files import CheckpointError, DiskFullError, RunDirError, exclusive_run_dir, make_run_dir
from rungs.torch_engine import lr_schedule, resolve_device

log = logging.getLogger(__name__)


def train_sharded(config: TrainConfig | dict, *, run_dir: Path, ep: int | None = None, resume: bool = True,
                  comm_dtype: torch.dtype = torch.bfloat16, stop_after: int | None = None,
                  progress: bool = False) -> TrainResult:
    """One training job sharded over the initialised process group (see the module docstring).

    `stop_after` ends this invocation after that many completed steps with a checkpoint, as a
    preemption would; the next call with resume=True continues from there (on any worker count).
    `ep`: the expert-parallel size (divides the world; None or 1: pure data parallel).
    """
    cfg = parse_config(config)
    if cfg.backend != "torch":  # not silently the PyTorch job: the JAX job shards over its own device mesh
        raise DistributedError(f"backend={cfg.backend}: the sharded PyTorch job runs backend=torch only; a JAX "
                               "job shards over every device it sees: one process with rungs.train.train, or "
                               "several with launch_ray (each joins one jax.distributed job)")
    ep = 1 if ep is None else ep
    run_dir = make_run_dir(run_dir)
    stored = finished_result(run_dir, cfg.run_steps, cfg.resume_keys()) if resume else None
    if stored is not None:  # a finished job returns its stored result (every rank reads it)
        return stored
    par = setup(ep=ep, device_type=resolve_device(cfg))  # the config's device, refused when absent
    # Rank 0 holds the run directory for the whole job (one job per trial: rungs.run_files); the
    # other ranks wait at the loop's first barrier, then every rank looks for a result the holder wrote.
    with exclusive_run_dir(run_dir) if par.is_main else contextlib.nullcontext():
        return run_job(cfg, ShardedTorchEngine(cfg, par, comm_dtype=comm_dtype,
                                                 restore_from=run_dir if resume else None), run_dir=run_dir,
                       lr_multiplier=lr_schedule(cfg), resume=resume, progress=progress, stop_after=stop_after)


def _ray_worker(payload: dict) -> None:
    import ray.train

    result = train_sharded(payload["config"], run_dir=Path(payload["run_dir"]), ep=payload.get("ep"))
    ray.train.report({"steps": result.steps, "final_loss": result.final_loss})


def _ray_jax_worker(payload: dict) -> None:
    """One process of a multi-worker JAX job: join the job, then the one loop over the global mesh."""
    import socket

    import jax
    import ray.train
    from ray.train.collective import broadcast_from_rank_zero

    from rungs.jaxjob.distributed import initialize

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    address = None
    if rank == 0:  # the coordinator runs in rank 0's process, on a port free on its node
        with socket.socket() as s:
            s.bind(("", 0))
            address = f"{ray.util.get_node_ip_address()}:{s.getsockname()[1]}"
    address = broadcast_from_rank_zero(address)
    if not payload["use_gpu"]:  # Ray placed this worker on CPUs: JAX must not take a GPU the node may have
        jax.config.update("jax_platforms", "cpu")
    initialize(address, num_processes=world, process_id=rank,
               cpu_devices=None if payload["use_gpu"] else payload["cpu_devices"])
    from rungs.jaxjob.train import train_jax  # after initialize: nothing may start JAX's backend before it

    result = train_jax(payload["config"], Path(payload["run_dir"]), progress=False)
    jax.distributed.shutdown()  # a barrier: rank 0's coordinator outlives every other process's last call
    ray.train.report({"steps": result.steps, "final_loss": result.final_loss})


def launch_ray(config: TrainConfig | dict, *, run_dir: Path, num_workers: int, ep: int | None = None, use_gpu: bool = False,
               cpus_per_worker: float = 1.0, storage_path: Path | None = None,
               cpu_devices_per_worker: int = 1) -> TrainResult:
    """Run one job on `num_workers` Ray Train workers; rank 0's result. backend=torch: `train_sharded`
    (gloo on CPU, NCCL on GPU; `ep` its expert-parallel size). backend=jax: one JAX process per worker
    (`_ray_jax_worker`; the mesh from the config's `jax_mesh_expert`, `ep` unused), each with one GPU
    or `cpu_devices_per_worker` host devices."""
    from ray.train import RunConfig, ScalingConfig

    cfg = parse_config(config)
    run_dir = Path(run_dir).resolve()
    jax_job = cfg.backend == "jax"
    payload = {"config": cfg.to_dict(), "run_dir": str(run_dir), "ep": ep, "use_gpu": use_gpu,
               "cpu_devices": cpu_devices_per_worker}
    resources = {"CPU": cpus_per_worker} | ({"GPU": 1} if use_gpu else {})
    scaling = ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=resources)
    run_config = RunConfig(name=f"{'jax' if jax_job else 'sharded'}-{cfg.key()[:8]}",
                           storage_path=str(Path(storage_path or run_dir / "ray").resolve()))
    if jax_job:
        from ray.train.v2.jax import JaxConfig, JaxTrainer

        # Ray's own JAX set-up (GPU/TPU only) is off: every worker joins in _ray_jax_worker instead,
        # the same way on CPU (gloo) as on GPU.
        trainer = JaxTrainer(_ray_jax_worker, train_loop_config=payload, jax_config=JaxConfig(),
                             scaling_config=scaling, run_config=run_config)
    else:
        from ray.train.torch import TorchConfig, TorchTrainer

        trainer = TorchTrainer(_ray_worker, train_loop_config=payload, scaling_config=scaling,
                               torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"), run_config=run_config)
    result = trainer.fit()
    if result.error:
        raise result.error
    # Ray Train v2 keeps metrics only alongside checkpoints; rank 0 wrote the job's result file
    return TrainResult(**json.loads((run_dir / RESULT_FILE).read_text()))


def _input_error(parser: argparse.ArgumentParser, message: str) -> int:
    """Bad input (a config file that is missing, not JSON or not a valid config; a damaged checkpoint; a
    run directory that cannot be used) is one line and exit 2, as `ladder train` says it."""
    sys.stderr.write(f"{parser.prog}: error: {message}\n")
    return 2


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point: one rung, sharded over the workers torchrun started."""
    parser = argparse.ArgumentParser(prog="python -m rungs.launch")
    parser.add_argument("--config", required=True, help="resolved config JSON (e.g. a run's config.json)")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--ep", type=int, default=None, help="expert-parallel size (divides the worker count; default 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    try:
        text = Path(args.config).read_text()
    except OSError as err:
        return _input_error(parser, f"{args.config}: {err.strerror or err}")
    try:
        try:
            result = train_sharded(json.loads(text), run_dir=Path(args.run_dir), ep=args.ep, progress=True)
        except json.JSONDecodeError as err:
            return _input_error(parser, f"{args.config}: not valid JSON: {err}")
        except (TrainConfigError, DataInputError, DistributedError, CheckpointError, RunDirError) as err:
            return _input_error(parser, str(err))  # some are raised after the process group started
        except DiskFullError as err:
            return _input_error(parser, err.strerror)
        # A finished job returns its stored result before any process group starts: the launcher's rank
        # (torchrun's RANK) says which process prints it.
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        if rank == 0:
            print(json.dumps(result.to_json()))
        return 0
    finally:  # every exit, an input error's included, ends the group this process joined
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    raise SystemExit(main())
