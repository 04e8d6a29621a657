"""The local MLflow tracking server: concurrent writers lose nothing, and a killed driver leaves no server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from mlflow.tracking import MlflowClient

from ladder.run.tracking_server import TrackingServer, healthy

GUARD_SECONDS = 1800  # ends a hung test; far above any plausible run, never a judgement of speed
WRITERS = 4
STEPS = 1000
METRICS = ("loss", "bpb", "grad_norm")  # 3,000 points per writer

WRITER = textwrap.dedent("""
    import sys, time
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    uri, exp_id, writer, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    client = MlflowClient(uri)
    run = client.create_run(exp_id, tags={"writer": str(writer)})
    batch = []
    for step in range(steps):
        for i, name in enumerate(("loss", "bpb", "grad_norm")):
            batch.append(Metric(name, writer * 1e6 + step * 10 + i, int(time.time() * 1000), step))
        if len(batch) >= 60:  # a trainer's log interval's worth of points per request
            client.log_batch(run.info.run_id, metrics=batch); batch = []
    if batch:
        client.log_batch(run.info.run_id, metrics=batch)
    client.set_terminated(run.info.run_id)
    print(run.info.run_id)
""")


@pytest.mark.slow
def test_concurrent_writers_through_the_server_lose_no_point(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with TrackingServer(store) as uri:
        exp_id = MlflowClient(uri).create_experiment("concurrent")
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, uri, exp_id, str(w), str(STEPS)],
                                  stdout=subprocess.PIPE, text=True) for w in range(WRITERS)]
        run_ids = {}
        for w, p in enumerate(procs):
            out, _ = p.communicate(timeout=GUARD_SECONDS)
            assert p.returncode == 0
            run_ids[w] = out.strip().splitlines()[-1]
    # Read back from the SQLite file itself, server gone: every point is on disk.
    client = MlflowClient(store)
    for w, run_id in run_ids.items():
        for i, name in enumerate(METRICS):
            history = client.get_metric_history(run_id, name)
            assert len(history) == STEPS
            assert sorted((m.step, m.value) for m in history) == [(s, w * 1e6 + s * 10 + i) for s in range(STEPS)]
        assert client.get_run(run_id).info.status == "FINISHED"


DRIVER = textwrap.dedent("""
    import sys, time
    from ladder.run.tracking_server import TrackingServer
    server = TrackingServer(sys.argv[1])
    print(server.start(), flush=True)
    time.sleep(600)
""")


def start_together(jobs: int, start) -> list[str]:
    """Run `start(j)` for j < jobs in threads released at one moment; the failures, as text."""
    import threading

    gate, failed = threading.Barrier(jobs), []

    def run(j: int) -> None:
        gate.wait()
        try:
            start(j)
        except Exception as err:  # any failure is what these tests count
            failed.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=run, args=(j,)) for j in range(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failed


def test_jobs_tagging_one_experiment_together_through_the_server_all_start(tmp_path):
    """Six jobs that find one untagged experiment and tag it at the same moment (`ladder train` jobs on an
    experiment an older version made; trials before their driver tagged it): through the server two inserts of
    the tag race and one fails on the store's unique key, which failed the job's start; it is the tag already
    there, and every job goes on."""
    from rungs.tracking import EXPERIMENT_KIND_TAG, mark_model_training

    with TrackingServer(f"sqlite:///{tmp_path / 'mlflow.db'}") as uri:
        client = MlflowClient(uri)
        for i in range(8):  # without the fix about half of the experiments lost a job (10 of 20 measured)
            experiment = client.get_experiment(client.create_experiment(f"older-{i}"))
            assert start_together(6, lambda j, exp=experiment: mark_model_training(MlflowClient(uri), exp)) == []
            assert client.get_experiment(experiment.experiment_id).tags[EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_jobs_starting_one_new_experiment_together_through_the_server_share_it(tmp_path):
    """Four jobs that start a new experiment at the same moment through a server (the store lock serialises a
    SQLite file's users, not a server's clients): one creates it, the others find it created (without the fix
    17 of 32 such starts failed, RESOURCE_ALREADY_EXISTS), and all four runs are in the one experiment."""
    from rungs.tracking import EXPERIMENT_KIND_TAG, Tracker

    with TrackingServer(f"sqlite:///{tmp_path / 'mlflow.db'}") as uri:
        client = MlflowClient(uri)
        for i in range(4):
            def start(j: int, name: str = f"new-{i}") -> None:
                Tracker(uri, name, tmp_path / name / str(j), run_name=f"job-{j}", tags={}, params={"lr": 0.1})

            assert start_together(4, start) == []
            experiment = client.get_experiment_by_name(f"new-{i}")
            assert experiment.tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
            assert len(client.search_runs([experiment.experiment_id])) == 4


@pytest.mark.slow
def test_server_dies_with_a_sigkilled_driver(tmp_path):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, f"sqlite:///{tmp_path / 'mlflow.db'}"],
                              stdout=subprocess.PIPE, text=True)
    uri = driver.stdout.readline().strip()
    assert healthy(uri)
    os.kill(driver.pid, signal.SIGKILL)
    deadline = time.monotonic() + GUARD_SECONDS
    while healthy(uri) and time.monotonic() < deadline:
        time.sleep(0.5)
    driver.wait()
    assert not healthy(uri)


def _listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(ip, port) of every listening TCP socket of a process and its descendants."""
    import psutil

    root = psutil.Process(pid)
    out = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            out |= {(c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture(scope="module")
def one_process_server(tmp_path_factory):
    """The default (one-process) server on a store of its own, shared by the tests that only talk to it
    while it runs: a server start and a new store cost seconds each on a busy machine."""
    server = TrackingServer(f"sqlite:///{tmp_path_factory.mktemp('served') / 'mlflow.db'}")
    with server as uri:
        yield server, uri


@pytest.mark.parametrize("via_cli", [False, True], ids=["one-process", "mlflow-cli"])
def test_server_listens_on_loopback_only(tmp_path, request, via_cli):
    if via_cli:
        server = TrackingServer(f"sqlite:///{tmp_path / 'mlflow.db'}", via_cli=True)
        with server as uri:
            _check_listens_on_loopback_only(server, uri)
    else:
        _check_listens_on_loopback_only(*request.getfixturevalue("one_process_server"))


def _check_listens_on_loopback_only(server: TrackingServer, uri: str) -> None:
    listening = _listening_addresses(server._proc.pid)
    assert listening, "the server listens on no TCP socket"
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
    assert ("127.0.0.1", server.port) in listening and uri == f"http://127.0.0.1:{server.port}"
    # MLflow's own guards stay on: a request naming another host (DNS rebinding) or coming from
    # another origin (a web page's script) is refused, as `mlflow server` refuses it
    assert _search_status(server.port, host=f"127.0.0.1:{server.port}") == 200
    assert _search_status(server.port, host="evil.example.com") == 403
    assert _search_status(server.port, host=f"127.0.0.1:{server.port}", origin="http://evil.example.com") == 403


def _search_status(port: int, *, host: str, origin: str | None = None) -> int:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=GUARD_SECONDS)
    headers = {"Host": host, "Content-Type": "application/json", **({"Origin": origin} if origin else {})}
    conn.request("POST", "/api/2.0/mlflow/experiments/search", body=json.dumps({"max_results": 1}), headers=headers)
    try:
        return conn.getresponse().status
    finally:
        conn.close()


def test_one_process_serves_the_store_and_its_artifacts_as_the_mlflow_cli_would(tmp_path, one_process_server):
    import psutil

    server, uri = one_process_server
    payload = tmp_path / "eval.json"
    payload.write_text('{"bpb": 1.25}')
    (served,) = psutil.Process(server._proc.pid).children()  # the watchdog's one child
    assert served.children() == []  # no second (uvicorn) process: the store opened once
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("artifacts"))
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")  # --serve-artifacts
    client.log_artifact(run.info.run_id, str(payload))
    client.log_metric(run.info.run_id, "bpb", 1.25, step=3)
    fetched = client.download_artifacts(run.info.run_id, "eval.json", str(tmp_path))
    assert open(fetched).read() == payload.read_text()
    # where the CLI's --artifacts-destination puts it, beside the database; the metric in that database
    assert [p.read_text() for p in server.artifacts_dir.rglob("eval.json")] == [payload.read_text()]
    assert MlflowClient(server.store_uri).get_metric_history(run.info.run_id, "bpb")[0].step == 3
    assert "in one process" in server._log_path.read_text()
