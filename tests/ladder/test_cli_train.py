"""`ladder train`: the JSON contract of docs/architecture.md, resolve_train_config overrides, exit 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ladder.cli import main
from ladder.errors import LadderInputError
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from ladder.plan.resolve import parse_value, resolve_train_config
from tests.rungs.train_helpers import DATA_CACHE, REPO


def test_resolved_config_is_the_plan_plus_defaults_plus_overrides():
    spec = plan_rung(load_recipe("cpu-demo"), 3)
    cfg = resolve_train_config("cpu-demo", 3, ["lr=0.02", "agc_mode=fixed", "dropout=0.1"], max_steps=7)
    assert cfg["lr"] == 0.02 and cfg["agc_mode"] == "fixed" and cfg["dropout"] == 0.1 and cfg["max_steps"] == 7
    assert cfg["weight_decay"] == spec.weight_decay and cfg["steps"] == spec.steps
    assert cfg["flops_per_token"] == spec.flops_per_token and cfg["d_model"] == 48
    assert cfg["sources"]["code"]["epochs"] == pytest.approx(spec.sources["code"].epochs)
    assert cfg["recipe"] == "cpu-demo" and cfg["L"] == 3
    # JSON-able, and the same inputs give the same dict.
    assert json.loads(json.dumps(cfg)) == resolve_train_config("cpu-demo", 3, {"lr": 0.02, "agc_mode": "fixed",
                                                                              "dropout": 0.1}, max_steps=7)


def test_tpp_override_replans_and_arch_override_recounts():
    base = resolve_train_config("cpu-demo", 3)
    more = resolve_train_config("cpu-demo", 3, {"tpp": 10})
    assert more["steps"] > base["steps"] and more["tpp"] == 10
    wider = resolve_train_config("cpu-demo", 3, {"n_experts": 16})
    assert wider["params_total"] > base["params_total"]
    assert wider["params_active"] == base["params_active"] + 3 * 48 * 8  # only the router grows for active
    assert wider["flops_per_token"] > base["flops_per_token"]


def test_unknown_override_names_the_key_and_the_valid_ones():
    with pytest.raises(LadderInputError) as err:
        resolve_train_config("cpu-demo", 3, ["learning_rate=0.1"])
    assert "learning_rate" in str(err.value) and "weight_decay" in str(err.value)
    with pytest.raises(LadderInputError, match="top_k"):
        resolve_train_config("cpu-demo", 3, {"top_k": 20})
    with pytest.raises(LadderInputError, match="key=value"):
        resolve_train_config("cpu-demo", 3, ["lr"])


def test_parse_value():
    assert parse_value("1e-3") == 0.001 and parse_value("3") == 3 and parse_value("true") is True
    assert parse_value("none") is None and parse_value("cosine") == "cosine"


@pytest.mark.parametrize("argv, needle", [
    (["train", "cpu-demo", "--rung", "3", "--set", "bogus=1"], "bogus"),
    (["train", "no-such-recipe", "--rung", "3"], "no recipe named"),
    (["train", "cpu-demo", "--rung", "3", "--max-steps", "0"], "--max-steps"),
    (["train", "cpu-demo", "--rung", "3", "--set", "lr=-1"], "lr"),
])
def test_bad_input_exits_2_with_a_message(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


@pytest.mark.slow
def test_json_contract_end_to_end(tmp_path):
    """A few steps of the smallest rung through the real CLI process: one JSON object on stdout."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "ladder", "train", "cpu-demo", "--rung", "3", "--max-steps", "3", "--json",
           "--tracking-uri", uri, "--run-dir", str(tmp_path / "run"), "--set", f"data_cache_root={DATA_CACHE}",
           "--set", "eval_max_docs_per_domain=1", "--set", "final_eval_max_docs_per_domain=1", "--set", "batch_sequences=4", "--set", "threads=1"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)  # a far guard
    assert out.returncode == 0, out.stderr[-3000:]
    payload = json.loads(out.stdout)
    for key in ("run_id", "final_loss", "bpb", "tokens", "train_flops", "wall_seconds", "tokens_per_second", "mfu"):
        assert key in payload, key
    assert payload["tokens"] == 3 * 4 * 128
    assert set(payload["bpb"]) == {"code", "web", "stem", "books", "math", "qa"}
    from mlflow import MlflowClient

    assert MlflowClient(uri).get_run(payload["run_id"]).info.status == "FINISHED"


_TINY = ["--set", f"data_cache_root={DATA_CACHE}", "--set", "eval_max_docs_per_domain=1",
         "--set", "final_eval_max_docs_per_domain=1", "--set", "batch_sequences=4", "--set", "seq_len=64",
         "--set", "threads=1", "--set", "warmup_steps=1"]


def test_a_damaged_checkpoint_exits_2_naming_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "cpu-demo", "--rung", "3", "--max-steps", "2", "--run-dir", str(run),
            "--set", "tracking_uri=none", "--set", "checkpoint_interval=1", *_TINY]
    assert main(argv) == 0
    (run / "result.json").unlink()  # as if killed before the end: the rerun reads the checkpoint
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(run / "checkpoint.pt") in err and "checksum mismatch" in err and "Traceback" not in err


# Runs `ladder train` and SIGKILLs it right after the metrics of step K reached MLflow: a real kill at a
# chosen step, whatever the machine's speed.
_KILL_AT_STEP = """
import os, signal, sys
from rungs.tracking import Tracker
log_metrics, kill_at = Tracker.log_metrics, int(sys.argv[1])
def logged_then_killed(self, metrics, step, *, flush=False):
    log_metrics(self, metrics, step, flush=flush)
    if step == kill_at:
        self.flush()
        os.kill(os.getpid(), signal.SIGKILL)
Tracker.log_metrics = logged_then_killed
from ladder.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("kill_at", [2, 7])  # before the first checkpoint (step 3), and after the second (6)
def test_kill_and_resume_store_each_step_and_clip_event_once(tmp_path, kill_at):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = tmp_path / "run"
    args = ["train", "cpu-demo", "--rung", "3", "--max-steps", "8", "--run-dir", str(run), "--tracking-uri", uri,
            "--set", "checkpoint_interval=3", "--set", "agc_threshold=1.01", *_TINY]  # every step clips
    killed = subprocess.run([sys.executable, "-c", _KILL_AT_STEP, str(kill_at), *args], cwd=REPO,
                            capture_output=True, text=True, timeout=3600)  # a far guard
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (run / "result.json").exists()
    assert main(args + ["--json"]) == 0
    client = MlflowClient(uri)
    (only,) = client.search_runs([client.get_experiment_by_name("ladder").experiment_id])
    assert only.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(only.info.run_id, "loss")) == list(range(1, 9))
    steps = [json.loads(line)["step"] for line in (run / "clip_events.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and set(steps) == set(range(8))  # each step's events once, in order


def test_a_full_disk_exits_2_saying_so(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json.tmp").symlink_to("/dev/full")  # a real ENOSPC where the result is written
    argv = ["train", "cpu-demo", "--rung", "3", "--max-steps", "1", "--run-dir", str(run), "--set", "tracking_uri=none",
            *_TINY]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "disk full" in err and str(run / "result.json") in err and "Traceback" not in err


def test_a_finished_job_whose_run_is_not_in_the_store_is_refused_or_reregistered(tmp_path, capsys):
    """A rerun of a finished job returns its stored result; against a store that lacks its MLflow run
    (replaced, or another --tracking-uri) the fits would miss it: refused in one line, as `ladder sweep
    run` refuses, and with --reregister recorded there as a new run with the stored numbers."""
    from mlflow import MlflowClient

    run = tmp_path / "run"
    first, second = (f"sqlite:///{tmp_path / name}" for name in ("first.db", "second.db"))
    argv = ["train", "cpu-demo", "--rung", "3", "--max-steps", "2", "--run-dir", str(run), "--json", *_TINY]
    assert main([*argv, "--tracking-uri", first]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert main([*argv, "--tracking-uri", first]) == 0  # the same store: the stored result, nothing new
    assert json.loads(capsys.readouterr().out)["run_id"] == trained["run_id"]

    assert main([*argv, "--tracking-uri", second]) == 2
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "--reregister" in line]  # (MLflow logs the new store's creation)
    assert len(said) == 1 and trained["run_id"] in said[0] and "Traceback" not in err
    assert main([*argv, "--tracking-uri", second, "--reregister"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["run_id"] != trained["run_id"] and payload["bpb"] == trained["bpb"]
    run_record = MlflowClient(second).get_run(payload["run_id"])
    assert run_record.info.status == "FINISHED" and run_record.data.tags["reregistered_from"] == trained["run_id"]
    assert run_record.data.tags["trial_key"] and run_record.data.params["L"] == "3"
    assert {k: v for k, v in run_record.data.metrics.items() if k.startswith("final_bpb/")} == \
        {f"final_bpb/{d}": v for d, v in trained["bpb"].items()}
    assert main([*argv, "--tracking-uri", second]) == 0  # recorded now: returned as it is
    assert json.loads(capsys.readouterr().out)["run_id"] == payload["run_id"]


def test_a_job_finished_without_tracking_is_not_returned_as_tracked(tmp_path, capsys):
    """Tracking is not part of a job's key, so `--set tracking_uri=` and the tracked command share a run
    directory: the tracked rerun printed the stored numbers with run_id null, exit 0, and the store got nothing
    (a rung the fits then silently lacked). Refused as a run missing from the store is; --reregister records it."""
    from mlflow import MlflowClient

    run, store = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["train", "cpu-demo", "--rung", "3", "--max-steps", "1", "--run-dir", str(run), "--json", *_TINY]
    assert main([*argv, "--set", "tracking_uri="]) == 0
    untracked = json.loads(capsys.readouterr().out)
    assert untracked["run_id"] is None
    assert main([*argv, "--tracking-uri", store]) == 2
    err = capsys.readouterr().err
    assert "it ran without tracking" in err and "--reregister" in err and "Traceback" not in err
    assert main([*argv, "--tracking-uri", store, "--reregister"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["run_id"] and payload["bpb"] == untracked["bpb"]
    assert MlflowClient(store).get_run(payload["run_id"]).info.status == "FINISHED"


def test_a_deleted_or_blank_experiment_is_refused_before_any_work(tmp_path, capsys):
    """The MLflow UI deletes an experiment softly; a run cannot be created in it, and the job died with a
    30-line MlflowException after preparing the data and building the model."""
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    client.delete_experiment(client.create_experiment("gone"))
    run = tmp_path / "run"
    argv = ["train", "cpu-demo", "--rung", "3", "--max-steps", "1", "--run-dir", str(run), "--tracking-uri", store,
            *_TINY]
    assert main([*argv, "--set", "experiment_name=gone"]) == 2
    err = capsys.readouterr().err
    assert "experiment 'gone' (id 1) was deleted" in err and "mlflow experiments restore --experiment-id 1" in err
    assert not run.exists()
    assert main([*argv, "--set", "experiment_name= "]) == 2
    assert "experiment_name: must not be blank" in capsys.readouterr().err


@pytest.mark.parametrize("argv,said", [(["--tracking-uri", ""], "--tracking-uri: empty tracking URI"),
                                       (["--set", "data_cache_root="], "data_cache_root: must not be blank")])
def test_a_blank_store_or_cache_root_is_refused(argv, said, capsys):
    """`--tracking-uri ''` trained into the default store; a blank data_cache_root cached corpora in the working
    directory."""
    assert main(["train", "cpu-demo", "--rung", "2", *argv]) == 2
    assert said in capsys.readouterr().err


def test_mlflow_tracking_uri_names_the_store_of_every_command(tmp_path, monkeypatch, capsys):
    """`ladder sweep run` honoured $MLFLOW_TRACKING_URI and `ladder train`, `fit --experiment` did not: a sweep
    recorded into one store while the fit of its experiment read another. A refusal names the variable."""
    from mlflow import MlflowClient

    from rungs.tracking_uri import default_tracking_uri, is_embedded_default

    store = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    assert default_tracking_uri(None) == store and default_tracking_uri("sqlite:///x.db") == "sqlite:///x.db"
    assert not is_embedded_default(None)  # a store named by the variable is not created unasked
    argv = ["train", "cpu-demo", "--rung", "3", "--max-steps", "1", "--run-dir", str(tmp_path / "run"), "--json",
            "--set", "experiment_name=env", *_TINY]
    assert main(argv) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    assert MlflowClient(store).get_run(run_id).info.status == "FINISHED"
    main(["fit", "power-law", "--experiment", "env", "--no-log", "--bootstrap", "0"])  # one run: no law to fit
    err = capsys.readouterr().err
    assert "no MLflow store" not in err and "no experiment named" not in err  # it read the variable's store
    assert main(["fit", "power-law", "--experiment", "other", "--no-log"]) == 2
    assert f"no experiment named 'other' in {store}" in capsys.readouterr().err
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'missing.db'}")
    assert main(["fit", "power-law", "--experiment", "env"]) == 2
    assert "--tracking-uri (or $MLFLOW_TRACKING_URI, which names this store): no MLflow store" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()
