"""cluster/ configs parse, and every GPU a worker has is declared to Ray and to Kubernetes alike."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((CLUSTER / name).read_text()) if d]


def test_raycluster_worker_gpus_are_declared_to_ray_and_to_kubernetes():
    cluster = next(d for d in _docs("kuberay/raycluster-gb200.yaml") if d["kind"] == "RayCluster")
    assert cluster["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no trial on the head
    for group in cluster["spec"]["workerGroupSpecs"]:
        ray_gpus = int(group["rayStartParams"]["num-gpus"])
        custom = json.loads(json.loads(group["rayStartParams"]["resources"]))
        container = group["template"]["spec"]["containers"][0]
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == ray_gpus == custom["gb200"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == container["resources"]["limits"]["nvidia.com/gpu"]
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/runs"}  # shared run directories


def test_launcher_declares_gpus_and_keeps_trials_off_the_head():
    cfg = _docs("ray-gb200.yaml")[0]
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["resources"]["CPU"] == 0
    gpu = types["gb200"]
    assert gpu["resources"]["GPU"] == gpu["resources"]["gb200"] == 4
    assert any("--num-gpus=4" in c for c in cfg["worker_start_ray_commands"])


def test_nightly_job_runs_the_regression_against_the_cluster():
    job = _docs("kuberay/rayjob-nightly.yaml")[0]
    assert job["kind"] == "RayJob" and job["spec"]["entrypoint"].startswith("ladder nightly")
    assert "--address auto" in job["spec"]["entrypoint"]
    cron = next(d for d in _docs("kuberay/cronjob-nightly.yaml") if d["kind"] == "CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"


def test_mlflow_server_uses_postgres_and_serves_artifacts():
    deploy = next(d for d in _docs("mlflow/mlflow-server.yaml") if d["kind"] == "Deployment")
    args = " ".join(deploy["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "postgresql://" in args and "--serve-artifacts" in args
    assert any(d["kind"] == "StatefulSet" for d in _docs("mlflow/postgres.yaml"))
