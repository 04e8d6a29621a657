"""What MLflow knows about a sweep's trials: the source of truth for skip, resume and status.

A trial's MLflow run carries the tags `trial_key` (set by the training job from its config),
`sweep`, `attempt` and `outcome` (set by the orchestrator's trial wrapper). A key with a FINISHED run
is done (finished, or diverged when the job tagged `diverged=true`) and is never run again; a key
whose run is RUNNING is being trained or was interrupted (a rerun resumes it from its checkpoint
into the same run); a FAILED run failed all its attempts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

TAG_KEY = "trial_key"
TAG_SWEEP = "sweep"
TAG_ATTEMPT = "attempt"
TAG_OUTCOME = "outcome"
TAG_LABEL = "trial"
STATES = ("pending", "running", "finished", "failed", "diverged")


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    status: str  # MLflow's: RUNNING, FINISHED, FAILED, KILLED, SCHEDULED
    diverged: bool
    attempt: int | None
    start_ms: int | None
    end_ms: int | None
    tags: dict

    @property
    def done(self) -> bool:
        return self.status == "FINISHED"


@dataclass(frozen=True)
class TrialState:
    state: str
    run_id: str | None
    attempts: int
    finished_runs: int
    runs: int


def find_runs(tracking_uri: str, experiment_name: str) -> dict[str, list[RunRecord]]:
    """Every run of the experiment that has a trial key, grouped by key, oldest first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        return {}
    out: dict[str, list[RunRecord]] = defaultdict(list)
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token, order_by=["start_time ASC"])
        for run in page:
            tags = run.data.tags
            key = tags.get(TAG_KEY)
            if not key:
                continue
            attempt = tags.get(TAG_ATTEMPT)
            out[key].append(RunRecord(
                run_id=run.info.run_id, status=run.info.status, diverged=tags.get("diverged") == "true",
                attempt=int(attempt) if attempt and attempt.isdigit() else None,
                start_ms=run.info.start_time, end_ms=run.info.end_time, tags=dict(tags)))
        token = page.token
        if not token:
            break
    return dict(out)


def trial_state(records: list[RunRecord]) -> TrialState:
    """One trial's state from all its runs (normally one: a resumed or retried trial reuses its run)."""
    if not records:
        return TrialState("pending", None, 0, 0, 0)
    finished = [r for r in records if r.done]
    attempts = max((r.attempt or 0) for r in records)
    if finished:
        first = finished[0]
        return TrialState("diverged" if first.diverged else "finished", first.run_id, attempts, len(finished),
                          len(records))
    latest = records[-1]
    state = "running" if latest.status in ("RUNNING", "SCHEDULED") else "failed"
    return TrialState(state, latest.run_id, attempts, 0, len(records))


def tag_run(tracking_uri: str, run_id: str, tags: dict, *, status: str | None = None) -> None:
    from mlflow.tracking import MlflowClient

    from mlflow.entities import RunTag

    client = MlflowClient(tracking_uri)
    client.log_batch(run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])  # one request, not one per tag
    if status is not None:
        client.set_terminated(run_id, status=status)
