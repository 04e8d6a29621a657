"""MLflow tracking: jobs that start together on a fresh SQLite store all get their run."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from mlflow import MlflowClient

from rungs.tracking import Tracker


def _open_tracker(uri: str, run_dir: str, barrier, results) -> None:
    barrier.wait()  # all processes hit the fresh store at the same moment
    try:
        tracker = Tracker(uri, "race", Path(run_dir), run_name=Path(run_dir).name, tags={"k": "v"},
                          params={"lr": 0.01})
        results.put(("ok", tracker.run_id))
    except Exception as err:  # reported to the parent, which fails the test with it
        results.put(("error", repr(err)))


def test_jobs_starting_together_on_a_fresh_sqlite_store_all_get_runs(tmp_path: Path) -> None:
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
