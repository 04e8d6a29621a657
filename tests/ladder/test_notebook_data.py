"""export_fixture and load_runs: with a sweep spec, only the runs of its current plan are kept."""

from __future__ import annotations

import pandas as pd
import pytest

from ladder.errors import LadderInputError
from ladder.analysis.notebook_data import FIXTURES, export_fixture, load_runs
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec


def _log_runs(uri: str, tmp_path, trial_keys: list[str]) -> None:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment("sweep-demo", artifact_location=str(tmp_path / "artifacts"))
    for i, key in enumerate(trial_keys):
        run = client.create_run(exp, tags={"rung": str(2 + i), "diverged": "false", "trial_key": key})
        client.log_batch(run.info.run_id, params=[Param("lr", "0.003"), Param("weight_decay", "0.1")],
                         metrics=[Metric("total_train_flops", 1e12 * (i + 1), 0, 1),
                                  Metric("final_bpb/code", 3.0 - 0.1 * i, 0, 1)])
        client.set_terminated(run.info.run_id, "FINISHED")


def test_export_keeps_the_current_plan_only(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    current = [p.key for p in plan_sweep(load_spec("demo"))][:2]
    _log_runs(uri, tmp_path, [*current, "stale-recipe-key"])

    everything = pd.read_csv(export_fixture("sweep-demo", "all.csv", tracking_uri=uri, out_dir=tmp_path))
    kept = pd.read_csv(export_fixture("sweep-demo", "demo.csv", tracking_uri=uri, spec="demo", out_dir=tmp_path))
    assert len(everything) == 3
    assert len(kept) == 2 and sorted(kept["bpb_code"]) == [2.9, 3.0]

    with pytest.raises(LadderInputError, match="current plan"):
        export_fixture("sweep-demo", "none.csv", tracking_uri=uri, spec="nightly", out_dir=tmp_path)


def test_notebooks_read_the_current_plan_or_fall_back_to_the_fixture(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    current = [p.key for p in plan_sweep(load_spec("demo"))][:2]
    _log_runs(uri, tmp_path, [*current, "stale-recipe-key"])

    monkeypatch.setenv("LADDER_NOTEBOOK_SOURCE", "auto")
    runs, where = load_runs("sweep-demo", "demo_runs.csv", spec="demo", tracking_uri=uri)
    assert len(runs) == 2 and "current plan of sweep" in where
    everything, _ = load_runs("sweep-demo", "demo_runs.csv", tracking_uri=uri)
    assert len(everything) == 3

    # An experiment holding only other recipe versions' runs: the fixture in auto mode, an error in mlflow mode.
    fixture, where = load_runs("sweep-demo", "demo_runs.csv", spec="nightly", tracking_uri=uri)
    assert where.startswith("fixture") and len(fixture) == len(pd.read_csv(FIXTURES / "demo_runs.csv"))
    monkeypatch.setenv("LADDER_NOTEBOOK_SOURCE", "mlflow")
    with pytest.raises(LadderInputError, match="current plan"):
        load_runs("sweep-demo", "demo_runs.csv", spec="nightly", tracking_uri=uri)
