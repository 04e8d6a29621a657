"""A sweep's trials as MLflow records them: one row per planned trial (state, run, attempts, bpb, error),
the outcome of a run or a status over those rows, and a running trial's progress. A read: no Ray, no server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ladder.run.stores import check_store
from ladder.run.sweep_runs import TAG_ERROR, find_runs, trial_state
from rungs.tracking_uri import default_tracking_uri
from sweeps.plan import PlannedTrial, plan_sweep
from sweeps.spec import SweepSpec


@dataclass
class TrialRow:
    key: str
    label: str
    state: str  # pending, running, finished, failed, diverged
    run_id: str | None = None
    attempts: int = 0
    ran_now: bool = False
    bpb_mean: float | None = None
    wall_seconds: float | None = None  # driver-observed, start to end of the Tune trial
    train_wall_seconds: float | None = None
    train_loop_seconds: float | None = None
    train_call_seconds: float | None = None  # the train() call inside the worker, set-up and evals included
    error: str | None = None
    progress: str | None = None  # running trials in `status`: last logged step of the planned steps, and when


@dataclass
class SweepOutcome:
    sweep: str
    experiment: str
    tracking_uri: str
    rows: list[TrialRow] = field(default_factory=list)
    tune_seconds: float | None = None  # wall time of the Tune experiment (Tuner.fit), when one ran

    def counts(self) -> dict:
        now = [r for r in self.rows if r.ran_now]
        return {"trials": len(self.rows),
                "completed": sum(r.state == "finished" for r in now),
                "skipped": sum(not r.ran_now for r in self.rows),
                "failed": sum(r.state not in ("finished", "diverged") for r in now),
                "diverged": sum(r.state == "diverged" for r in now)}


def default_store(tracking_uri: str | None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI (set on cluster pods), else the embedded SQLite store
    (`rungs.tracking_uri.default_tracking_uri`, as every command resolves it). An empty --tracking-uri stays
    empty (check_store refuses it) rather than meaning the default."""
    return default_tracking_uri(tracking_uri)


def trial_row(planned: PlannedTrial, records) -> TrialRow:
    st = trial_state(records)
    bpb = None
    if st.run_id and st.state in ("finished", "diverged"):
        bpb = next((r.tags.get("bpb_mean") for r in records if r.run_id == st.run_id), None)
    error = None
    if st.state == "failed":  # the trial wrapper tags a failed attempt's run with its error (ladder.run.trial)
        error = one_line(next((r.tags.get(TAG_ERROR) for r in reversed(records) if r.tags.get(TAG_ERROR)), None))
    return TrialRow(key=planned.key, label=planned.label, state=st.state, run_id=st.run_id, attempts=st.attempts,
                    bpb_mean=float(bpb) if bpb else None, error=error)


ERROR_CHARS = 300


def one_line(text: str | None) -> str | None:
    """The first non-empty line of an error, at most ERROR_CHARS long: what a status table can show."""
    if not text:
        return None
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS - 1] + "…"


def sweep_status(spec: SweepSpec, *, where: str = "sweep spec", tracking_uri: str | None = None) -> SweepOutcome:
    """Each trial's state from MLflow alone (no Ray, no server: a read)."""
    planned = plan_sweep(spec, where=where)
    store = default_store(tracking_uri)
    check_store(store, create=False)  # a missing store is refused: "pending" would claim what nobody knows
    records = find_runs(store, spec.experiment_name)
    rows = [trial_row(p, records.get(p.key, [])) for p in planned]
    for p, row in zip(planned, rows):
        if row.state == "running" and row.run_id:
            row.progress = _progress(store, row.run_id, _run_steps(p.config))
    return SweepOutcome(sweep=spec.name, experiment=spec.experiment_name, tracking_uri=store, rows=rows)


def _run_steps(config: dict) -> int | None:
    """The steps a trial's job runs: its planned steps, cut short by max_steps (a cap above them cuts nothing)."""
    steps, cap = config.get("steps"), config.get("max_steps")
    return min(steps, cap) if steps and cap else (steps or cap)


# A RUNNING run whose job logged nothing for this long was probably killed (a rerun resumes it).
STALE_AFTER_SECONDS = 900.0


def _progress(store: str, run_id: str, total_steps: int | None) -> str:
    """"step 400/1192, 35 s ago" from the run's loss history; a run silent for STALE_AFTER_SECONDS is
    marked as such, since a killed job leaves its MLflow run RUNNING."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient(store).get_metric_history(run_id, "loss")
    if not history:
        return "starting"
    last = max(history, key=lambda m: m.step)
    ago = max(0.0, time.time() - last.timestamp / 1000.0)
    text = f"step {last.step}/{total_steps or '?'}, {ago:.0f} s ago"
    return text + " (stale: killed? a rerun resumes it)" if ago > STALE_AFTER_SECONDS else text
