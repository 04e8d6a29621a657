"""`ladder fit heldout` on real training runs in an MLflow store: it reads each run's per-document bits from
its eval.json artifact and gives the split `fits.heldout_noise` gives on the run directories' own files; a run
without them (trained before the final eval kept them) is left out and said; bad columns are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from fits.heldout_noise import split_runs
from ladder.cli import main
from rungs.train import train
from tests.rungs.train_helpers import tiny_config

EXPERIMENT = "heldout"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, list[Path]]:
    """Four seeds of one tiny config scored on four held-out documents a domain, and one run as an older
    version logged it (final BPB, no per-document bits)."""
    root = tmp_path_factory.mktemp("heldout")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    dirs = []
    for seed in range(4):
        cfg = tiny_config(max_steps=3, seed=seed, tracking_uri=uri, experiment_name=EXPERIMENT,
                          final_eval_max_docs_per_domain=4)
        train(cfg, run_dir=root / f"s{seed}", progress=False)
        dirs.append(root / f"s{seed}")
    client = MlflowClient(uri)
    old = client.create_run(client.get_experiment_by_name(EXPERIMENT).experiment_id,
                            tags={"rung": "3", "trial_key": "old"})
    client.log_metric(old.info.run_id, "final_bpb/code", 4.0)
    client.set_terminated(old.info.run_id, "FINISHED")
    return uri, dirs


def fit(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["fit", "heldout", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_split_is_the_run_directories_own(store, capsys):
    uri, dirs = store
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--json", "--no-log")
    assert code == 0, err
    got = json.loads(out)
    assert got["by"] == "rung" and len(got["splits"]) == 1 and got["splits"][0]["by"] == 3
    assert len(got["runs_without_doc_bits"]) == 1 and "1 of 5 runs have no per-document bits" in err
    evals = []
    for d in dirs:
        final = [e for e in json.loads((d / "eval.json").read_text())["evals"] if e["final"]][-1]
        evals.append(final["doc_bits"])
    # the store's runs come back in its own order; the split does not depend on the seeds' order
    want = split_runs(evals)
    cells = got["splits"][0]["domains"]
    assert sorted(cells) == sorted(want)
    for domain, h in want.items():
        cell = cells[domain]
        assert cell["seeds"] == 4 and cell["documents"] == h.documents
        assert cell["sd_total"] == pytest.approx(h.sd_total, rel=1e-9)
        assert cell["sd_documents"] == pytest.approx(h.sd_documents, rel=1e-9)
        assert cell["sd_with_more_documents"] == pytest.approx(h.sd_with_documents(4), rel=1e-9)


def test_the_table_and_the_fit_run_logged_back(store, capsys):
    uri, _ = store
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--more-documents", "2")
    assert code == 0, err
    assert "rung 3: one seed's sd of log BPB, 4 runs in 1 configuration" in out and "with 2× documents" in out
    client = MlflowClient(uri)
    fits = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id],
                              filter_string="tags.fit_command = 'heldout'")
    assert len(fits) == 1 and fits[0].data.tags["n_source_runs"] == "4"
    assert any(k.endswith("/all/documents_share") for k in fits[0].data.metrics)
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--json", "--no-log")
    assert code == 0 and json.loads(out)["splits"][0]["runs"] == 4  # the fit run is not read as a run


def test_a_split_with_one_seed_a_configuration_says_why(store, capsys):
    uri, _ = store
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--json", "--no-log",
                         "--configs", "seed")
    assert code == 0, err
    split = json.loads(out)["splits"][0]
    assert split["configurations"] == 4 and "domains" not in split
    assert "at least 2 degrees of freedom" in split["not_split"]


def test_splits_by_several_columns_name_each_combination(store, capsys):
    """`--by rung,seed`: one split per (rung, seed), its `by` the list of values; one run each is not split."""
    uri, _ = store
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--json", "--no-log",
                         "--by", "rung,seed")
    assert code == 0, err
    got = json.loads(out)
    assert got["by"] == "rung,seed"
    assert [s["by"] for s in got["splits"]] == [[3, s] for s in range(4)]
    assert all(s["runs"] == 1 and "not_split" in s for s in got["splits"])
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--no-log", "--by", "rung,seed")
    assert code == 0 and "rung 3 seed 2: one seed's sd of log BPB, 1 run in 1 configuration: not split" in err


@pytest.mark.parametrize("argv, says", [
    (["--by", "colour"], "--by"),
    (["--by", "rung,colour"], "--by"),
    (["--by", ","], "--by"),
    (["--configs", "arm,colour"], "--configs"),
    (["--more-documents", "0"], "--more-documents"),
])
def test_bad_columns_and_numbers_are_refused(store, capsys, argv, says):
    uri, _ = store
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--no-log", *argv)
    assert code == 2 and out == "" and says in err and "Traceback" not in err


def test_an_experiment_of_runs_without_per_document_bits_is_refused_saying_why(store, capsys):
    uri, _ = store
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("older"), tags={"rung": "3", "trial_key": "older"})
    client.log_metric(run.info.run_id, "final_bpb/code", 4.0)
    client.set_terminated(run.info.run_id, "FINISHED")
    code, out, err = fit(capsys, "--experiment", "older", "--tracking-uri", uri, "--no-log")
    assert code == 2 and out == "" and "no run has per-document bits" in err and "Traceback" not in err


def test_runs_a_tracking_server_logged_are_read_beside_the_store(store, tmp_path):
    """A sweep's runs are logged through its tracking server, their artifacts under `mlflow-artifacts:/…`, which
    only a server resolves; read on the SQLite file (as after `ladder sweep run`), the files are where the
    server keeps them, `mlartifacts/` beside the store (`rungs.tracking.log_artifact` writes there too)."""
    from ladder.run.mlflow_runs import final_doc_bits
    from rungs.tracking import log_artifact

    uri, dirs = store
    client = MlflowClient(uri)
    exp = client.create_experiment("served", artifact_location="mlflow-artifacts:/served")
    ids = []
    for d in dirs:
        run = client.create_run(exp)
        assert run.info.artifact_uri.startswith("mlflow-artifacts:")
        log_artifact(client, uri, run.info.run_id, d / "eval.json")
        ids.append(run.info.run_id)
    bare = client.create_run(exp).info.run_id  # no eval.json at all
    got = final_doc_bits(uri, [*ids, bare])
    for run_id, d in zip(ids, dirs):
        final = [e for e in json.loads((d / "eval.json").read_text())["evals"] if e["final"]][-1]
        assert got[run_id] == final["doc_bits"]
    assert got[bare] is None


def test_the_figure_is_written_and_a_figure_of_nothing_is_refused(store, capsys, tmp_path):
    from matplotlib.image import imread

    uri, _ = store
    path = tmp_path / "fig" / "heldout.png"
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--json", "--no-log",
                         "--plot", str(path))
    assert code == 0, err
    assert json.loads(out)["plot"] == str(path) and imread(path).shape[0] > 100
    code, out, err = fit(capsys, "--experiment", EXPERIMENT, "--tracking-uri", uri, "--no-log", "--configs", "seed",
                         "--plot", str(tmp_path / "none.png"))
    assert code == 2 and "--plot" in err and "no split to plot" in err and not (tmp_path / "none.png").exists()
