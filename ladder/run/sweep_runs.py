"""What MLflow knows about a sweep's trials: the source of truth for skip, resume and status.

A trial's MLflow run carries the tags `trial_key` (set by the training job from its config),
`sweep`, `attempt` and `outcome` (set by the orchestrator's trial wrapper). A key with a FINISHED run
is done (finished, or diverged when the job tagged `diverged=true`) and is never run again; a key
whose run is RUNNING is being trained or was interrupted (a rerun resumes it from its checkpoint
into the same run); a FAILED run failed all its attempts. A key with several finished runs (a job
rerun with `--fresh`) is its latest one, the run `ladder.run.mlflow_runs.read_runs` gives the fits.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


TAG_KEY = "trial_key"
TAG_SWEEP = "sweep"
TAG_ATTEMPT = "attempt"
TAG_OUTCOME = "outcome"
TAG_LABEL = "trial"
TAG_ERROR = "error"  # a failed attempt's "ExceptionType: message" (ladder.run.trial)


def is_true_tag(value: object) -> bool:
    """A yes/no tag such as `diverged`: "true" in any case and spacing (the jobs write "true"/"false")."""
    return str(value).strip().lower() == "true"


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

    from rungs.tracking import store_lock

    # The first client on a fresh SQLite file creates MLflow's schema: under the store's lock, so two
    # drivers (or a driver and a job) starting together do not both create it ("table ... already exists").
    with store_lock(tracking_uri):
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
                run_id=run.info.run_id, status=run.info.status, diverged=is_true_tag(tags.get("diverged")),
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
    if finished:  # several: the job was rerun from scratch; its latest run is the trial's result
        latest = finished[-1]
        return TrialState("diverged" if latest.diverged else "finished", latest.run_id, attempts, len(finished),
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


RESULT_FILE = "result.json"  # the training job's record of a finished job (rungs.train)
CONFIG_FILE = "config.json"
EVAL_ARTIFACTS = ("config.json", "eval.json", "clip_events.jsonl", "result.json", "data_report.json")


def stored_result_run_id(run_dir: Path) -> str | None:
    """The MLflow run id a finished job recorded in its result.json; None when it did not finish."""
    import json

    path = Path(run_dir) / RESULT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data.get("run_id") if isinstance(data, dict) else None


def reregister(tracking_uri: str, experiment_name: str, run_dir: Path, tags: dict) -> str:
    """Record a finished job's stored result (result.json, config.json, its artifacts) as a new
    FINISHED run of the experiment, for a store that lost the original run. Logged: the config as
    params, the per-step loss, the final metrics and the `diverged` tag the job logs, the trial
    tags, and `reregistered_from` (the lost run id). Per-step metrics other than the loss are gone
    with the old store. The run directory's run-id files then name the new run."""
    import json

    from rungs.tracking import RUN_ID_FILE, Tracker

    run_dir = Path(run_dir)
    result = json.loads((run_dir / RESULT_FILE).read_text())
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    (run_dir / RUN_ID_FILE).unlink(missing_ok=True)  # the lost run cannot be resumed
    tracker = Tracker(tracking_uri, experiment_name, run_dir,
                      run_name=f"{config.get('recipe')}-L{config.get('L')}-{tags[TAG_KEY][:8]}",
                      tags={"recipe": config.get("recipe"), "rung": config.get("L"), **tags,
                            "reregistered_from": result.get("run_id")},
                      params=config)
    for step, loss in enumerate(result.get("losses") or [], start=1):
        tracker.log_metrics({"loss": loss}, step=step)
    final = {f"final_bpb/{d}": v for d, v in (result.get("bpb") or {}).items()}
    final |= {f"final_bpb_se/{d}": v for d, v in (result.get("bpb_se") or {}).items()}  # (results since it existed)
    final |= {f"unigram_bpb/{d}": v for d, v in (result.get("unigram_bpb") or {}).items()}
    final |= {"final_loss": result.get("final_loss"), "total_train_flops": result.get("train_flops"),
              "total_tokens": result.get("tokens"), "wall_seconds": result.get("wall_seconds"),
              "final_tokens_per_second": result.get("tokens_per_second"), "final_mfu": result.get("mfu")}
    tracker.log_metrics(final, step=int(result.get("steps") or 0), flush=True)
    tracker.set_tag("diverged", str(bool(result.get("diverged"))).lower())
    if result.get("diverged_reason"):
        tracker.set_tag("diverged_reason", str(result["diverged_reason"])[:5000])
    result["run_id"] = tracker.run_id
    (run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
    for name in EVAL_ARTIFACTS:
        tracker.log_artifact(run_dir / name)
    tracker.finish("FINISHED")
    return tracker.run_id
