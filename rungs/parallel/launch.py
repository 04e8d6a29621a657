"""Sharded training jobs: the per-worker loop, its Ray Train launch, and a torchrun entry point.

`train_sharded(config, run_dir=...)` runs in every worker of an initialised process group (Ray
Train's `TorchTrainer` or `torchrun` set it up; gloo on CPU, NCCL on GPU). It composes the
single-process job's parts (corpus, source-scaled sampler, model, LR schedule, BPB evaluation,
MLflow tracking) with `rungs.parallel.distributed` (DP × EP, FSDP2, distributed Muon) and
`rungs.parallel.dist_checkpoint` (sharded checkpoints, resumable onto another number of workers). Every rank
draws the same global batch and trains on its contiguous share of the sequences; rank 0 alone
tracks and writes the result, so one trial is one MLflow run however many workers it has.

Like the single-process job it evaluates BPB on every held-out domain every `eval_interval` steps
(a collective: every rank runs the sharded forward), stops on a non-finite loss or a loss spike
(the same `DivergenceRule`, on the loss all-reduced over the ranks, so every rank stops at the same
step) and logs the grad norm's moving median. Activation gradient clipping runs on each rank's rows
with job-wide statistics: the per-point medians of every rank are gathered before they enter the
running history (so every rank clips against the same threshold), the clip rate counts the whole
job, and rank 0 writes every rank's clip events. A rank's loss is the mean over its own tokens, so its
activation gradients are `world` times the single-process ones: a fixed threshold is scaled by the
worker count (a median threshold is scale-free).

    launch_ray(config, run_dir=..., num_workers=2)           # Ray Train, N workers
    torchrun --nproc-per-node 2 -m rungs.launch --config cfg.json --run-dir runs/x [--ep 2]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rungs.parallel import dist_checkpoint
from rungs.agc import ActivationGradClipper, drop_events_after, write_events
from rungs.checkpoint import exclusive_run_dir, write_json_atomic
from rungs.config import TrainConfig, parse_config
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.data.sampler import SourceScaledSampler
from rungs.parallel.distributed import DistributedError, Parallel, build_optimizer, parallelize, setup, train_step
from rungs.evaluation import evaluate_model, unigram_bpb
from rungs.metrics import DevicePeak, DivergenceRule, MovingMedian, device_peak, utilisation
from rungs.model import Transformer
from rungs.optim import lr_at
from rungs.tracking import Tracker
from rungs.train import CLIP_LOG_FILE, CONFIG_FILE, EVAL_FILE, GRAD_NORM_WINDOW, RESULT_FILE, TrainResult

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "dist_checkpoint"


def _corpus(cfg: TrainConfig, par: Parallel) -> PreparedCorpus:
    """Prepare the corpus once (rank 0), then every rank opens the cached shards."""
    def prepare():
        return ensure_prepared(cfg.data_manifest, vocab_size=cfg.vocab_size, cache_root=Path(cfg.data_cache_root))
    path = prepare() if par.is_main else None
    dist.barrier()
    return PreparedCorpus.open(path if path is not None else prepare())


def _tracker(cfg: TrainConfig, run_dir: Path, par: Parallel) -> Tracker | None:
    if not (par.is_main and cfg.tracking_uri):
        return None
    tracker = Tracker(cfg.tracking_uri, cfg.experiment_name, run_dir, run_name=f"{cfg.recipe}-L{cfg.L}-{cfg.key()[:8]}",
                      tags={"recipe": cfg.recipe, "rung": cfg.L, "trial_key": cfg.trial_key or cfg.key(),
                            "config_key": cfg.key(), "workers": par.world, "dp": par.dp, "ep": par.ep},
                      params=cfg.to_dict())
    return tracker


def train_sharded(config: TrainConfig | dict, *, run_dir: Path, ep: int | None = None, resume: bool = True,
                  comm_dtype: torch.dtype = torch.bfloat16, stop_after: int | None = None) -> TrainResult:
    """One training job sharded over the initialised process group (see the module docstring).

    `stop_after` ends this invocation after that many completed steps with a checkpoint, as a
    preemption would; the next call with resume=True continues from there (on any worker count).
    `ep` None: the config's `expert_parallel` if it has one, else 1 (pure data parallel).
    """
    t_start = time.perf_counter()
    cfg = parse_config(config)
    ep = ep if ep is not None else int(getattr(cfg, "expert_parallel", 1) or 1)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stored = _finished_result(run_dir, cfg.run_steps) if resume else None
    if stored is not None:  # a finished job returns its stored result (every rank reads it)
        return stored
    par = setup(ep=ep)
    # Rank 0 holds the run directory for the whole job (one job per trial: rungs.checkpoint); the
    # other ranks wait at the barrier, then every rank looks again for a result the holder wrote.
    with exclusive_run_dir(run_dir) if par.is_main else contextlib.nullcontext():
        dist.barrier()
        stored = _finished_result(run_dir, cfg.run_steps) if resume else None
        if stored is not None:
            return stored
        return _train_sharded(cfg, run_dir, par, resume=resume, comm_dtype=comm_dtype, stop_after=stop_after,
                              t_start=t_start)


def _finished_result(run_dir: Path, total: int) -> TrainResult | None:
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return None
    stored = json.loads(path.read_text())
    return TrainResult(**stored) if stored.get("steps") == total or stored.get("diverged") else None


def _train_sharded(cfg: TrainConfig, run_dir: Path, par: Parallel, *, resume: bool, comm_dtype: torch.dtype,
                   stop_after: int | None, t_start: float) -> TrainResult:
    if cfg.batch_sequences % par.world:
        raise DistributedError(f"batch_sequences={cfg.batch_sequences} must be divisible by the {par.world} workers")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)  # the same initial model on every rank, then each keeps its shards
    if par.is_main:
        (run_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    corpus = _corpus(cfg, par)
    sampler = SourceScaledSampler(corpus, cfg.sources_plan(), seq_len=cfg.seq_len,
                                  batch_sequences=cfg.batch_sequences, seed=cfg.seed, subset=cfg.subset)
    if (cfg.batch_sequences // par.world) % cfg.accumulation_steps:
        raise DistributedError(f"{cfg.batch_sequences // par.world} sequences per worker do not split into "
                               f"{cfg.accumulation_steps} micro-batches")
    device = torch.device(par.device_type)
    model = parallelize(Transformer(cfg.architecture()).to(device), par, capacity_per_expert=cfg.capacity_per_expert)
    optimizer = build_optimizer(model, par, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_lr=cfg.adam_lr,
                                muon_momentum=cfg.muon_momentum, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
                                adjust_lr=cfg.adjust_lr, comm_dtype=comm_dtype)
    state: dict[str, Any] = {"step": 0, "tokens": 0, "train_flops": 0.0, "train_seconds": 0.0, "losses": [],
                             "evals": []}
    ckpt = run_dir / CHECKPOINT_DIR
    if resume and (ckpt / dist_checkpoint.EXTRA_FILE).is_file():
        extra = dist_checkpoint.load(ckpt, model, optimizer, par)
        if extra.get("config_key") != cfg.key():
            raise DistributedError(f"{ckpt} was written for another config ({extra.get('config_key')}, now {cfg.key()})")
        sampler.load_state_dict(extra["sampler"])
        state = extra["state"]
        log.info("resumed %s at step %d on %d workers", run_dir, state["step"], par.world)
    state.setdefault("grad_norms", [])  # written at checkpoints (absent on a fresh start and in older checkpoints)
    state.setdefault("evals", [])
    tracker = _tracker(cfg, run_dir, par)
    clipper = _clipper(cfg, model, par, state)
    if clipper is not None and par.is_main:
        drop_events_after(run_dir / CLIP_LOG_FILE, state["step"])  # those steps run again
    decode = corpus.tokenizer.decode
    grad_median = MovingMedian(GRAD_NORM_WINDOW, state["grad_norms"])
    divergence = DivergenceRule(cfg.spike_factor, cfg.spike_warmup_steps, history=state["losses"][-100:])
    diverged_reason: str | None = None
    # MFU denominator: the workers' devices' spec peak (rungs.metrics), the same on every rank
    peak = device_peak(par.device_type, override=cfg.peak_flops_per_device, cores=torch.get_num_threads())
    rows = slice(par.rank * cfg.batch_sequences // par.world, (par.rank + 1) * cfg.batch_sequences // par.world)
    autocast = torch.bfloat16 if cfg.precision == "bf16" else None
    total = cfg.run_steps
    stop_at = total if stop_after is None else min(total, stop_after)
    model.train()
    while state["step"] < stop_at:
        step = state["step"]
        multiplier = lr_at(step, total_steps=cfg.schedule_steps, warmup_steps=cfg.warmup, schedule=cfg.schedule,
                           min_lr_ratio=cfg.min_lr_ratio, decay_fraction=cfg.decay_fraction)
        optimizer.set_lr_multiplier(multiplier)
        t0 = time.perf_counter()
        batch = sampler.next_batch()  # the same global batch on every rank; this rank trains on its rows
        if clipper is not None:
            clipper.begin_step(step)
        stats = train_step(model, optimizer, par, batch.inputs[rows].to(device), batch.targets[rows].to(device),
                           n_experts=cfg.n_experts, top_k=cfg.top_k, lb_loss_coef=cfg.lb_loss_coef,
                           z_loss_coef=cfg.z_loss_coef, grad_clip=cfg.grad_clip, autocast_dtype=autocast,
                           micro_batches=cfg.accumulation_steps, clipper=clipper, locate=batch.locate,
                           row_offset=rows.start, decode=decode)
        if clipper is not None:
            stats["agc_clip_rate"] = _end_agc_step(clipper, par, run_dir)
        if cfg.expert_bias:
            _update_expert_bias(model)
        seconds = time.perf_counter() - t0
        state["step"] += 1
        state["tokens"] += cfg.batch_tokens
        state["train_flops"] += cfg.flops_per_token * cfg.batch_tokens
        state["train_seconds"] += seconds
        state["losses"].append(stats["loss"])
        use = utilisation(cfg.flops_per_token * cfg.batch_tokens, seconds, devices=par.world, peak=peak)
        metrics = stats | {"lr": cfg.lr * multiplier, "tokens_per_second": cfg.batch_tokens / seconds,
                           "mfu": use.mfu, "achieved_tflops_per_device": use.achieved_flops_per_device / 1e12,
                           "tokens": float(state["tokens"]), "workers": float(par.world),
                           "grad_norm_median_1000": grad_median.add(stats["grad_norm"]),
                           "train_flops": state["train_flops"]}
        diverged_reason = divergence.check(state["step"], stats["loss"])  # the same all-reduced loss on every rank
        if diverged_reason is None and state["step"] % cfg.eval_interval == 0 and state["step"] < total:
            bpb_now = evaluate_model(model, corpus, cfg)  # collective: every rank runs the sharded forward
            state["evals"].append({"step": state["step"], "bpb": bpb_now})
            metrics |= {f"bpb/{domain}": v for domain, v in bpb_now.items()}
        if tracker is not None:
            tracker.log_metrics(metrics, step=state["step"])
        if diverged_reason is not None:
            log.warning("run diverged: %s", diverged_reason)
            break
        if state["step"] % cfg.checkpoint_interval == 0 or state["step"] == stop_at:
            state["agc"] = clipper.state_dict() if clipper is not None else None
            state["grad_norms"] = list(grad_median.values)  # the median's window is the history to resume
            dist_checkpoint.save(ckpt, model, optimizer, par,
                                 extra={"config_key": cfg.key(), "sampler": sampler.state_dict(), "state": state})
    if diverged_reason is not None:
        return _diverged(state, diverged_reason, tracker, par, run_dir, t_start, peak)
    if state["step"] < total:  # stopped on request
        if tracker is not None:
            tracker.finish(status="KILLED")
        dist.barrier()
        return TrainResult(run_id=tracker.run_id if tracker else None, final_loss=state["losses"][-1], bpb={},
                           tokens=state["tokens"], train_flops=state["train_flops"],
                           wall_seconds=time.perf_counter() - t_start, tokens_per_second=0.0, mfu=0.0,
                           diverged=False, steps=state["step"], losses=list(state["losses"]), run_dir=str(run_dir))
    bpb = evaluate_model(model, corpus, cfg, final=True)  # every rank runs it: the sharded forward is collective
    result = _job_result(state, tracker, run_dir, t_start, peak, bpb=bpb)
    if par.is_main:
        unigram = unigram_bpb(corpus, cfg)
        result.unigram_bpb = unigram
        (run_dir / EVAL_FILE).write_text(json.dumps({"unigram_bpb": unigram, "evals": state["evals"] + [
            {"step": state["step"], "bpb": bpb}]}, indent=2))
        write_json_atomic(run_dir / RESULT_FILE, result.to_json(), indent=2)
        if tracker is not None:
            tracker.log_metrics({f"final_bpb/{d}": v for d, v in bpb.items()} | {
                "final_loss": result.final_loss, "total_tokens": float(result.tokens),
                "wall_seconds": result.wall_seconds}, step=result.steps, flush=True)
            for name in (CONFIG_FILE, EVAL_FILE, RESULT_FILE, CLIP_LOG_FILE):
                if (run_dir / name).is_file():
                    tracker.log_artifact(run_dir / name)
            tracker.set_tag("diverged", "false")
            tracker.finish(status="FINISHED")
    dist.barrier()
    return result


def _job_result(state: dict[str, Any], tracker: Tracker | None, run_dir: Path, t_start: float, peak: DevicePeak,
                *, bpb: dict[str, float], diverged_reason: str | None = None) -> TrainResult:
    seconds = state["train_seconds"]
    use = utilisation(state["train_flops"], seconds, devices=dist.get_world_size(), peak=peak)
    return TrainResult(
        run_id=tracker.run_id if tracker is not None else None,
        final_loss=state["losses"][-1] if state["losses"] else math.nan, bpb=bpb, tokens=state["tokens"],
        train_flops=state["train_flops"], wall_seconds=time.perf_counter() - t_start,
        tokens_per_second=state["tokens"] / seconds if seconds else 0.0,
        mfu=use.mfu, achieved_tflops_per_device=use.achieved_flops_per_device / 1e12, peak_flops_per_device=peak.flops,
        peak_source=peak.source, devices=dist.get_world_size(), mfu_capped=use.mfu_capped,
        diverged=diverged_reason is not None, diverged_reason=diverged_reason, steps=state["step"],
        losses=list(state["losses"]), run_dir=str(run_dir))


def _diverged(state: dict[str, Any], reason: str, tracker: Tracker | None, par: Parallel,
              run_dir: Path, t_start: float, peak: DevicePeak) -> TrainResult:
    """A diverged job: no final BPB, the reason in the result file and on the MLflow run (FAILED)."""
    result = _job_result(state, tracker, run_dir, t_start, peak, bpb={}, diverged_reason=reason)
    if par.is_main:
        write_json_atomic(run_dir / RESULT_FILE, result.to_json(), indent=2)
        if tracker is not None:
            tracker.set_tag("diverged", "true")
            tracker.set_tag("diverged_reason", reason[:5000])
            tracker.log_artifact(run_dir / RESULT_FILE)
            # FINISHED and tagged, as the single-process job does: ladder.sweep_runs counts a FINISHED run
            # tagged diverged as "diverged" (recorded, not retried); FAILED would read as a failure
            tracker.finish(status="FINISHED")
    dist.barrier()
    return result


def _clipper(cfg: TrainConfig, model: torch.nn.Module, par: Parallel,
             state: dict[str, Any]) -> ActivationGradClipper | None:
    """The activation-gradient clipper of a sharded job, installed on the model (None without AGC)."""
    settings = cfg.agc_settings()
    if not settings:
        return None
    if settings.mode == "fixed":  # per-rank mean loss: activation gradients are `world` × single-process
        settings = dataclasses.replace(settings, threshold=settings.threshold * par.world)
    clipper = ActivationGradClipper(settings)
    if state.get("agc"):
        clipper.load_state_dict(state["agc"])
    model.activation_clip = clipper
    return clipper


def _end_agc_step(clipper: ActivationGradClipper, par: Parallel, run_dir: Path) -> float:
    """Job-wide AGC statistics for this step; rank 0 appends every rank's clip events. The clip rate."""
    def all_gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * par.world
        dist.all_gather_object(out, obj)
        return out

    clipper.synchronise(all_gather)
    rate = clipper.end_step()
    events = all_gather(clipper.drain_events())
    if par.is_main:
        write_events([ev for part in events for ev in part], run_dir / CLIP_LOG_FILE)
    return rate


@torch.no_grad()
def _update_expert_bias(model: torch.nn.Module) -> None:
    """Aux-loss-free bias step from the world's counts (all layers in one all-reduce)."""
    routers = [block.moe.router for block in model.layers]
    counts = torch.stack([r.pending_counts for r in routers]).clone()
    dist.all_reduce(counts)
    for router, c in zip(routers, counts):
        router.update_bias(c)


def _ray_worker(payload: dict) -> None:
    import ray.train

    result = train_sharded(payload["config"], run_dir=Path(payload["run_dir"]), ep=payload.get("ep"))
    ray.train.report({"steps": result.steps, "final_loss": result.final_loss})


def launch_ray(config: TrainConfig | dict, *, run_dir: Path, num_workers: int, ep: int | None = None, use_gpu: bool = False,
               cpus_per_worker: float = 1.0, storage_path: Path | None = None) -> TrainResult:
    """Run `train_sharded` on `num_workers` Ray Train workers (gloo on CPU, NCCL on GPU); rank 0's result."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    cfg = parse_config(config)
    run_dir = Path(run_dir).resolve()
    payload = {"config": cfg.to_dict(), "run_dir": str(run_dir), "ep": ep}
    resources = {"CPU": cpus_per_worker} | ({"GPU": 1} if use_gpu else {})
    trainer = TorchTrainer(
        _ray_worker, train_loop_config=payload,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=resources),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(name=f"sharded-{cfg.key()[:8]}", storage_path=str(Path(storage_path or run_dir / "ray").resolve())),
    )
    result = trainer.fit()
    if result.error:
        raise result.error
    # Ray Train v2 keeps metrics only alongside checkpoints; rank 0 wrote the job's result file
    return TrainResult(**json.loads((run_dir / RESULT_FILE).read_text()))


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point: one rung, sharded over the workers torchrun started."""
    parser = argparse.ArgumentParser(prog="python -m rungs.launch")
    parser.add_argument("--config", required=True, help="resolved config JSON (e.g. a run's config.json)")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--ep", type=int, default=None, help="expert-parallel size (divides the worker count; default 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    result = train_sharded(json.loads(Path(args.config).read_text()), run_dir=Path(args.run_dir), ep=args.ep)
    if dist.get_rank() == 0:
        print(json.dumps(result.to_json()))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
