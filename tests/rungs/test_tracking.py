"""MLflow tracking: jobs that start together on a fresh SQLite store all get their run; a store seeded from
the empty-schema template is the store MLflow's own migrations build."""

from __future__ import annotations

import multiprocessing as mp
import os
import sqlite3
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from rungs.tracking import RUN_ID_FILE, Tracker, empty_schema_template, store_lock


def _open_tracker(uri: str, run_dir: str, barrier, results) -> None:
    barrier.wait()  # all processes hit the fresh store at the same moment
    try:
        tracker = Tracker(uri, "race", Path(run_dir), run_name=Path(run_dir).name, tags={"k": "v"},
                          params={"lr": 0.01})
        results.put(("ok", tracker.run_id))
    except Exception as err:  # reported to the parent, which fails the test with it
        results.put(("error", repr(err)))


def test_jobs_starting_together_on_a_fresh_sqlite_store_all_get_runs(tmp_path: Path, monkeypatch) -> None:
    # An empty cache: the four jobs race to build the schema template too, not only the store
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    ctx = mp.get_context("spawn")
    n = 4
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [ctx.Process(target=_open_tracker, args=(uri, str(tmp_path / f"job{i}"), barrier, results))
             for i in range(n)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=3600) for _ in procs]  # far guards, not speed bounds
    for p in procs:
        p.join(timeout=3600)
    errors = [detail for kind, detail in outcomes if kind == "error"]
    assert not errors, errors
    client = MlflowClient(uri)
    experiments = [e for e in client.search_experiments() if e.name == "race"]
    assert len(experiments) == 1
    runs = client.search_runs([experiments[0].experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(detail for _, detail in outcomes)
    assert [p.name for p in (tmp_path / "cache" / "scaling-ladder").glob("*.db")] == [empty_schema_template().name]
    assert not list(tmp_path.rglob(".*.tmp*"))  # no temporary of the template or the store is left


def _schema(db: Path) -> tuple[dict, list, list]:
    """Each table's columns, indexes (with their columns) and foreign keys as SQLite reports them, the
    migration head, and the experiments. Structure, not DDL text: SQLite keeps a table's CREATE statement
    as written, and MLflow's migrations rewrite some tables (alembic's batch mode) with text that depends
    on what the process reflected before (the same `runs` table, its statement worded differently)."""
    with sqlite3.connect(db) as con:
        tables = [row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        structure = {}
        for table in tables:
            indexes = {row[1]: (row[2], [c[2] for c in con.execute(f"PRAGMA index_info('{row[1]}')")])
                       for row in con.execute(f"PRAGMA index_list('{table}')")}
            structure[table] = (con.execute(f"PRAGMA table_info('{table}')").fetchall(), indexes,
                                sorted(con.execute(f"PRAGMA foreign_key_list('{table}')").fetchall()))
        head = con.execute("SELECT version_num FROM alembic_version").fetchall()
        experiments = con.execute("SELECT experiment_id, name, lifecycle_stage FROM experiments").fetchall()
    return structure, head, experiments


def test_a_store_seeded_from_the_template_is_the_store_mlflows_migrations_build(tmp_path: Path, monkeypatch) -> None:
    # The reference: MLflow building a store itself, the template out of reach (no cache can be made)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    migrated = tmp_path / "migrated" / "mlflow.db"
    with store_lock(f"sqlite:///{migrated}"):
        assert not migrated.exists()  # nothing seeded: MLflow creates it below
        MlflowClient(f"sqlite:///{migrated}").search_experiments()

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    seeded = tmp_path / "seeded" / "mlflow.db"
    with store_lock(f"sqlite:///{seeded}"):
        assert seeded.is_file()
        client = MlflowClient(f"sqlite:///{seeded}")
        client.search_experiments()
    assert _schema(seeded) == _schema(migrated)
    assert len(_schema(seeded)[0]) > 30  # MLflow's whole schema, not an empty file
    assert _schema(seeded)[2] == [(0, "Default", "active")]  # made by MLflow on first open, not in the template
    # The default experiment's artifacts go where this store's own would, not the template's directory
    assert "scaling-ladder" not in client.get_experiment("0").artifact_location
    # and the store works: a run with a metric, read back
    exp = client.create_experiment("seeded")
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "loss", 2.5, step=3)
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(3, 2.5)]


def test_an_existing_store_is_never_replaced_by_the_template(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    with store_lock(uri):
        MlflowClient(uri).create_experiment("kept")
    with store_lock(uri):
        assert "kept" in [e.name for e in MlflowClient(uri).search_experiments()]


@pytest.mark.parametrize("cache", ["file", "missing-parent-file"])
def test_without_a_usable_cache_mlflow_builds_the_store_as_before(tmp_path: Path, monkeypatch, cache) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker if cache == "file" else blocker / "sub"))
    assert empty_schema_template() is None
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    with store_lock(uri):
        MlflowClient(uri).create_experiment("works")


def test_an_error_building_the_template_falls_back_to_mlflow_and_leaves_no_temporary(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    import sqlalchemy.exc
    from mlflow.store.db import utils

    def broken(engine) -> None:
        with engine.connect() as con:  # the temporary exists by now, half-built
            con.exec_driver_sql("CREATE TABLE half (x INTEGER)")
            con.commit()
        raise sqlalchemy.exc.OperationalError("CREATE TABLE", {}, Exception("database is locked"))

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(utils, "_initialize_tables", broken)
    assert empty_schema_template() is None
    assert list((tmp_path / "cache" / "scaling-ladder").iterdir()) == [
        tmp_path / "cache" / "scaling-ladder" / f"mlflow-{mlflow.__version__}-schema.db.lock"]
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other-cache"))
    monkeypatch.setattr(utils, "_initialize_tables", broken)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    with store_lock(uri):
        assert not (tmp_path / "store" / "mlflow.db").exists()  # not seeded: MLflow builds it
    monkeypatch.undo()
    with store_lock(uri):
        MlflowClient(uri).create_experiment("works")


def test_building_the_template_leaves_other_files_in_the_cache_alone(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "scaling-ladder"
    cache.mkdir(parents=True)
    name = f"mlflow-{mlflow.__version__}-schema.db"
    # another process's temporary (pid 1 is always alive), an older version's template, a user's file
    foreign = {cache / f".{name}.tmp1": b"building", cache / "mlflow-0.0.1-schema.db": b"old",
               cache / "notes.txt": b"mine"}
    for path, data in foreign.items():
        path.write_bytes(data)
    assert empty_schema_template() == cache / name
    assert {path: path.read_bytes() for path in foreign} == foreign
    assert sorted(p.name for p in cache.iterdir()) == sorted([*(p.name for p in foreign), name, name + ".lock"])


def test_a_failed_seed_removes_only_its_own_temporary_beside_the_store(tmp_path: Path, monkeypatch) -> None:
    import rungs.data.atomic as atomic

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    # a user's other store, another process's temporary of this store (pid 1 is always alive), a note
    foreign = {store_dir / "other.db": b"theirs", store_dir / ".mlflow.db.tmp1": b"busy", store_dir / "notes.txt": b"x"}
    for path, data in foreign.items():
        path.write_bytes(data)
    assert empty_schema_template() is not None  # built before the disk fills
    real_replace = os.replace

    def full_disk(src, dst):  # the copy is written, then its rename fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", full_disk)
    with pytest.raises(OSError, match="disk full"):
        with store_lock(f"sqlite:///{store_dir / 'mlflow.db'}"):
            pass
    monkeypatch.setattr(atomic.os, "replace", real_replace)
    assert {path: path.read_bytes() for path in foreign} == foreign
    assert sorted(p.name for p in store_dir.iterdir()) == sorted([*(p.name for p in foreign), "mlflow.db.lock"])


def test_artifacts_of_a_server_created_experiment_land_where_the_server_keeps_them(tmp_path: Path) -> None:
    # `ladder sweep run` creates its experiment through the tracking server (artifact root
    # mlflow-artifacts:/...); `ladder fit --experiment` then logs to the same SQLite file directly.
    from rungs.tracking import log_artifact

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("sweep-x", artifact_location="mlflow-artifacts:/7")
    run_id = client.create_run(exp_id).info.run_id
    src = tmp_path / "fit.json"
    src.write_text("{}")
    log_artifact(client, uri, run_id, src)
    assert (tmp_path / "mlartifacts" / "7" / run_id / "artifacts" / "fit.json").read_text() == "{}"


def test_steps_a_resumed_job_runs_again_are_stored_once(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(uri, "resume", tmp_path / "run", run_name="r", tags={}, params={})
    for step in range(1, 6):  # flushed ahead of a checkpoint at step 3, then killed
        first.log_metrics({"loss": float(step), "bpb/code": 1.0} if step == 4 else {"loss": float(step)}, step=step)
    first.flush()
    again = Tracker(uri, "resume", tmp_path / "run", run_name="r", tags={}, params={})  # resumed from step 3
    assert again.run_id == first.run_id
    for step in range(4, 9):
        again.log_metrics({"loss": 10.0 + step, "bpb/code": 2.0}, step=step)
    again.finish()
    client = MlflowClient(uri)
    loss = sorted((m.step, m.value) for m in client.get_metric_history(first.run_id, "loss"))
    assert [s for s, _ in loss] == list(range(1, 9))
    assert dict(loss)[5] == 5.0 and dict(loss)[6] == 16.0  # the stored value stays; new steps are added
    assert sorted(m.step for m in client.get_metric_history(first.run_id, "bpb/code")) == [4, 5, 6, 7, 8]


def test_failing_finish_with_the_store_gone_returns_promptly_and_raises_nothing(tmp_path: Path, caplog) -> None:
    import threading

    from tests.rungs.parallel.spawn import free_port

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "gone", tmp_path / "run", run_name="r", tags={},
                      params={})
    tracker.log_metrics({"loss": 1.0}, step=1)
    # The store behind the run goes away (a server on a full disk, a dead host): nothing listens there.
    tracker.client = MlflowClient(f"http://127.0.0.1:{free_port()}")
    done = threading.Event()
    errors = []

    def finish():
        try:
            tracker.finish(status="FAILED", failing=True)
        except BaseException as err:  # noqa: BLE001 (the assertion below reports it)
            errors.append(err)
        done.set()

    threading.Thread(target=finish, daemon=True).start()
    # MLflow's default retries take minutes against a dead server; bounded, it is one refused connection.
    assert done.wait(timeout=120)
    assert not errors and "could not mark MLflow run" in caplog.text


def test_a_finished_job_whose_run_was_left_running_closes_it_on_rerun(tmp_path: Path) -> None:
    from rungs.train import train
    from tests.rungs.train_helpers import tiny_config

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny_config(max_steps=2, tracking_uri=uri, experiment_name="left-running")
    res = train(cfg, run_dir=tmp_path / "run", progress=False)
    client = MlflowClient(uri)
    # Killed between writing result.json and closing the run: the run stays RUNNING.
    client.update_run(res.run_id, status="RUNNING")
    again = train(cfg, run_dir=tmp_path / "run", progress=False)
    assert again.run_id == res.run_id and again.losses == res.losses
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["diverged"] == "false"
    assert len(client.get_metric_history(res.run_id, "final_loss")) == 1  # the final metrics are not doubled


def test_a_resume_starts_a_new_run_only_when_the_store_says_the_old_one_is_gone(tmp_path: Path, monkeypatch) -> None:
    """A store that has lost the run (wiped, moved): a new run. A store that fails while answering: the job
    fails (a retry resumes it), rather than splitting one run's metrics over two."""
    from mlflow.exceptions import MlflowException

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = Tracker(uri, "reopen", tmp_path / "run", run_name="r", tags={}, params={})
    (tmp_path / "run" / RUN_ID_FILE).write_text("0" * 32 + "\n")
    lost = Tracker(uri, "reopen", tmp_path / "run", run_name="r", tags={}, params={})
    assert lost.run_id not in (first.run_id, "0" * 32)

    def failing(self, run_id):
        raise MlflowException("database is locked", error_code="INTERNAL_ERROR")

    monkeypatch.setattr(MlflowClient, "get_run", failing)
    with pytest.raises(MlflowException, match="database is locked"):
        Tracker(uri, "reopen", tmp_path / "run", run_name="r", tags={}, params={})
    assert (tmp_path / "run" / RUN_ID_FILE).read_text().strip() == lost.run_id
