"""The one training loop: everything a training job does around the arithmetic, once, for every
engine (`rungs.engine.Engine`: one PyTorch process, sharded PyTorch, JAX).

`run_job(cfg, engine, run_dir=...)` runs or resumes one job: the LR schedule's multiplier per step,
BPB on every held-out domain (`eval.json`): on a fixed sample every `eval_interval` steps (the MLflow
learning curve `bpb/<domain>`) and on the whole held-out sets at the last step (`final_bpb/<domain>`
with its standard error `final_bpb_se/<domain>`, never a point of the curve; rungs.evaluation), the
divergence rule (non-finite loss or a spike over the running median), checkpoints every
`checkpoint_interval` steps and when stopped early, MLflow tracking (one run per job, reopened on
resume, closed FAILED on a crash and FINISHED otherwise), `result.json` and `data_report.json`, the
clip-event log, a progress bar, and the wall clock summed over every invocation of the job. It
imports no framework: the engine hands it numbers and plain dicts. Rank 0 alone writes files and
tracks; every rank runs the same sequence of engine calls, so collectives line up.

The caller holds the run directory's lock (`rungs.run_files.exclusive_run_dir`) around the call.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from rungs.config import TrainConfig
from rungs.engine import Engine
from rungs.metrics import DevicePeak, DivergenceRule, MovingMedian, utilisation
from rungs.progress import StepProgress
from rungs.signals import deferred, sigterm_raises
from rungs.run_files import (CheckpointError, DiskFullError, append_jsonl, drop_jsonl_after, is_disk_full,
                             write_json_atomic)
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
    bpb: dict[str, float]  # the final eval's, over every held-out document by default
    tokens: int
    train_flops: float
    wall_seconds: float  # the job's wall clock, all restarts together, set-up and evals included
    tokens_per_second: float  # training steps only
    mfu: float  # against the devices' spec peak (rungs.metrics); never above 1
    diverged: bool
    steps: int
    unigram_bpb: dict[str, float] = field(default_factory=dict)
    # Per domain: the final BPB's standard error from the held-out documents' sampling (rungs.evaluation).
    bpb_se: dict[str, float] = field(default_factory=dict)
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
    # The config's key (TrainConfig.key()): a rerun in the same directory returns this result only for
    # the same config. None in results written before it was recorded.
    config_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoopState:
    """What the loop needs after a restart (engines checkpoint it as plain data beside their own)."""

    step: int = 0
    tokens: int = 0
    train_flops: float = 0.0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> LoopState:
        names = {f for f in cls.__dataclass_fields__}  # older checkpoints carry extra keys (agc)
        return cls(**{k: v for k, v in saved.items() if k in names})


def run_job(cfg: TrainConfig, engine: Engine, *, run_dir: Path, lr_multiplier: Callable[[int], float],
            resume: bool = True, progress: bool = True, stop_after: int | None = None) -> TrainResult:
    """Run (or resume) one job in `run_dir` on `engine`; every rank returns the job's result.

    `lr_multiplier(step)`: the LR schedule's multiplier for 0-based `step` (`rungs.optim.lr_at` with
    the config's schedule fields; passed in because rungs.optim imports torch). `stop_after` ends
    this invocation after that many completed steps with a checkpoint, as a preemption would."""
    job_start = time.perf_counter()
    main = engine.rank == 0
    if not resume and main:
        engine.discard_checkpoint(run_dir)
        for name in (RUN_ID_FILE, RESULT_FILE, EVAL_FILE, CLIP_LOG_FILE, DATA_REPORT_FILE):
            (run_dir / name).unlink(missing_ok=True)
    engine.barrier()
    total = cfg.run_steps
    done_before = finished_result(run_dir, total, cfg.resume_keys())  # before any checkpoint: a finished job is done
    if done_before is not None:
        if main:
            _close_finished_run(cfg, engine, run_dir, done_before)
        return done_before
    engine.build()
    saved = engine.load(run_dir) if resume else None
    if main:  # after the load: a refused checkpoint (another config's, another engine's) keeps its config.json
        write_json_atomic(run_dir / CONFIG_FILE, cfg.to_dict(), indent=2)
    state = LoopState.from_saved(saved) if saved is not None else LoopState()
    if saved is not None:
        log.info("resumed %s at step %d on %d device(s)", run_dir, state.step, engine.world)
    if main:  # events of steps after the checkpoint (all of them without one) are logged again
        drop_jsonl_after(run_dir / CLIP_LOG_FILE, state.step)
    tracker = tracker_for(cfg, engine, run_dir) if main and cfg.tracking_uri else None
    peak = engine.device_peak()
    unigram = engine.unigram_bpb()
    log.info("set-up took %.1fs; MFU peak %s FLOP/s per device (%s)", time.perf_counter() - job_start,
             f"{peak.flops:.3g}" if peak.flops else "unknown", peak.source)
    bar = StepProgress(total, enabled=progress and main, start=state.step)
    # a preemption's SIGTERM closes a one-process job's MLflow run FAILED, as a crash does (rungs/signals.py)
    with sigterm_raises(enabled=engine.processes == 1):
        try:
            diverged_reason, job_start = _steps(cfg, engine, state, run_dir, tracker, bar, peak, unigram, lr_multiplier,
                                                stop_at=total if stop_after is None else min(total, stop_after),
                                                job_start=job_start)
            bar.close()
            state.wall_seconds += time.perf_counter() - job_start
            if state.step < total and diverged_reason is None:  # stopped early on request: resumable
                if tracker is not None:
                    tracker.finish(status="KILLED")
                engine.barrier()
                return _result(tracker, state, peak, engine.world, unigram, None, run_dir, finished=False)
            res = _result(tracker, state, peak, engine.world, unigram, diverged_reason, run_dir, finished=True)
            res.config_key = cfg.key()
            report = engine.data_report()
            if main:  # the result last: it marks the job finished, and a rerun then writes nothing more
                write_json_atomic(run_dir / DATA_REPORT_FILE, report, indent=2, default=float)
                write_json_atomic(run_dir / RESULT_FILE, res.to_json(), indent=2)
        except BaseException as err:  # a crash (Ctrl-C, SIGTERM) leaves the MLflow run marked, not RUNNING forever
            bar.close()
            full = isinstance(err, DiskFullError) or is_disk_full(err)
            if tracker is not None:
                tracker.finish(status="FAILED", failing=True, skip_flush=full)
            if full and not isinstance(err, DiskFullError):  # e.g. the clip-event log: say so, and where
                raise DiskFullError(err.errno, f"disk full while training in {run_dir} ({err}); free space and "
                                               "rerun: the job resumes from its last checkpoint") from err
            raise
    if tracker is not None:
        log_final(tracker, res, run_dir)
    engine.barrier()
    return res


def _steps(cfg: TrainConfig, engine: Engine, state: LoopState, run_dir: Path, tracker: Tracker | None,
           bar: StepProgress, peak: DevicePeak, unigram: dict[str, float], lr_multiplier: Callable[[int], float],
           *, stop_at: int,
           job_start: float) -> tuple[str | None, float]:
    """Train until `stop_at` steps or divergence; the divergence reason and the (restarted) wall clock."""
    main = engine.rank == 0
    total = cfg.run_steps
    grad_median = MovingMedian(GRAD_NORM_WINDOW, state.grad_norms[-GRAD_NORM_WINDOW:])
    divergence = DivergenceRule(cfg.spike_factor, cfg.spike_warmup_steps, history=state.losses[-100:])
    step_flops = cfg.flops_per_token * cfg.batch_tokens
    while state.step < stop_at:
        multiplier = lr_multiplier(state.step)
        t0 = time.perf_counter()
        stats = engine.train_step(state.step, multiplier)
        if cfg.expert_bias:
            engine.update_router_bias()
        seconds = time.perf_counter() - t0
        state.step += 1
        state.tokens += cfg.batch_tokens
        state.train_flops += step_flops
        state.train_seconds += seconds
        state.losses.append(stats["loss"])
        state.grad_norms = (state.grad_norms + [stats["grad_norm"]])[-GRAD_NORM_WINDOW:]
        use = utilisation(step_flops, seconds, devices=engine.world, peak=peak)
        metrics = stats | {
            "lr": cfg.lr * multiplier,
            "grad_norm_median_1000": grad_median.add(stats["grad_norm"]),
            "tokens_per_second": cfg.batch_tokens / seconds,
            "train_flops": state.train_flops,
            "tokens": float(state.tokens),
            "mfu": use.mfu,
            "achieved_tflops_per_device": use.achieved_flops_per_device / 1e12,
        }
        events = engine.drain_clip_events()
        if main:
            append_jsonl(events, run_dir / CLIP_LOG_FILE)
        diverged_reason = divergence.check(state.step, stats["loss"])  # the same loss on every rank
        is_last = state.step == total or diverged_reason is not None
        if not diverged_reason and (state.step % cfg.eval_interval == 0 or is_last):
            curve = _evaluate(engine, state, final=is_last, due=state.step % cfg.eval_interval == 0)
            metrics |= {f"bpb/{domain}": v for domain, v in curve.items()}  # never the final eval's numbers
            if main:
                write_json_atomic(run_dir / EVAL_FILE, {"unigram_bpb": unigram, "evals": state.evals}, indent=2)
        if tracker is not None:
            tracker.log_metrics(metrics, step=state.step, flush=is_last)
        bar.update(state.step, metrics)
        if diverged_reason:
            log.warning("run diverged: %s", diverged_reason)
            return diverged_reason, job_start
        if state.step % cfg.checkpoint_interval == 0 or state.step == stop_at:
            state.wall_seconds += time.perf_counter() - job_start
            job_start = time.perf_counter()
            if tracker is not None:  # a kill after this flush reruns steps the store skips (tracking.py)
                tracker.flush()
            with deferred():  # a SIGTERM mid-write ends the job after the checkpoint, not inside it
                engine.save(run_dir, asdict(state))
    return None, job_start


def _evaluate(engine: Engine, state: LoopState, *, final: bool, due: bool) -> dict[str, float]:
    """Run this step's eval(s) into `state.evals`; the learning curve's point: the intermediate sample's
    BPB per domain (rungs.evaluation), or {} where the step has none.

    At the last step the final eval runs, and the curve's point is the sample's BPB from the final
    eval's per-document sums (free when the final eval covers the sample, the default); otherwise the
    sample is scored on its own only when the step is on the eval cadence."""
    t0 = time.perf_counter()
    scores = engine.evaluate(final=final)  # collective in a sharded engine
    curve = {d: s.sample_bpb for d, s in scores.items() if s.sample_bpb is not None} if final else \
        {d: s.bpb for d, s in scores.items()}
    entry = {"step": state.step, "final": final, "bpb": {d: s.bpb for d, s in scores.items()},
             "bpb_se": {d: s.bpb_se for d, s in scores.items()}, "docs": {d: s.docs for d, s in scores.items()},
             "tokens": {d: s.tokens for d, s in scores.items()}}
    if final and len(curve) < len(scores):
        curve = {}
        if due:
            curve = {d: s.bpb for d, s in engine.evaluate(final=False).items()}
    if final and curve:
        entry["sample_bpb"] = curve
    if final:  # each held-out document's bits and bytes (`fits.heldout_noise`)
        entry["doc_bits"] = {d: list(s.doc_bits) for d, s in scores.items()}
        entry["doc_bytes"] = {d: list(s.doc_bytes) for d, s in scores.items()}
    entry["seconds"] = time.perf_counter() - t0
    state.evals.append(entry)
    log.info("step %d: %s BPB %s (%.1fs)", state.step, "final" if final else "sample",
             " ".join(f"{d} {v:.3f}" for d, v in entry["bpb"].items()), entry["seconds"])
    return curve


def tracker_for(cfg: TrainConfig, engine: Engine, run_dir: Path) -> Tracker:
    return Tracker(cfg.tracking_uri, cfg.experiment_name, run_dir, run_name=f"{cfg.recipe}-L{cfg.L}-{cfg.key()[:8]}",
                   tags={"recipe": cfg.recipe, "rung": cfg.L, "trial_key": cfg.trial_key or cfg.key(),
                         "config_key": cfg.key()} | engine.tags(),
                   params=cfg.to_dict())


def _result(tracker: Tracker | None, state: LoopState, peak: DevicePeak, devices: int, unigram: dict[str, float],
            diverged_reason: str | None, run_dir: Path, *, finished: bool) -> TrainResult:
    last = state.evals[-1] if state.evals and state.evals[-1].get("final", True) else {}  # the final eval's
    use = utilisation(state.train_flops, state.train_seconds, devices=devices, peak=peak)
    return TrainResult(
        run_id=tracker.run_id if tracker is not None else None,
        final_loss=state.losses[-1] if state.losses else float("nan"),
        bpb=dict(last.get("bpb", {})) if finished and diverged_reason is None else {},  # a diverged run has none
        bpb_se={d: v for d, v in last.get("bpb_se", {}).items() if math.isfinite(v)}
        if finished and diverged_reason is None else {},  # none from a single document
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
        devices=devices,
        mfu_capped=use.mfu_capped,
    )


def finished_result(run_dir: Path, total: int, config_keys: tuple[str, ...] | None = None) -> TrainResult | None:
    """A job that already finished returns its stored result instead of training again.

    `config_keys`: the keys this job accepts (`TrainConfig.resume_keys()`, its own first). A result
    recorded by another config is refused, as its checkpoint would be: returning it would report one
    config's numbers as another's."""
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("steps") != total and not data.get("diverged"):
            return None
        res = TrainResult(**data)
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: unreadable stored result ({str(err)[:200]}); move it aside to train "
                              "again from the checkpoint, or start over with --fresh (resume=False)") from None
    if config_keys and res.config_key is not None and res.config_key not in config_keys:
        raise CheckpointError(f"{path}: the finished job in this directory had another configuration (key "
                              f"{res.config_key}, this job {config_keys[0]}); use another run directory, or start "
                              "over with --fresh (resume=False)")
    return res


def _close_finished_run(cfg: TrainConfig, engine: Engine, run_dir: Path, res: TrainResult) -> None:
    """A job killed after writing its result but before closing its MLflow run left the run RUNNING:
    the rerun that returns the stored result logs what was missing and closes it."""
    if not cfg.tracking_uri or not res.run_id or not (run_dir / RUN_ID_FILE).is_file():
        return
    if run_status(cfg.tracking_uri, res.run_id) != "RUNNING":
        return
    log.warning("MLflow run %s of finished job %s was left RUNNING; closing it", res.run_id, run_dir)
    log_final(tracker_for(cfg, engine, run_dir), res, run_dir)


def log_final(tracker: Tracker, res: TrainResult, run_dir: Path) -> None:
    final = {f"final_bpb/{d}": v for d, v in res.bpb.items()}
    final |= {f"final_bpb_se/{d}": v for d, v in res.bpb_se.items() if math.isfinite(v)}
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
    # A diverged run is FINISHED too, tagged diverged=true: its outcome is a result (ladder.run.sweep_runs
    # counts it "diverged", not "failed", and does not retry it).
    tracker.finish(status="FINISHED")
