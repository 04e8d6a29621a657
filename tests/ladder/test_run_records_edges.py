"""What a training job records in MLflow is what the fits read back: one run per trial key, infinite
values refused rather than read as 1.8e308, a mean BPB only over every domain, hash params as text, a
`diverged` tag in any case, and the params of a run reopened after a kill."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from ladder.errors import LadderInputError
from ladder.run.mlflow_runs import check_domain_bpb, fit_table, long_by_domain, read_runs
from ladder.run.sweep_runs import find_runs, trial_state
from rungs.tracking import RUN_ID_FILE, Tracker


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs seconds of CPU); each test its own experiment."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('records') / 'mlflow.db'}"
    MlflowClient(uri).search_experiments(max_results=1)
    return uri


def _run(uri: str, experiment: str, *, tags: dict, metrics: dict | None = None, params: dict | None = None,
         status: str = "FINISHED", start_ms: int | None = None) -> str:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    run_id = client.create_run(exp_id, start_time=start_ms, tags=tags).info.run_id
    client.log_batch(run_id, metrics=[Metric(k, v, 0, 3) for k, v in (metrics or {}).items()])
    for k, v in (params or {}).items():
        client.log_param(run_id, k, v)
    if status != "RUNNING":
        client.set_terminated(run_id, status=status)
    return run_id


BPB = {"final_bpb/code": 1.1, "final_bpb/web": 1.3, "total_train_flops": 1e12}


def test_a_trial_key_trained_twice_is_read_once_as_its_latest_finished_run(store: str) -> None:
    first = _run(store, "twice", tags={"trial_key": "k1", "rung": "2"}, metrics=BPB, start_ms=1_000)
    again = _run(store, "twice", tags={"trial_key": "k1", "rung": "2"}, metrics=BPB, start_ms=2_000)  # --fresh
    _run(store, "twice", tags={"trial_key": "k1", "rung": "2"}, status="FAILED", start_ms=3_000)
    other = _run(store, "twice", tags={"trial_key": "k2", "rung": "3"}, metrics=BPB, start_ms=1_500)
    keyless = _run(store, "twice", tags={"rung": "4"}, metrics=BPB, start_ms=500)  # logged by another tool

    runs = read_runs("twice", store)
    assert sorted(runs["run_id"]) == sorted([again, other, keyless])
    assert len(long_by_domain(fit_table(runs))) == 3 * 2  # each run once per domain
    everything = read_runs("twice", store, finished_only=False)
    assert first not in set(everything["run_id"]) and again in set(everything["run_id"])
    assert trial_state(find_runs(store, "twice")["k1"]).run_id == again  # the run `sweep status` shows


def test_an_infinite_bpb_is_read_back_as_infinite_and_refused(store: str) -> None:
    # a SQL store keeps an infinity as the largest float: read as such it would pass as a BPB of 1.8e308
    run_id = _run(store, "infinite", tags={"trial_key": "k"}, metrics=BPB | {"final_bpb/code": float("inf")})
    table = fit_table(read_runs("infinite", store))
    assert table["bpb_code"].iloc[0] == float("inf")
    with pytest.raises(LadderInputError, match=f"not a positive finite BPB.*{run_id}"):
        check_domain_bpb(table)


def test_the_mean_bpb_of_a_run_missing_a_domain_is_empty_not_the_mean_of_the_others() -> None:
    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "metrics.final_bpb/code": [1.0, 1.0, float("nan")],
                         "metrics.final_bpb/web": [2.0, float("nan"), 2.0]})
    table = fit_table(runs)
    assert table["bpb"].iloc[0] == 1.5
    assert table["bpb"].iloc[1:].isna().all()


def test_hash_params_stay_text_where_their_hex_digits_read_as_numbers(store: str) -> None:
    _run(store, "hashes", tags={"trial_key": "k"}, metrics=BPB,
         params={"trial_key": "0123456789012345", "data_key": "12345678e9012345", "note": "1e999", "lr": "0.002",
                 "steps": "300"})
    runs = read_runs("hashes", store)
    row = runs.iloc[0]
    assert row["params.trial_key"] == "0123456789012345" and row["params.data_key"] == "12345678e9012345"
    assert row["params.note"] == "1e999"
    assert row["params.lr"] == 0.002 and row["params.steps"] == 300


def test_a_diverged_tag_in_another_case_is_still_a_divergence(store: str) -> None:
    _run(store, "shouting", tags={"trial_key": "k", "diverged": "True"}, metrics=BPB)
    table = fit_table(read_runs("shouting", store))
    assert bool(table["diverged"].iloc[0]) and table["bpb"].isna().all()
    assert trial_state(find_runs(store, "shouting")["k"]).state == "diverged"


def test_a_run_reopened_after_a_kill_while_logging_params_gets_the_missing_ones(store: str, tmp_path: Path) -> None:
    # killed after its run id was recorded, before its params were logged (one of them was)
    client = MlflowClient(store)
    exp_id = client.create_experiment("reopened")
    run_id = client.create_run(exp_id, tags={"trial_key": "k"}).info.run_id
    client.log_param(run_id, "lr", "0.01")
    (tmp_path / RUN_ID_FILE).write_text(run_id + "\n")
    tracker = Tracker(store, "reopened", tmp_path, run_name="r", tags={"trial_key": "k"},
                      params={"lr": 0.01, "steps": 300, "sources": {"code": {"epochs": 1.5}}})
    assert tracker.run_id == run_id
    tracker.log_metrics(BPB, step=3)
    tracker.finish()
    row = read_runs("reopened", store).iloc[0]
    assert (row["params.lr"], row["params.steps"], row["params.sources.code.epochs"]) == (0.01, 300, 1.5)


def test_rung_and_seed_tags_read_back_as_numbers_as_a_csv_of_the_same_runs_gives_them():
    """Tags are text: rungs "9" and "10" sorted as text put L10 first, and the MLflow table disagreed with a
    CSV export of itself. Whole numbers become int64; anything else (a named rung, a gap) stays as it was."""
    import pandas as pd

    from ladder.run.mlflow_runs import fit_table

    runs = pd.DataFrame({"tags.rung": ["10", "9"], "tags.coord.seed": ["0", "1"], "metrics.final_bpb/code": [1.0, 1.1]})
    table = fit_table(runs)
    assert table["rung"].tolist() == [10, 9] and str(table["rung"].dtype) == "int64"
    assert sorted(table["rung"]) == [9, 10] and table["seed"].tolist() == [0, 1]
    named = fit_table(runs.assign(**{"tags.rung": ["L10", "9"]}))
    assert named["rung"].tolist() == ["L10", "9"]


def test_the_data_order_seed_is_a_column_where_a_run_set_one_and_the_seed_where_it_did_not(store: str) -> None:
    for seed, data_seed in ((0, "None"), (1, "7"), (2, "None")):
        _run(store, "orders", tags={"rung": "2", "coord.seed": str(seed)}, metrics=BPB,
             params={"seed": str(seed), "data_seed": data_seed})
    table = fit_table(read_runs("orders", store)).sort_values("seed")
    assert table["data_seed"].tolist() == [0, 7, 2] and table["data_seed"].dtype == "int64"
    _run(store, "no_orders", tags={"rung": "2", "coord.seed": "0"}, metrics=BPB, params={"seed": "0", "data_seed": "None"})
    assert "data_seed" not in fit_table(read_runs("no_orders", store)).columns  # no run chose an order


def test_the_data_order_rule_is_a_column_where_a_run_keyed_its_order(store: str) -> None:
    """`data_order` "keyed" (rungs.data.sampler) on one run: each run's rule, "permutation" for a run that logged
    none (made before the field) or the default; runs that all shuffled have no column, as before."""
    for seed, rule in ((0, "keyed"), (1, "permutation"), (2, None)):
        _run(store, "rules", tags={"rung": "2", "coord.seed": str(seed)}, metrics=BPB,
             params={"seed": str(seed), **({} if rule is None else {"data_order": rule})})
    table = fit_table(read_runs("rules", store)).sort_values("seed")
    assert table["data_order"].tolist() == ["keyed", "permutation", "permutation"]
    _run(store, "shuffled", tags={"rung": "2", "coord.seed": "0"}, metrics=BPB,
         params={"seed": "0", "data_order": "permutation"})
    assert "data_order" not in fit_table(read_runs("shuffled", store)).columns


def test_a_canonical_column_falls_back_run_by_run(store: str) -> None:
    """`seed` is the sweep's coord tag where a run has one, else its param: a run `ladder train` made beside a
    sweep's (no coord tags) keeps its seed instead of an empty cell that pairing and grouping refuse."""
    _run(store, "mixed", tags={"rung": "2", "coord.seed": "1"}, metrics=BPB, params={"seed": "1"})
    _run(store, "mixed", tags={"rung": "2"}, metrics=BPB, params={"seed": "5"})
    table = fit_table(read_runs("mixed", store))
    assert sorted(table["seed"].tolist()) == [1, 5]
