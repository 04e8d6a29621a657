"""A lost, empty, mistyped, damaged or locked MLflow store, and run directories out of step with it.

Each is refused before anything is written, in one line that says what is wrong and the way out;
`--new-store` creates a store explicitly and `--reregister` records finished results kept in the
run directories into a store that lost them. All in-process and without Ray: every refusal here
happens before a cluster would start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import ladder.run.stores as stores
from ladder.cli import main
from sweeps.plan import plan_sweep
from ladder.run.sweep_runs import find_runs, trial_state
from sweeps.spec import load_spec


def _refused(capsys, argv: list[str], *says: str) -> str:
    capsys.readouterr()  # drop what setting up the store printed (MLflow logs its migrations)
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert captured.out == "" and "Traceback" not in captured.err
    line, = captured.err.strip().splitlines()
    for word in says:
        assert word in line, line
    return line


@pytest.fixture(scope="module")
def store_template(tmp_path_factory) -> Path:
    """An MLflow SQLite store with an experiment and a few runs with metric histories, made once:
    its schema migrations and 150 metric writes cost ~6 s of CPU, and each test damages a copy."""
    path = tmp_path_factory.mktemp("store_template") / "mlflow.db"
    client = MlflowClient(f"sqlite:///{path}")
    exp = client.create_experiment("other")
    for _ in range(3):
        run_id = client.create_run(exp).info.run_id
        for step in range(50):
            client.log_metric(run_id, "loss", 3.0 - step / 100, step=step)
    return path


def _real_store(template: Path, path: Path) -> str:
    """A copy of the template store at `path`; its URI."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("command", ["run", "status"])
def test_a_missing_named_store_is_refused_not_created(tmp_path, capsys, command):
    db = tmp_path / "mlfow.db"  # a typo of mlflow.db
    line = _refused(capsys, ["sweep", command, "smoke", "--tracking-uri", f"sqlite:///{db}"],
                    "no MLflow store", str(db), "--new-store")
    assert "pending" in line  # says why creating it silently would mislead
    assert not db.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["run", "status"])
def test_a_missing_store_directory_and_an_empty_uri_are_refused(tmp_path, capsys, command):
    _refused(capsys, ["sweep", command, "smoke", "--tracking-uri", str(tmp_path / "mlrns")], "does not exist",
             "--new-store")
    assert not (tmp_path / "mlrns").exists()
    _refused(capsys, ["sweep", command, "smoke", "--tracking-uri", ""], "empty tracking URI")
    _refused(capsys, ["sweep", command, "smoke", "--tracking-uri", "sqlite:///"], "no database file")
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("argv", [
    ["sweep", "status", "smoke"],
    ["fit", "power-law", "--experiment", "sweep-smoke"],
    ["fit", "hparams", "--experiment", "sweep-smoke"],
    ["extrapolate", "cpu-demo", "--rung", "9", "--experiment", "sweep-smoke"],
], ids=["sweep-status", "fit-power-law", "fit-hparams", "extrapolate"])
def test_reading_the_default_store_before_anything_ran_is_refused_and_creates_nothing(tmp_path, capsys, argv):
    """Not every trial "pending", not an empty runs/mlflow.db: the store is not there."""
    _refused(capsys, argv, "no MLflow store", "runs/mlflow.db", "--tracking-uri")
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("argv", [
    ["fit", "power-law", "--experiment", "sweep-smoke"],
    ["extrapolate", "cpu-demo", "--rung", "9", "--experiment", "sweep-smoke"],
], ids=["fit", "extrapolate"])
def test_fits_refuse_a_missing_named_store_as_a_sweep_does(tmp_path, capsys, argv):
    db = tmp_path / "mlfow.db"
    _refused(capsys, [*argv, "--tracking-uri", f"sqlite:///{db}"], "no MLflow store", str(db))
    _refused(capsys, [*argv, "--tracking-uri", str(tmp_path / "mlrns")], "does not exist")
    assert sorted(os.listdir(tmp_path)) == []


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


HANG_GUARD_SECONDS = 60  # "well under a minute": MLflow's own retries took over 120 s


@pytest.mark.parametrize("argv", [
    ["sweep", "status", "smoke"],
    ["sweep", "run", "smoke"],
    ["fit", "power-law", "--experiment", "sweep-smoke"],
    ["extrapolate", "cpu-demo", "--rung", "9", "--experiment", "sweep-smoke"],
], ids=["sweep-status", "sweep-run", "fit", "extrapolate"])
def test_a_tracking_server_that_is_not_there_fails_at_once_in_one_line(tmp_path, capsys, argv):
    import time

    uri = f"http://127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    _refused(capsys, [*argv, "--tracking-uri", uri], "does not answer", uri)
    assert time.monotonic() - t0 < HANG_GUARD_SECONDS
    assert sorted(os.listdir(tmp_path)) == []


def test_a_tracking_server_that_accepts_but_never_answers_is_called_down_at_the_deadline(capsys, monkeypatch):
    import socket
    import time

    import ladder.run.stores as stores

    assert stores.SERVER_WAIT_SECONDS <= 10  # the promise: a dead server fails within 10 s
    monkeypatch.setattr(stores, "SERVER_WAIT_SECONDS", 0.5)
    with socket.socket() as mute:  # listens (the kernel completes the connection), never replies
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        uri = f"http://127.0.0.1:{mute.getsockname()[1]}"
        t0 = time.monotonic()
        _refused(capsys, ["sweep", "status", "smoke", "--tracking-uri", uri], "does not answer", "0.5 s")
        assert time.monotonic() - t0 < HANG_GUARD_SECONDS


def test_runs_recorded_by_older_code_are_found(tmp_path, capsys, store_template):
    """A store written before one identity: each trial's run carries the trial key it always had, a
    config_key tag and a run name from the old checkpoint key. Status finds every trial finished."""
    from rungs.config import parse_config

    uri = _real_store(store_template, tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("sweep-smoke")
    for p in plan_sweep(load_spec("smoke")):
        cfg = parse_config(p.config)
        run = client.create_run(exp, run_name=f"{cfg.recipe}-L{cfg.L}-{cfg.legacy_key()[:8]}",
                                tags={"trial_key": p.key, "config_key": cfg.legacy_key(), "sweep": "smoke",
                                      "attempt": "1", "outcome": "finished", "diverged": "false"})
        client.set_terminated(run.info.run_id, "FINISHED")
    assert main(["sweep", "status", "smoke", "--tracking-uri", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"finished": 3}


@pytest.mark.parametrize("damage, says", [
    (lambda db: os.truncate(db, db.stat().st_size // 2), "truncated"),
    (lambda db: os.truncate(db, 8192), "truncated"),
    (lambda db: os.truncate(db, 40), "header"),
    (lambda db: os.truncate(db, 0), "empty"),
    (lambda db: db.write_bytes(b"not a database at all\n" * 100), "header"),
])
@pytest.mark.parametrize("command", ["run", "status"])
def test_a_damaged_store_is_one_line_not_a_traceback(tmp_path, capsys, store_template, damage, says, command):
    db = tmp_path / "mlflow.db"
    uri = _real_store(store_template, db)
    damage(db)
    before = db.read_bytes()
    _refused(capsys, ["sweep", command, "smoke", "--tracking-uri", uri], str(db), "damaged", says, "--new-store")
    assert db.read_bytes() == before  # refused before anything touched it


def test_an_sqlite_file_that_is_not_an_mlflow_store_is_refused(tmp_path, capsys):
    import sqlite3

    db = tmp_path / "notes.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE notes (text TEXT)")
    _refused(capsys, ["sweep", "status", "smoke", "--tracking-uri", f"sqlite:///{db}"], "not an MLflow store")


def test_a_store_locked_by_another_process_is_a_clear_error(tmp_path, capsys, monkeypatch, store_template):
    db = tmp_path / "mlflow.db"
    uri = _real_store(store_template, db)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys\n"
         f"con = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
         "con.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\nsys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.setattr(stores, "LOCK_WAIT_SECONDS", 0.5)  # the holder never lets go
        for command in ("run", "status"):
            _refused(capsys, ["sweep", command, "smoke", "--tracking-uri", uri], "locked by another process")
    finally:
        holder.stdin.close()
        holder.wait()
    assert main(["sweep", "status", "smoke", "--tracking-uri", uri, "--json"]) == 0  # and fine once released


def _finished_run_dirs(root: Path, spec_name: str = "smoke", *, lost_run_id: str = "0" * 32) -> list:
    """Run directories as finished jobs leave them (config.json, result.json in the job's own format),
    naming an MLflow run that the store does not have."""
    from rungs.train import RESULT_FILE, TrainResult

    planned = plan_sweep(load_spec(spec_name))
    for i, p in enumerate(planned):
        run_dir = root / "sweeps" / spec_name / p.key
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps(p.config))
        (run_dir / "attempts").write_text("1\n")
        (run_dir / "mlflow_run_id").write_text(lost_run_id + "\n")
        steps = p.config["max_steps"]
        result = TrainResult(run_id=lost_run_id, final_loss=2.5 + i / 10, bpb={"code": 1.5 + i / 10, "prose": 1.7},
                             tokens=1000 * steps, train_flops=1e9, wall_seconds=30.0, tokens_per_second=100.0,
                             mfu=0.01, diverged=False, steps=steps, losses=[3.0 - s / 100 for s in range(steps)],
                             run_dir=str(run_dir))
        (run_dir / RESULT_FILE).write_text(json.dumps(result.to_json()))
    return planned


def test_finished_results_missing_from_a_replaced_store_are_refused_then_reregistered(tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    planned = _finished_run_dirs(tmp_path)
    MlflowClient(uri).search_experiments()  # a fresh, empty store where the old one was

    line = _refused(capsys, ["sweep", "run", "smoke", "--tracking-uri", uri], "3 trial(s) finished earlier",
                    "--reregister", "move")
    assert str(tmp_path / "sweeps" / "smoke") in line
    assert find_runs(uri, "sweep-smoke") == {}  # nothing written

    assert main(["sweep", "run", "smoke", "--tracking-uri", uri, "--reregister", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["trials"], summary["skipped"], summary["failed"]) == (3, 3, 0)  # nothing retrained
    records = find_runs(uri, "sweep-smoke")
    client = MlflowClient(uri)
    for p in planned:
        (run,) = records[p.key]
        assert trial_state(records[p.key]).state == "finished"
        assert run.tags["reregistered_from"] == "0" * 32 and run.tags["sweep"] == "smoke"
        assert run.tags["outcome"] == "finished" and run.tags["diverged"] == "false" and "bpb_mean" in run.tags
        steps = p.config["max_steps"]
        assert [m.step for m in client.get_metric_history(run.run_id, "loss")] == list(range(1, steps + 1))
        data = client.get_run(run.run_id).data
        assert data.metrics["final_bpb/code"] > 1.4 and data.params["lr"] == str(p.config["lr"])
        run_dir = tmp_path / "sweeps" / "smoke" / p.key
        assert json.loads((run_dir / "result.json").read_text())["run_id"] == run.run_id
        assert (run_dir / "mlflow_run_id").read_text().strip() == run.run_id

    assert main(["sweep", "status", "smoke", "--tracking-uri", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"finished": 3}
    shutil.rmtree(tmp_path / "sweeps")


RACER = """
import os, sys, time
import mlflow.store.tracking.sqlalchemy_store  # the heavy imports before the start line, so all four race
from mlflow.tracking import MlflowClient
from ladder.run.sweep_runs import find_runs
uri, ready, go = sys.argv[1:4]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
print(len(find_runs(uri, "sweep-smoke")))
"""


def test_drivers_reading_a_fresh_store_at_once_do_not_race_creating_its_schema(tmp_path):
    """`ladder sweep run` twice at once on a store that does not exist yet: each driver's first read
    creates MLflow's schema; without the store lock they collide ("table ... already exists",
    alembic "expected to match one row")."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    racers = []
    for i in range(4):
        racers.append(subprocess.Popen([sys.executable, "-c", RACER, uri, str(tmp_path / f"ready{i}"),
                                        str(tmp_path / "go")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True))
    guard = 1800  # imports take seconds; this only ends a hang
    import time

    deadline = time.monotonic() + guard
    while not all((tmp_path / f"ready{i}").exists() for i in range(4)) and time.monotonic() < deadline:
        assert all(r.poll() is None for r in racers), [r.communicate() for r in racers]
        time.sleep(0.05)
    (tmp_path / "go").touch()  # all four hit the fresh file together
    for r in racers:
        out, err = r.communicate(timeout=guard)
        assert r.returncode == 0, err[-2000:]
        assert out.strip() == "0"
