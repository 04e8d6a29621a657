"""MLflow tracking for one training job: one run per job, reopened on resume.

Params are the resolved config flattened (`sources.code.epochs`); tags name the recipe, the rung,
the trial key and the code version (`provenance.code_version`: version + git sha, `.dirty` for local edits); metrics are logged per step in
batches; the final BPB per domain, FLOPs, tokens and wall-clock go in as final metrics; artifacts
are the resolved config, the eval JSON and the clip-event log. The default store is an embedded
SQLite file (`sqlite:///runs/mlflow.db`); any tracking URI MLflow accepts works.

Each (metric, step) reaches the store once, however the job is killed and resumed: a reopened run
gets the params a kill left unlogged, reads the last step stored for each metric, and steps a resumed job runs again (those after its
last checkpoint) are not logged a second time. So flushing may happen at any time, ahead of
checkpoints or not. On a failure path (`finish(..., failing=True)`) MLflow's HTTP retries are
bounded, so a dead or full store cannot hold a failed job for minutes, and a tracking error
never hides the error that ended the job. Every write is `rungs.signals.deferred`: a SIGTERM landing inside
one (a SQLite transaction cut halfway kept its write lock) ends the job after it, so the crash path can mark
the run FAILED.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

from provenance import code_version  # the one code version (fit results, run tags, goldens)
from rungs.data.atomic import atomic_write_bytes, temporary_for  # hidden, pid-marked temporaries, renamed whole
from rungs.signals import deferred  # a SIGTERM waits for the end of a store write (a cut one keeps SQLite locked)

log = logging.getLogger(__name__)

RUN_ID_FILE = "mlflow_run_id"
_MAX_PARAM_CHARS = 6000
_BATCH = 100  # MLflow's per-request limit on params; metrics allow 1000
_FLUSH_PENDING = 500  # values held before a flush (any flush is safe: steps are logged once)
# On a failure path: one try, 10 s per request (MLflow's defaults retry for minutes).
_FAILING_HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# The experiment kind the MLflow UI reads (the tag its experiment-kind selector writes): model training,
# so the experiment opens on its runs rather than in the GenAI (traces) view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND_TAGS = {EXPERIMENT_KIND_TAG: "custom_model_development"}


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"sources": {"code": {"epochs": 1.5}}} → {"sources.code.epochs": "1.5"}."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flatten(value, name + ".")
        else:
            out[name] = str(value)[:_MAX_PARAM_CHARS]
    return out


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///` store; None for any other store."""
    prefix = "sqlite:///"
    return Path(tracking_uri[len(prefix):]) if tracking_uri.startswith(prefix) else None


def local_artifacts_dir(tracking_uri: str) -> Path | None:
    """Where a SQLite store's artifacts live: `mlartifacts/` next to the database file (both for runs
    logged directly and for the tracking server fronting the file, ladder.run.tracking_server)."""
    db = sqlite_path(tracking_uri)
    return db.resolve().parent / "mlartifacts" if db is not None else None


def _artifact_location(tracking_uri: str) -> str | None:
    """Keep a SQLite store's artifacts next to its database file instead of in the cwd."""
    root = local_artifacts_dir(tracking_uri)
    return root.as_uri() if root is not None else None


@contextlib.contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """Serialise schema creation and experiment creation on a SQLite store across processes.

    Jobs started together on a fresh `sqlite:///` store otherwise race in MLflow's schema migration
    ("duplicate column name: step") or in creating the same experiment. Other stores need no lock.
    A missing store is created here, under the lock, from the empty-schema template (`seed_new_store`).
    """
    db = sqlite_path(tracking_uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / (db.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not db.exists():
                seed_new_store(db)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def schema_cache_dir() -> Path:
    """Where the empty-schema template lives: $XDG_CACHE_HOME/scaling-ladder (~/.cache by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaling-ladder"


def empty_schema_template() -> Path | None:
    """An empty SQLite file holding MLflow's whole schema (every migration applied, no experiment), made
    once per machine and MLflow version in `schema_cache_dir()`; None where it cannot be made (a read-only
    cache, an MLflow without the helper, any error while building it), and the store is then created by
    MLflow as before.

    A new store built by MLflow runs its ~70 schema migrations one by one: 2-5 s of CPU a store, paid by
    every new sweep, nightly and job store. Copied from here, it costs a file copy. The template holds no
    default experiment: MLflow creates that when it first opens the copy, with the copy's own artifact
    location, so a seeded store equals a migrated one (tests/rungs/test_tracking.py compares them).
    """
    try:
        import mlflow
        from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine_with_retry
    except ImportError:
        return None
    cache = schema_cache_dir()
    template = cache / f"mlflow-{mlflow.__version__}-schema.db"
    if template.is_file():
        return template
    partial = temporary_for(template)  # this process's own name: no other file is ever removed
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / (template.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # processes starting together build it once
            try:
                if not template.is_file():
                    partial.unlink(missing_ok=True)
                    engine = create_sqlalchemy_engine_with_retry(f"sqlite:///{partial}")
                    try:
                        _initialize_tables(engine)
                    finally:
                        engine.dispose()
                    os.replace(partial, template)  # whole or absent, never half-written
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    except Exception as err:  # a template is only a shortcut: MLflow's own migrations still build the store
        log.warning("no MLflow schema template in %s (%r); new stores run MLflow's migrations", cache, err)
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        return None
    return template


def seed_new_store(db: Path) -> None:
    """Start the missing SQLite store `db` as a copy of the empty-schema template (call under its
    `store_lock`). Without a template nothing is written and MLflow creates the store itself."""
    template = empty_schema_template()
    if template is None:
        return
    atomic_write_bytes(db, template.read_bytes())  # a few hundred KB; whole or absent, as every prepared file


def mark_model_training(client: Any, experiment: Any) -> None:
    """Tag an experiment someone else created (a sweep driver, an older version) as model training,
    unless it says what it is already. Jobs that start together through a tracking server may tag it at the
    same moment: the server inserts the tag twice and the second insert fails on the store's unique key; the
    tag is then there, which is all this asks."""
    from mlflow.exceptions import MlflowException

    if EXPERIMENT_KIND_TAG in experiment.tags:
        return
    try:
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND_TAGS[EXPERIMENT_KIND_TAG])
    except MlflowException:
        if EXPERIMENT_KIND_TAG not in client.get_experiment(experiment.experiment_id).tags:
            raise


def model_experiment_id(client: Any, name: str, *, artifact_location: str | None = None) -> str:
    """The id of experiment `name`, created tagged as model training where it is missing and tagged where an
    older version left it untagged (`mark_model_training`). Where another job created it a moment before (a
    tracking server's clients race: a SQLite file's `store_lock` does not reach them), the one it created."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, tags=EXPERIMENT_KIND_TAGS, artifact_location=artifact_location)
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    mark_model_training(client, exp)
    return exp.experiment_id


def _served_artifact_dir(client: Any, tracking_uri: str, run_id: str) -> Path | None:
    """Where a run whose experiment a tracking server created keeps its artifacts on this machine: its
    `mlflow-artifacts:/…` URI, which only the server resolves, under `<store dir>/mlartifacts/`
    (ladder.run.tracking_server's default); None for any other run or store."""
    uri = client.get_run(run_id).info.artifact_uri
    root = local_artifacts_dir(tracking_uri)
    if uri.startswith("mlflow-artifacts:") and root is not None:
        return root / uri[len("mlflow-artifacts:"):].lstrip("/")
    return None


def log_artifact(client: Any, tracking_uri: str, run_id: str, path: Path) -> None:
    """`client.log_artifact`, also for a run whose experiment a tracking server created: a client on the
    server's SQLite file (`ladder fit --experiment` after `ladder sweep run`) writes the file where the server
    keeps it instead (`_served_artifact_dir`)."""
    dest = _served_artifact_dir(client, tracking_uri, run_id)
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest / Path(path).name)
        return
    client.log_artifact(run_id, str(path))


def fetch_artifact(client: Any, tracking_uri: str, run_id: str, name: str, dest: Path) -> Path:
    """The local path of run `run_id`'s artifact `name`: `client.download_artifacts` into `dest`, or, for a run
    whose experiment a tracking server created, the file where the server keeps it, read in place
    (`_served_artifact_dir`). Raises OSError where there is no such file."""
    served = _served_artifact_dir(client, tracking_uri, run_id)
    if served is not None:
        path = served / name
        if not path.is_file():
            raise FileNotFoundError(f"no artifact {name} of run {run_id} at {path}")
        return path
    dest.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, name, str(dest)))


def _run_is_missing(err: Exception) -> bool:
    """Whether MLflow said the run does not exist (the store was wiped, moved or is another one), as opposed to
    failing to answer: only then is a new run the right continuation of a resumed job."""
    from mlflow.exceptions import MlflowException

    return isinstance(err, MlflowException) and err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


class Tracker:
    """A thin wrapper over MlflowClient bound to one run."""

    def __init__(self, tracking_uri: str, experiment_name: str, run_dir: Path, *, run_name: str,
                 tags: dict[str, str], params: dict[str, Any]) -> None:
        from mlflow import MlflowClient

        with store_lock(tracking_uri):  # a fresh SQLite store: one process creates the schema
            self.client = MlflowClient(tracking_uri)
            self.client.search_experiments(max_results=1)
        self.tracking_uri = tracking_uri
        self._pending: list[Any] = []
        self._stored_through: dict[str, int] = {}  # per metric: the last step the store already holds
        id_file = Path(run_dir) / RUN_ID_FILE
        self.run_id = id_file.read_text().strip() if id_file.is_file() else None
        if self.run_id is not None:
            try:
                run = self.client.get_run(self.run_id)
                self._stored_through = self._last_steps(run)
                self.client.update_run(self.run_id, status="RUNNING")
            except Exception as err:
                if not _run_is_missing(err):  # the store answered, then failed: a new run would split this one
                    raise
                log.warning("MLflow run %s not found in %s; starting a new one", self.run_id, tracking_uri)
            else:
                log.info("resuming MLflow run %s", self.run_id)
                # The run's id is recorded before its params are logged: a job killed in between left some
                # out, and the fits read lr, steps, tpp from them. Only missing ones: a stored param is final.
                self._log_params(params, stored=run.data.params)
                return
        with store_lock(tracking_uri):  # two jobs starting together must not both create the experiment
            exp = self.client.get_experiment_by_name(experiment_name)
            if exp is not None and exp.lifecycle_stage == "deleted":  # `ladder train` refuses it up front
                raise ValueError(f"the MLflow experiment {experiment_name!r} (id {exp.experiment_id}) was deleted "
                                 f"in {tracking_uri}; restore it or name another experiment")
            exp_id = model_experiment_id(self.client, experiment_name,
                                         artifact_location=_artifact_location(tracking_uri))
        all_tags = {k: str(v) for k, v in tags.items() if v is not None}
        version = code_version()
        if version:
            all_tags["code_version"] = version
        self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=all_tags).info.run_id
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(self.run_id + "\n")
        self._log_params(params, stored={})

    def _log_params(self, params: dict[str, Any], *, stored: dict[str, str]) -> None:
        """The flattened config as params, those the run does not hold yet, in batches."""
        from mlflow.entities import Param

        flat = [Param(k, v) for k, v in flatten(params).items() if k not in stored]
        for i in range(0, len(flat), _BATCH):
            with deferred():
                self.client.log_batch(self.run_id, params=flat[i:i + _BATCH])

    def _last_steps(self, run: Any) -> dict[str, int]:
        """Per metric key, the largest step the store holds for this run."""
        latest = getattr(run.data, "_metric_objs", None)  # the latest-metric rows carry their step
        if latest is not None:
            return {m.key: int(m.step) for m in latest}
        return {key: max(int(m.step) for m in self.client.get_metric_history(self.run_id, key))
                for key in run.data.metrics}

    def log_metrics(self, metrics: dict[str, float], step: int, *, flush: bool = False) -> None:
        """Queue values for `step`; a (key, step) the store already has (a step run again after a
        resume) is dropped, so no step is ever stored twice."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._pending += [Metric(k, float(v), now, step) for k, v in metrics.items()
                          if v is not None and step > self._stored_through.get(k, -1)]
        if flush or len(self._pending) >= _FLUSH_PENDING:
            self.flush()

    def flush(self) -> None:
        while self._pending:
            with deferred():  # a SIGTERM inside a SQLite write left it holding the lock: the run stayed RUNNING
                chunk, self._pending = self._pending[:1000], self._pending[1000:]
                self.client.log_batch(self.run_id, metrics=chunk)

    def log_artifact(self, path: Path) -> None:
        if Path(path).is_file():
            with deferred():
                log_artifact(self.client, self.tracking_uri, self.run_id, Path(path))

    def set_tag(self, key: str, value: str) -> None:
        with deferred():
            self.client.set_tag(self.run_id, key, value)

    def finish(self, status: str = "FINISHED", *, failing: bool = False, skip_flush: bool = False) -> None:
        """Flush and close the run. `failing`: the job is ending on an error; bound MLflow's HTTP retries
        and log (never raise) a tracking failure, so the job's own error is the one reported.
        `skip_flush`: drop pending values (a full disk: flushing to a store on it cannot succeed)."""
        if not failing:
            self.flush()
            with deferred():
                self.client.set_terminated(self.run_id, status=status)
            return
        saved = {k: os.environ.get(k) for k in _FAILING_HTTP_ENV}
        os.environ.update(_FAILING_HTTP_ENV)
        try:
            if skip_flush:
                log.warning("not flushing %d pending metric values to MLflow: the disk is full", len(self._pending))
                self._pending = []
            else:
                self.flush()
            self.client.set_terminated(self.run_id, status=status)
        except Exception as err:  # the store is down or full too; the job's error says what happened
            log.warning("could not mark MLflow run %s %s: %s", self.run_id, status, str(err).splitlines()[0][:300])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def deleted_experiment(tracking_uri: str, name: str) -> str | None:
    """The id of experiment `name` when the store holds it deleted (the MLflow UI deletes softly, and no run
    can be created in a deleted experiment), else None; a SQLite store not created yet holds none."""
    db = sqlite_path(tracking_uri)
    if db is not None and not db.is_file():
        return None
    from mlflow import MlflowClient

    exp = MlflowClient(tracking_uri).get_experiment_by_name(name)
    return exp.experiment_id if exp is not None and exp.lifecycle_stage == "deleted" else None


def run_status(tracking_uri: str, run_id: str) -> str | None:
    """The MLflow status of a run (RUNNING, FINISHED, FAILED, KILLED), None when the store lacks it."""
    from mlflow import MlflowClient

    try:
        return MlflowClient(tracking_uri).get_run(run_id).info.status
    except Exception:  # a missing run or store: the caller starts or closes nothing
        return None
