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
from pathlib import Path

from ladder.errors import StoreError
from rungs.tracking import sqlite_path

TAG_KEY = "trial_key"
TAG_SWEEP = "sweep"
TAG_ATTEMPT = "attempt"
TAG_OUTCOME = "outcome"
TAG_LABEL = "trial"


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


# --- the store itself: missing, damaged, locked, or out of step with the run directories ---------

SQLITE_MAGIC = b"SQLite format 3\x00"
# How long a reader waits for another process's lock before calling the store locked. A tracking
# server's writes hold it for milliseconds; a process holding it this long is not going to let go.
LOCK_WAIT_SECONDS = 20.0


def check_store(store: str, *, create: bool) -> None:
    """Refuse a store that cannot be what the user meant, before anything reads or writes it.

    A `sqlite:///` file or a store directory that does not exist is created only when `create` (the
    default store, or `--new-store`): a mistyped path would otherwise become an empty store that
    shows every trial pending. An existing SQLite file must be a whole, unlocked MLflow database.
    Servers and databases behind URLs are checked by MLflow when first used.
    """
    if not store.strip():
        raise StoreError("empty tracking URI; leave the flag out for the default store (sqlite:///runs/mlflow.db) "
                         "or name one", field="--tracking-uri")
    db = sqlite_path(store)
    if db is None:
        directory = _directory_store(store)
        if directory is not None and not directory.exists() and not create:
            raise StoreError(f"no MLflow store at {directory}: the directory does not exist. Check the path, or create a "
                             f"new, empty store there with `ladder sweep run SPEC --tracking-uri {store} --new-store`", field="--tracking-uri")
        return
    if not str(db) or str(db) == ".":
        raise StoreError(f"{store} names no database file; write sqlite:///path/to/mlflow.db", field="--tracking-uri")
    if not db.exists():
        if create:
            return
        raise StoreError(f"no MLflow store at {db}: the file does not exist. Check the path (a mistyped one would "
                         f"start an empty store showing every trial pending), or create a new, empty store there with "
                         f"`ladder sweep run SPEC --tracking-uri {store} --new-store`", field="--tracking-uri")
    _check_sqlite(db)


def _directory_store(store: str) -> Path | None:
    """The directory of a file store (`./mlruns`, `file:///...`); None for servers and databases."""
    if store.startswith("file:"):
        return Path(store[len("file:"):].removeprefix("//"))
    if "://" in store or store.startswith(("databricks", "uc:")):
        return None
    return Path(store)


def _check_sqlite(db: Path) -> None:
    import sqlite3

    def damaged(why: str) -> StoreError:
        return StoreError(f"the MLflow store {db} is damaged ({why}). Restore it from a copy; or move it aside and "
                          f"rerun with --new-store, then `ladder sweep run SPEC --reregister` to record the finished "
                          f"trials' results (kept in the run directories) in the new store", field="--tracking-uri")

    if db.is_dir():
        raise StoreError(f"{db} is a directory, not an SQLite file", field="--tracking-uri")
    size = db.stat().st_size
    with open(db, "rb") as fh:
        header = fh.read(100)
    if size == 0:
        raise damaged("the file is empty")
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise damaged("not an SQLite database: its header is wrong or cut short")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The header's page count is valid when its change counters agree (SQLite file format §1.3.7).
    if header[24:28] == header[92:96] and pages and size < pages * page_size:
        raise damaged(f"truncated: {size:,} bytes of the {pages * page_size:,} its header records")
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=LOCK_WAIT_SECONDS)
        try:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if {"experiments", "runs", "metrics"} - tables:
                raise StoreError(f"{db} is an SQLite database but not an MLflow store (no experiments/runs/metrics "
                                 f"tables); check --tracking-uri", field="--tracking-uri")
            con.execute("SELECT COUNT(*) FROM runs").fetchone()
        finally:
            con.close()
    except sqlite3.OperationalError as err:
        if "locked" in str(err) or "busy" in str(err):
            raise StoreError(f"the MLflow store {db} is locked by another process (waited {LOCK_WAIT_SECONDS:.0f} s). "
                             f"Another sweep or `mlflow` process may be writing it: let it finish or stop it, then "
                             f"rerun", field="--tracking-uri") from None
        raise damaged(str(err)) from None
    except sqlite3.DatabaseError as err:  # "file is not a database", "database disk image is malformed"
        raise damaged(str(err)) from None


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
