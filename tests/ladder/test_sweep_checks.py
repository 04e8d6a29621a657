"""`ladder sweep` checks that need no cluster: a bad spec exits 2 before anything starts, the planned configs
are each trial's own resolution, and a running trial's progress reads as stale once it falls silent. The
sweeps themselves, on a real Ray cluster: tests/ladder/test_orchestrate.py."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ladder.cli import main
from ladder.run.sweep_status import STALE_AFTER_SECONDS, _progress, _run_steps
from sweeps.spec import SWEEPS_DIR


def bad_spec(tmp_path: Path, **changes) -> str:
    """The smoke spec with `changes`, written as bad.yaml."""
    data = yaml.safe_load((SWEEPS_DIR / "smoke.yaml").read_text())
    data.update(changes)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("changes, says", [
    ({"recipe": "no-such-recipe"}, "no recipe named"),
    ({"blocks": [{"name": "b", "rungs": [3], "lr_wd": {"log_lr": {"offsets": []}}}]}, "no points"),
    ({"blocks": [{"name": "b", "rungs": [3], "lr_wd": {"centre": {"lr": -0.01, "weight_decay": 0.1}}}]},
     "greater than 0"),
    ({"blocks": []}, "blocks"),
    ({"overrides": {"no_such_knob": 1}}, "unknown override key"),
])
def test_bad_specs_exit_2_before_anything_starts(tmp_path, capsys, changes, says):
    store = tmp_path / "mlflow.db"
    rc = main(["sweep", "run", bad_spec(tmp_path, **changes), "--tracking-uri", f"sqlite:///{store}", "--json"])
    captured = capsys.readouterr()
    assert rc == 2
    assert says in captured.err and "bad.yaml" in captured.err
    assert captured.out == ""
    assert not store.exists()  # nothing was launched or tracked


@pytest.mark.parametrize("name", ["smoke", "demo", "dropout", "agc_ablation", "nightly"])
def test_planned_configs_equal_resolving_each_trial_alone(name):
    """plan_sweep resolves once per rung and sets the grid knobs; that must equal resolve() per trial."""
    from ladder.plan.resolve import resolve_train_config
    from sweeps.plan import plan_sweep
    from sweeps.keys import trial_key
    from sweeps.spec import load_spec

    spec = load_spec(name)
    planned = plan_sweep(spec)
    for p in planned:
        direct = resolve_train_config(spec.recipe, p.trial.L, dict(p.trial.overrides), max_steps=p.trial.max_steps)
        assert p.config == direct
        assert p.key == trial_key(direct)
    assert len({p.key for p in planned}) == len(planned)


def test_status_progress_marks_a_silent_running_run_as_stale(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    assert _progress(store, run_id, 100) == "starting"
    now_ms = int(time.time() * 1000)
    client.log_metric(run_id, "loss", 3.0, timestamp=now_ms - 10_000, step=7)
    assert re.fullmatch(r"step 7/100, 1[01] s ago", _progress(store, run_id, 100))
    client.log_metric(run_id, "loss", 2.9, timestamp=now_ms - int(STALE_AFTER_SECONDS * 1000) - 60_000, step=8)
    assert _progress(store, run_id, 100).startswith("step 8/100") and "stale" in _progress(store, run_id, 100)


def test_status_counts_the_steps_a_trial_runs_a_cap_above_its_steps_cutting_nothing():
    assert _run_steps({"steps": 763, "max_steps": 5000}) == 763  # "step 400/5000" read as far from done
    assert _run_steps({"steps": 763, "max_steps": 20}) == 20
    assert _run_steps({"steps": 763, "max_steps": None}) == 763 and _run_steps({}) is None


def test_a_trial_too_big_for_this_machine_is_refused_before_the_default_store_is_made(tmp_path, capsys, monkeypatch):
    """Bad input (exit 2) touches nothing: the default runs/mlflow.db and its lock were created, then refused."""
    import os

    monkeypatch.chdir(tmp_path)
    spec = bad_spec(tmp_path, resources={"cpus": (os.cpu_count() or 1) + 1})
    rc = main(["sweep", "run", spec, "--json"])
    captured = capsys.readouterr()
    assert rc == 2 and "cluster has" in captured.err and "CPU" in captured.err
    assert captured.out == ""
    assert not (tmp_path / "runs").exists()
