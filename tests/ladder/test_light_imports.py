"""Planning, fitting, sweep status and trial keying import neither torch nor Ray.

Each command runs in a fresh interpreter whose import system refuses `torch` and `ray` (a meta-path
finder installed before `ladder` is imported): it must still succeed. Training and running a sweep
import them, inside their handlers.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUARD_SECONDS = 1800  # ends a hung run; never a judgement of speed

BLOCKER = textwrap.dedent("""
    import importlib.abc, runpy, sys

    class RefuseHeavy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("torch", "ray"):
                raise ImportError(f"this command must not import {name}")

    sys.meta_path.insert(0, RefuseHeavy())
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "ladder":
        sys.argv = ["ladder", *rest]
        runpy.run_module("ladder", run_name="__main__", alter_sys=True)
    else:
        exec(rest[0])
""")


def _run(tmp_path: Path, *args: str, returncode: int = 0) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-c", BLOCKER, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=GUARD_SECONDS, env=_env())
    assert out.returncode == returncode, out.stderr[-3000:]
    assert "must not import" not in out.stderr
    return out


def _env() -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def test_the_blocker_does_block(tmp_path):
    out = subprocess.run([sys.executable, "-c", BLOCKER, "code", "import torch"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=GUARD_SECONDS, env=_env())
    assert out.returncode != 0 and "must not import torch" in out.stderr


def test_plan_imports_neither_torch_nor_ray(tmp_path):
    plan = json.loads(_run(tmp_path, "ladder", "plan", "cpu-demo", "--json").stdout)
    assert plan["recipe"] == "cpu-demo" and plan["rungs"]


def test_memory_planning_imports_neither_torch_nor_ray(tmp_path):
    """`ladder plan --gpu-memory` (ladder.plan.memory) sizes a GPU layout with arithmetic alone."""
    plan = json.loads(_run(tmp_path, "ladder", "plan", "mai-base-2", "--rungs", "18", "--gpus-per-node", "8",
                           "--gpu-memory", "141GB", "--json").stdout)
    (rung,) = plan["rungs"]
    assert rung["memory"]["total"] > 0 and rung["layout"]["ep"] >= 1


@pytest.mark.parametrize("command", ["power-law", "chinchilla", "hparams"])
def test_fit_help_imports_neither_torch_nor_ray(tmp_path, command):
    assert "usage: ladder fit" in _run(tmp_path, "ladder", "fit", command, "--help").stdout


def test_a_power_law_fit_imports_neither_torch_nor_ray(tmp_path):
    rows = ["train_flops,bpb"] + [f"{c:.6g},{1.2 + 30 * c ** -0.1 * (1 + 0.002 * (-1) ** i):.6f}"
                                  for i, c in enumerate(math.exp(x) for x in range(30, 37))]
    (tmp_path / "ladder.csv").write_text("\n".join(rows) + "\n")
    out = _run(tmp_path, "ladder", "fit", "power-law", "--csv", "ladder.csv", "--x", "train_flops", "--y", "bpb",
               "--bootstrap", "20", "--no-log", "--json")
    assert json.loads(out.stdout)


def test_sweep_status_without_a_store_refuses_importing_neither_torch_nor_ray(tmp_path):
    out = _run(tmp_path, "ladder", "sweep", "status", "smoke", "--json", returncode=2)
    assert out.stdout == "" and "no MLflow store" in out.stderr


def test_a_sweep_plan_imports_neither_torch_nor_ray(tmp_path):
    plan = json.loads(_run(tmp_path, "ladder", "sweep", "plan", "mai_base_2_ladder", "--json").stdout)
    assert plan["trials"] and plan["totals"]["gpu_hours"] > 0


def test_sweep_status_on_a_store_imports_neither_torch_nor_ray(tmp_path):
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(store).create_experiment("sweep-smoke")
    status = json.loads(_run(tmp_path, "ladder", "sweep", "status", "smoke", "--tracking-uri", store, "--json").stdout)
    assert status["counts"] == {"pending": 3}


def test_trial_keying_imports_neither_torch_nor_ray(tmp_path):
    from sweeps.plan import plan_sweep
    from sweeps.spec import load_spec

    expected = [p.key for p in plan_sweep(load_spec("smoke"))]
    code = ("from sweeps.plan import plan_sweep\nfrom sweeps.spec import load_spec\n"
            "print(' '.join(p.key for p in plan_sweep(load_spec('smoke'))))")
    assert _run(tmp_path, "code", code).stdout.split() == expected
