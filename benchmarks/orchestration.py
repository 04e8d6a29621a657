"""Orchestration overhead: what Ray Tune + tracking add to each trial, and how fast a sweep plans.

- `overhead_seconds_per_trial`: with trials run one at a time, the Tune experiment's wall time
  (`Tuner.fit`) minus the training jobs' own `train()` calls, per trial: scheduling, worker process
  start, imports, bookkeeping, MLflow tags and result reporting. A real sweep of the smallest
  cpu-demo rung. Target ≤ 3 s, and ≤ 5% of a two-minute trial.
- `job_setup_seconds_per_trial` (reported, not checked): the `train()` call minus its training
  loop (data, model build, peak-FLOP probe, evals, the job's own MLflow logging): the job's cost,
  not the orchestrator's.
- `plan_1000_trials_seconds`: expand, resolve and key a 1,000-trial spec. Target ≤ 5 s.
- Sweep-level fixed costs (Ray start, tracking-server start) are reported once per sweep.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Report, main_for

TWO_MINUTES_SECONDS = 120.0

BIG_SPEC = {"name": "plan1000", "recipe": "cpu-demo", "blocks": [{
    "name": "grid", "rungs": [3, 4, 5, 6, 7], "tpp": [2, 4],
    "lr_wd": {"log_lr": {"spacing": 0.25, "points": 10}, "log_lr_wd": {"spacing": 0.3, "points": 10}}}]}


def finished_rows(rows: list) -> list:
    """Every trial's row, each finished with its timings; refused otherwise. The overhead is the Tune
    experiment's wall time less the trials' train() calls: a trial that failed or was skipped spent Tune's time
    without a train() call this run measured, and would be counted as overhead."""
    unfinished = [(r.label, r.state, r.error) for r in rows
                  if r.state != "finished" or not r.wall_seconds or not r.train_call_seconds]
    if unfinished or not rows:
        raise RuntimeError(f"the overhead is measured over finished trials only, and these did not finish with "
                           f"their timings: {unfinished or 'no trial ran'}")
    return rows


def overhead_per_trial(rows: list, tune_seconds: float) -> float:
    """Trials run one at a time, so the Tune experiment's wall time minus the train() calls is everything else
    a trial costs (scheduling, worker start, imports, tags, reporting), per trial."""
    return (tune_seconds - sum(r.train_call_seconds for r in rows)) / len(rows)


def _overhead_spec(trials: int) -> dict:
    return {"name": "overhead", "recipe": "cpu-demo", "max_steps": 10, "max_concurrent": 1, "max_failures": 0,
            "resources": {"cpus": 1}, "blocks": [{"name": "b", "rungs": [3], "seeds": list(range(trials))}]}


def run(quick: bool) -> Report:
    from ladder.run.orchestrate import connect_ray, run_sweep
    from sweeps.plan import plan_sweep
    from ladder.run.tracking_server import TrackingServer
    from sweeps.spec import parse_spec

    report = Report("orchestration")

    big = parse_spec(BIG_SPEC, "benchmarks/orchestration.py")
    t0 = time.perf_counter()
    planned = plan_sweep(big)
    plan_seconds = time.perf_counter() - t0
    report.results["plan_trials"] = len(planned)
    report.results["plan_1000_trials_seconds"] = plan_seconds

    trials = 2 if quick else 4
    with tempfile.TemporaryDirectory(prefix="ladder-bench-") as tmp:
        store = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        t0 = time.perf_counter()
        with TrackingServer(f"sqlite:///{Path(tmp) / 'probe.db'}"):
            server_start_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        connect_ray(None)
        ray_start_seconds = time.perf_counter() - t0
        try:
            spec = parse_spec(_overhead_spec(trials), "benchmarks/orchestration.py")
            t0 = time.perf_counter()
            outcome = run_sweep(spec, tracking_uri=store, progress=lambda msg: sys.stderr.write(msg + "\n"))
            sweep_seconds = time.perf_counter() - t0
        finally:
            import ray

            ray.shutdown()
    rows = finished_rows(outcome.rows)
    overhead = overhead_per_trial(rows, outcome.tune_seconds)
    callback_overhead = statistics.median(r.wall_seconds - r.train_call_seconds for r in rows)
    job_setup = statistics.median(r.train_call_seconds - r.train_loop_seconds for r in rows)
    report.results.update({
        "trials": len(rows), "trial_wall_seconds": [r.wall_seconds for r in rows],
        "train_call_seconds": [r.train_call_seconds for r in rows],
        "train_loop_seconds": [r.train_loop_seconds for r in rows],
        "tune_seconds": outcome.tune_seconds, "overhead_seconds_per_trial": overhead,
        "overhead_seconds_trial_start_to_end_median": callback_overhead, "overhead_share_of_two_minute_trial": overhead / TWO_MINUTES_SECONDS,
        "job_setup_seconds_per_trial": job_setup,
        "sweep_seconds": sweep_seconds, "ray_start_seconds": ray_start_seconds,
        "tracking_server_start_seconds": server_start_seconds,
    })
    report.check("overhead_seconds_per_trial", overhead, "<=", 3.0)
    report.check("overhead_share_of_two_minute_trial", overhead / TWO_MINUTES_SECONDS, "<=", 0.05)
    report.check("plan_1000_trials_seconds", plan_seconds, "<=", 5.0)
    return report


if __name__ == "__main__":
    sys.exit(main_for("orchestration", run))
