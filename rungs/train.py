"""One training job: a resolved config in, a trained rung and its held-out BPB out.

`train(config, run_dir=...)` is the entry point the orchestrator calls in-process and that
`ladder train` wraps. It prepares the corpus if needed (cached), builds the model and Muon+AdamW,
and runs: bf16 autocast, gradient accumulation, activation gradient clipping, global grad-norm
clipping, LR schedule, periodic BPB on every held-out domain, divergence detection, checkpoints
with exact resume, and MLflow tracking. No orchestrator needs to be present.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rungs.agc import ActivationGradClipper, drop_events_after, write_events
from rungs.checkpoint import (CheckpointError, DiskFullError, exclusive_run_dir, is_disk_full, load_checkpoint,
                              remove_checkpoint, restore, save_checkpoint, write_json_atomic)
from rungs.config import TrainConfig, TrainConfigError, parse_config
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.data.sampler import SourceScaledSampler
from rungs.evaluation import evaluate_model, unigram_bpb
from rungs.metrics import DevicePeak, DivergenceRule, MovingMedian, device_peak, utilisation
from rungs.model import Transformer
from rungs.optim import build_optimizer, clip_grad_norm_, lr_at
from rungs.progress import StepProgress
from rungs.router import load_balancing_loss, z_loss
from rungs.tracking import RUN_ID_FILE, Tracker, run_status

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"
DATA_REPORT_FILE = "data_report.json"  # per source: planned vs realised unique tokens and epochs
EVAL_FILE = "eval.json"
CLIP_LOG_FILE = "clip_events.jsonl"
CONFIG_FILE = "config.json"
GRAD_NORM_WINDOW = 1000


@dataclass
class TrainResult:
    run_id: str | None
    final_loss: float
    bpb: dict[str, float]
    tokens: int
    train_flops: float
    wall_seconds: float  # the job's wall clock, all restarts together, set-up and evals included
    tokens_per_second: float  # training steps only
    mfu: float  # against the devices' spec peak (rungs.metrics); never above 1
    diverged: bool
    steps: int
    unigram_bpb: dict[str, float] = field(default_factory=dict)
    diverged_reason: str | None = None
    losses: list[float] = field(default_factory=list)
    run_dir: str = ""
    # Beside MFU: the achieved model FLOP/s per device, the peak it was divided by and where that came
    # from; mfu_capped: the achieved rate exceeded that peak (a wrong peak), and MFU says 1.0.
    achieved_tflops_per_device: float = 0.0
    peak_flops_per_device: float | None = None
    peak_source: str = ""
    devices: int = 1
    mfu_capped: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _State:
    """Trainer state that must survive a restart (besides model/optimizer/sampler/RNG)."""

    step: int = 0
    tokens: int = 0
    train_flops: float = 0.0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    agc: dict | None = None


def _seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:  # cuBLAS needs a fixed workspace to be deterministic (ignored on CPU)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic)


def _autocast(cfg: TrainConfig):
    return torch.autocast(cfg.device_type, dtype=torch.bfloat16, enabled=cfg.autocast_bf16)


def _pick_threads(cfg: TrainConfig) -> int:
    """The configured thread count, else the cores idle at start-up (at least 1).

    Oversubscribed OpenMP threads wait at every parallel region for a descheduled sibling: on 2
    shared cores with other jobs running, a step took 2-9 s with 2 threads and 0.5 s with 1.
    Deterministic runs use 1 unless told otherwise, so a rerun does not depend on the load.
    """
    if cfg.threads:
        return cfg.threads
    if cfg.deterministic:
        return 1
    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))


def _train_step(cfg: TrainConfig, model: Transformer, optimizer, batch, clipper, decode) -> dict[str, float]:
    """Forward/backward over the micro-batches of one batch, then one optimizer step."""
    micro = cfg.micro_batch_sequences or cfg.batch_sequences
    n_micro = cfg.accumulation_steps
    ce_sum = aux_sum = 0.0
    rounds: list[int] = []
    overload: list[float] = []  # per layer: busiest expert's assignments / the mean (1.0 = balanced)
    for m in range(n_micro):
        rows = slice(m * micro, (m + 1) * micro)
        inputs = batch.inputs[rows].to(cfg.device_type, non_blocking=True)
        targets = batch.targets[rows].to(cfg.device_type, non_blocking=True)
        if clipper is not None:
            offset = m * micro
            clipper.begin_micro_batch(inputs, locate=lambda r, p, o=offset: batch.locate(r + o, p), decode=decode)
        with _autocast(cfg):
            logits, routes = model(inputs)  # (b, T, V), one RouterOutput per layer
        ce = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        # Balancing statistics of all layers are combined in one reduction, as the report does.
        aux = cfg.lb_loss_coef * load_balancing_loss(routes, cfg.n_experts, cfg.top_k) if cfg.lb_loss_coef else ce.new_zeros(())
        if cfg.z_loss_coef:
            aux = aux + cfg.z_loss_coef * z_loss(routes)
        ((ce + aux) / n_micro).backward()
        ce_sum += ce.item()
        aux_sum += float(aux.detach())
        rounds += [block.moe.experts.last_stats["rounds"] for block in model.layers]
        overload += [float(r.tokens_per_expert.max()) / max(float(r.tokens_per_expert.float().mean()), 1e-9)
                     for r in routes]
    params = [p for p in model.parameters() if p.grad is not None]
    if cfg.grad_clip is not None:
        grad_norm = float(clip_grad_norm_(params, cfg.grad_clip))
    else:
        grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params])))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if cfg.expert_bias:
        for block in model.layers:  # counts accumulated by each router over this step's micro-batches
            block.moe.router.update_bias()
    return {"loss": ce_sum / n_micro, "aux_loss": aux_sum / n_micro, "grad_norm": grad_norm,
            "moe_rounds_mean": sum(rounds) / len(rounds), "moe_rounds_max": float(max(rounds)),
            "moe_overload_max": max(overload)}


def train(config: TrainConfig | dict, *, run_dir: Path, resume: bool = True, progress: bool = True,
          stop_after: int | None = None, wait_for_run_dir: bool = True) -> TrainResult:
    """Run (or resume) one training job in `run_dir`.

    `stop_after` ends this invocation after that many completed steps with a checkpoint, as a
    preemption would; the next call with resume=True continues from there. The job holds the run
    directory's lock throughout (rungs.checkpoint.exclusive_run_dir): a second job on the same
    directory waits for it (or, with wait_for_run_dir=False, raises RunDirBusyError).
    """
    cfg = parse_config(config)
    run_dir = Path(run_dir)
    with exclusive_run_dir(run_dir, wait=wait_for_run_dir):
        return _train(cfg, run_dir, resume=resume, progress=progress, stop_after=stop_after)


def _train(cfg: TrainConfig, run_dir: Path, *, resume: bool, progress: bool, stop_after: int | None) -> TrainResult:
    job_start = time.perf_counter()
    if not resume:
        remove_checkpoint(run_dir)
        for name in (RUN_ID_FILE, RESULT_FILE, EVAL_FILE, CLIP_LOG_FILE):
            (run_dir / name).unlink(missing_ok=True)
    total = cfg.run_steps
    done_before = _finished_result(run_dir, total)  # before any checkpoint is read: a finished job is done
    if done_before is not None:
        _close_finished_run(cfg, run_dir, done_before)
        return done_before
    threads = _pick_threads(cfg)
    torch.set_num_threads(threads)
    log.info("torch threads: %d", threads)
    _seed_everything(cfg.seed, cfg.deterministic)
    write_json_atomic(run_dir / CONFIG_FILE, cfg.to_dict(), indent=2)

    corpus = PreparedCorpus.open(ensure_prepared(cfg.data_manifest, vocab_size=cfg.vocab_size,
                                                 cache_root=Path(cfg.data_cache_root)))
    sampler = SourceScaledSampler(corpus, cfg.sources_plan(), seq_len=cfg.seq_len,
                                  batch_sequences=cfg.batch_sequences, seed=cfg.seed, subset=cfg.subset)
    if cfg.device_type == "cuda" and not torch.cuda.is_available():
        raise TrainConfigError("device is cuda but torch sees no GPU; use device=cpu or auto", key="device")
    model = Transformer(cfg.architecture()).to(cfg.device_type)
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_lr=cfg.adam_lr,
                                muon_momentum=cfg.muon_momentum, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
                                adjust_lr=cfg.adjust_lr)
    agc_settings = cfg.agc_settings()
    clipper = ActivationGradClipper(agc_settings) if agc_settings else None
    if clipper is not None:
        model.activation_clip = clipper

    state = _State()
    payload = load_checkpoint(run_dir, config_key=cfg.key()) if resume else None
    if payload is not None:
        restore(payload, model=model, optimizer=optimizer, sampler=sampler)
        state = _State(**payload["extra"])
        if clipper is not None and state.agc is not None:
            clipper.load_state_dict(state.agc)
        log.info("resumed %s at step %d", run_dir, state.step)
    # Events of steps after the checkpoint (all of them when there is none) are logged again when
    # those steps run again.
    drop_events_after(run_dir / CLIP_LOG_FILE, state.step)

    tracker = _tracker(cfg, run_dir) if cfg.tracking_uri else None
    if tracker is not None:
        tracker.set_tag("muon_update_scale", str(getattr(optimizer, "convention", cfg.adjust_lr)))
    peak = device_peak(cfg.device_type, override=cfg.peak_flops_per_device, cores=threads)
    grad_median = MovingMedian(GRAD_NORM_WINDOW, state.grad_norms[-GRAD_NORM_WINDOW:])
    divergence = DivergenceRule(cfg.spike_factor, cfg.spike_warmup_steps, history=state.losses[-100:])
    decode = corpus.tokenizer.decode
    unigram = unigram_bpb(corpus, cfg)
    log.info("set-up took %.1fs (corpus, model, tracking, unigram BPB); MFU peak %s FLOP/s per device (%s)",
             time.perf_counter() - job_start, f"{peak.flops:.3g}" if peak.flops else "unknown", peak.source)
    diverged_reason = None
    stop_at = total if stop_after is None else min(total, stop_after)
    bar = StepProgress(total, enabled=progress, start=state.step)
    model.train()
    try:
        while state.step < stop_at:
            step = state.step
            multiplier = lr_at(step, total_steps=cfg.schedule_steps, warmup_steps=cfg.warmup, schedule=cfg.schedule,
                               min_lr_ratio=cfg.min_lr_ratio, decay_fraction=cfg.decay_fraction)
            optimizer.set_lr_multiplier(multiplier)
            t0 = time.perf_counter()
            batch = sampler.next_batch()
            if clipper is not None:
                clipper.begin_step(step)
            stats = _train_step(cfg, model, optimizer, batch, clipper, decode)
            seconds = time.perf_counter() - t0
            state.step += 1
            state.tokens += cfg.batch_tokens
            state.train_flops += cfg.flops_per_token * cfg.batch_tokens
            state.train_seconds += seconds
            state.losses.append(stats["loss"])
            state.grad_norms.append(stats["grad_norm"])
            state.grad_norms = state.grad_norms[-GRAD_NORM_WINDOW:]
            use = utilisation(cfg.flops_per_token * cfg.batch_tokens, seconds, devices=1, peak=peak)
            metrics = stats | {
                "lr": cfg.lr * multiplier,
                "grad_norm_median_1000": grad_median.add(stats["grad_norm"]),
                "agc_clip_rate": clipper.end_step() if clipper is not None else 0.0,
                "tokens_per_second": cfg.batch_tokens / seconds,
                "train_flops": state.train_flops,
                "tokens": float(state.tokens),
                "mfu": use.mfu,
                "achieved_tflops_per_device": use.achieved_flops_per_device / 1e12,
            }
            if clipper is not None:
                events = clipper.drain_events()
                if events:
                    write_events(events, run_dir / CLIP_LOG_FILE)
            diverged_reason = divergence.check(state.step, stats["loss"])
            is_last = state.step == total or diverged_reason is not None
            if not diverged_reason and (state.step % cfg.eval_interval == 0 or is_last):
                t_eval = time.perf_counter()
                result = evaluate_model(model, corpus, cfg, final=is_last)
                log.info("step %d: BPB %s (%.1fs)", state.step,
                         " ".join(f"{d} {v:.3f}" for d, v in result.items()), time.perf_counter() - t_eval)
                state.evals.append({"step": state.step, "bpb": result})
                metrics |= {f"bpb/{domain}": v for domain, v in result.items()}
                write_json_atomic(run_dir / EVAL_FILE, {"unigram_bpb": unigram, "evals": state.evals}, indent=2)
            if tracker is not None:
                tracker.log_metrics(metrics, step=state.step, flush=is_last)
            bar.update(state.step, metrics)
            if diverged_reason:
                log.warning("run diverged: %s", diverged_reason)
                break
            if state.step % cfg.checkpoint_interval == 0 or state.step == stop_at:
                state.wall_seconds += time.perf_counter() - job_start
                job_start = time.perf_counter()
                state.agc = clipper.state_dict() if clipper is not None else None
                if tracker is not None:  # a kill after this flush reruns steps the store skips (tracking.py)
                    tracker.flush()
                save_checkpoint(run_dir, step=state.step, config_key=cfg.key(), model=model, optimizer=optimizer,
                                sampler=sampler, extra=asdict(state))
    except BaseException as err:  # a crash (or Ctrl-C) leaves the MLflow run marked, not RUNNING forever
        bar.close()
        full = isinstance(err, DiskFullError) or is_disk_full(err)
        if tracker is not None:
            tracker.finish(status="FAILED", failing=True, skip_flush=full)
        if full and not isinstance(err, DiskFullError):  # e.g. the clip-event log: say so, and where
            raise DiskFullError(err.errno, f"disk full while training in {run_dir} ({err}); free space and "
                                           "rerun: the job resumes from its last checkpoint") from err
        raise
    bar.close()
    state.wall_seconds += time.perf_counter() - job_start
    if state.step < total and diverged_reason is None:  # stopped early on request: resumable
        if tracker is not None:
            tracker.finish(status="KILLED")
        return _result(tracker, state, peak, unigram, None, run_dir, finished=False)
    res = _result(tracker, state, peak, unigram, diverged_reason, run_dir, finished=True)
    try:
        write_json_atomic(run_dir / RESULT_FILE, res.to_json(), indent=2)
        write_json_atomic(run_dir / DATA_REPORT_FILE, sampler.report(), indent=2, default=float)
    except DiskFullError:
        if tracker is not None:
            tracker.finish(status="FAILED", failing=True, skip_flush=True)
        raise
    if tracker is not None:
        _log_final(tracker, res, run_dir)
    return res


def _tracker(cfg: TrainConfig, run_dir: Path) -> Tracker:
    return Tracker(cfg.tracking_uri, cfg.experiment_name, run_dir, run_name=f"{cfg.recipe}-L{cfg.L}-{cfg.key()[:8]}",
                   tags={"recipe": cfg.recipe, "rung": cfg.L, "trial_key": cfg.trial_key or cfg.key(),
                         "config_key": cfg.key()},
                   params=cfg.to_dict())


def _result(tracker, state: _State, peak: DevicePeak, unigram: dict[str, float], diverged_reason: str | None,
            run_dir: Path, *, finished: bool) -> TrainResult:
    last_bpb = state.evals[-1]["bpb"] if state.evals else {}
    use = utilisation(state.train_flops, state.train_seconds, devices=1, peak=peak)
    return TrainResult(
        run_id=tracker.run_id if tracker is not None else None,
        final_loss=state.losses[-1] if state.losses else float("nan"),
        bpb=dict(last_bpb) if finished and diverged_reason is None else {},  # a diverged run has no final BPB
        tokens=state.tokens,
        train_flops=state.train_flops,
        wall_seconds=state.wall_seconds,
        tokens_per_second=state.tokens / state.train_seconds if state.train_seconds else 0.0,
        mfu=use.mfu,
        diverged=diverged_reason is not None,
        diverged_reason=diverged_reason,
        steps=state.step,
        unigram_bpb=unigram,
        losses=list(state.losses),
        run_dir=str(run_dir),
        achieved_tflops_per_device=use.achieved_flops_per_device / 1e12,
        peak_flops_per_device=peak.flops,
        peak_source=peak.source,
        devices=1,
        mfu_capped=use.mfu_capped,
    )


def _finished_result(run_dir: Path, total: int) -> TrainResult | None:
    """A job that already finished returns its stored result instead of training again."""
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("steps") != total and not data.get("diverged"):
            return None
        return TrainResult(**data)
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: unreadable stored result ({str(err)[:200]}); move it aside to train "
                              "again from the checkpoint, or start over with --fresh (resume=False)") from None


def _close_finished_run(cfg: TrainConfig, run_dir: Path, res: TrainResult) -> None:
    """A job killed after writing its result but before closing its MLflow run left the run RUNNING:
    the rerun that returns the stored result logs what was missing and closes it."""
    if not cfg.tracking_uri or not res.run_id or not (run_dir / RUN_ID_FILE).is_file():
        return
    if run_status(cfg.tracking_uri, res.run_id) != "RUNNING":
        return
    log.warning("MLflow run %s of finished job %s was left RUNNING; closing it", res.run_id, run_dir)
    _log_final(_tracker(cfg, run_dir), res, run_dir)


def _log_final(tracker: Tracker, res: TrainResult, run_dir: Path) -> None:
    final = {f"final_bpb/{d}": v for d, v in res.bpb.items()}
    final |= {f"unigram_bpb/{d}": v for d, v in res.unigram_bpb.items()}
    final |= {"final_loss": res.final_loss, "total_train_flops": res.train_flops, "total_tokens": float(res.tokens),
              "wall_seconds": res.wall_seconds, "final_tokens_per_second": res.tokens_per_second, "final_mfu": res.mfu,
              "final_achieved_tflops_per_device": res.achieved_tflops_per_device}
    tracker.log_metrics(final, step=res.steps, flush=True)
    tracker.set_tag("diverged", str(res.diverged).lower())
    if res.diverged_reason:
        tracker.set_tag("diverged_reason", res.diverged_reason[:5000])
    for name in (CONFIG_FILE, EVAL_FILE, CLIP_LOG_FILE, RESULT_FILE, DATA_REPORT_FILE):
        tracker.log_artifact(run_dir / name)
    # A diverged run is FINISHED too, tagged diverged=true: its outcome is a result (ladder.sweep_runs
    # counts it "diverged", not "failed", and does not retry it).
    tracker.finish(status="FINISHED")
