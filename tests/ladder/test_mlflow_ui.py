"""The documented `mlflow ui` command (docs/sweeps.md) shows every run's files and finds the
experiments marked as model training: checked against the real UI server's REST API."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from ladder.run.tracking_server import free_port, healthy
from rungs.tracking import EXPERIMENT_KIND_TAG, Tracker

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sweeps.md"
START_TIMEOUT_SECONDS = 300.0  # a hang guard only: the server is up in seconds


def documented_command() -> list[str]:
    lines = [line for line in DOCS.read_text().splitlines() if line.startswith("mlflow ui ")]
    assert lines, f"{DOCS} documents no `mlflow ui` command"
    words = shlex.split(lines[-1].split("#")[0])
    assert all(shlex.split(line.split("#")[0]) == words for line in lines), "the page shows two different commands"
    return words


def log_run(uri: str, experiment: str, run_dir: Path) -> str:
    tracker = Tracker(uri, experiment, run_dir, run_name=experiment, tags={"rung": 2}, params={"lr": 0.01})
    (run_dir / "eval.json").write_text(json.dumps({"evals": []}))
    tracker.log_metrics({"bpb/code": 3.1}, step=1)
    tracker.log_artifact(run_dir / "eval.json")
    tracker.finish()
    return tracker.run_id


def get(base: str, route: str, **query: str) -> dict:
    with urllib.request.urlopen(f"{base}{route}?{urllib.parse.urlencode(query)}", timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """runs/mlflow.db under tmp_path with a run logged straight to the file (`ladder train`) and one into
    an experiment a tracking server created (a sweep's: artifacts recorded as mlflow-artifacts:/)."""
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    direct = log_run(uri, "direct", tmp_path / "direct")
    MlflowClient(uri).create_experiment("served", artifact_location="mlflow-artifacts:/7")  # no kind tag
    served = log_run(uri, "served", tmp_path / "served")
    assert (tmp_path / "runs" / "mlartifacts" / "7" / served / "artifacts" / "eval.json").is_file()
    return tmp_path, {"direct": direct, "served": served}


@pytest.mark.slow
def test_the_documented_mlflow_ui_lists_every_run_s_artifacts_and_the_experiments_kind(store) -> None:
    cwd, runs = store
    command = documented_command()
    assert command[:2] == ["mlflow", "ui"]
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # (the GenAI job runner: not used here)
    proc = subprocess.Popen([sys.executable, "-m", *command, "--host", "127.0.0.1", "--port", str(port)], cwd=cwd,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while not healthy(base):
            assert proc.poll() is None, f"mlflow ui exited with code {proc.returncode}"
            assert time.monotonic() - t0 < START_TIMEOUT_SECONDS, "mlflow ui never became healthy"
            time.sleep(0.2)
        for experiment, run_id in runs.items():
            exp = get(base, "/api/2.0/mlflow/experiments/get-by-name", experiment_name=experiment)["experiment"]
            tags = {t["key"]: t["value"] for t in exp.get("tags", [])}
            assert tags.get(EXPERIMENT_KIND_TAG) == "custom_model_development", experiment
            listed = get(base, "/api/2.0/mlflow/artifacts/list", run_id=run_id)
            assert [f["path"] for f in listed.get("files", [])] == ["eval.json"], (experiment, listed)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
