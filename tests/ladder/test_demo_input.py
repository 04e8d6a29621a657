"""`ladder demo` checks its spec and store as `ladder sweep run` does, before writing anything;
`ladder demo --plan-only --json` prints one object; `--address` at which nothing answers is refused at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import ladder.analysis.demo as demo
import rungs.data.prepare as prepare
from ladder.cli import main
from ladder.errors import LadderInputError
from ladder.run.orchestrate import check_ray_address, ray_endpoint, run_sweep
from ladder.run.tracking_server import free_port
from sweeps.spec import load_spec

BAD_SPEC = "name: t\nrecipe: cpu-demo\noverrides: {nonexistent_knob: 3}\nblocks:\n  - {name: b, rungs: [3]}\n"
BIG_SPEC = "name: big\nrecipe: cpu-demo\nmax_steps: 2\nresources: {cpus: 1000}\nblocks:\n  - {name: b, rungs: [3]}\n"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory where preparing data or starting the sweep fails the test."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def no_work(*args, **kwargs):
        raise AssertionError("the demo started work before refusing its input")

    monkeypatch.setattr(prepare, "ensure_prepared", no_work)
    monkeypatch.setattr("ladder.run.orchestrate.run_sweep", no_work)
    monkeypatch.setattr("ladder.run.orchestrate.connect_ray", no_work)
    return tmp_path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_bad_spec_is_refused_naming_its_file_before_any_folder(workdir, capsys):
    (workdir / "bad.yaml").write_text(BAD_SPEC)
    assert main(["demo", "--spec", "bad.yaml", "--out", "out"]) == 2
    err = _one_line_error(capsys)
    assert "bad.yaml" in err and "nonexistent_knob" in err and "sweep spec:" not in err
    assert sorted(p.name for p in workdir.iterdir()) == ["bad.yaml"]  # no out/, no runs/


def test_missing_named_store_is_refused_before_any_folder(workdir, capsys):
    (workdir / "big.yaml").write_text(BIG_SPEC)
    assert main(["demo", "--spec", "big.yaml", "--out", "out", "--tracking-uri", "sqlite:///typo/mlfow.db"]) == 2
    err = _one_line_error(capsys)
    assert "--tracking-uri" in err and "typo/mlfow.db" in err and "--new-store" in err
    assert sorted(p.name for p in workdir.iterdir()) == ["big.yaml"]  # no typo/, no out/, no runs/


def test_store_rule_matches_sweep_run(workdir):
    # --new-store lets a named store be created; the default store may always be; neither is written by the check.
    *_, uri, create = demo.check_demo_inputs("demo", "sqlite:///new/mlflow.db", new_store=True)
    assert (uri, create) == ("sqlite:///new/mlflow.db", True)
    *_, uri, create = demo.check_demo_inputs("demo", None)
    assert create and uri.startswith("sqlite:///")
    with pytest.raises(LadderInputError, match="empty tracking URI"):
        demo.check_demo_inputs("demo", "")
    assert list(workdir.iterdir()) == []


def test_run_demo_passes_the_spec_file_and_store_rule_to_the_sweep(workdir, monkeypatch):
    seen = {}

    class Stop(Exception):
        pass

    def fake_run_sweep(spec, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(prepare, "ensure_prepared", lambda *a, **k: None)
    monkeypatch.setattr("ladder.run.orchestrate.run_sweep", fake_run_sweep)
    with pytest.raises(Stop):
        demo.run_demo(out_dir=workdir / "out", tracking_uri="sqlite:///x/mlflow.db", new_store=True,
                      progress=lambda msg: None)
    assert seen["where"].endswith("demo.yaml") and seen["create_store"] is True
    assert seen["tracking_uri"] == "sqlite:///x/mlflow.db"
    assert type(seen["on_todo"].__self__).__name__ == "SweepEta"  # the time left counts only the trials to run


def test_plan_only_json_is_one_object(workdir, capsys):
    assert main(["demo", "--plan-only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["demo"] == "plan-only" and out["spec"].endswith("demo.yaml")
    recipe = load_spec("demo").recipe
    assert [p["recipe"] for p in out["plans"]][1] == "mai-base-2" and len(out["plans"]) == 2
    assert recipe in out["plans"][0]["recipe"] or out["plans"][0]["recipe"] in recipe
    assert all(p["rungs"] for p in out["plans"])
    assert list(workdir.iterdir()) == []


@pytest.mark.parametrize("address, endpoint", [
    (None, None), ("local", None), ("auto", None), ("", None),
    ("127.0.0.1:6379", ("127.0.0.1", 6379)), ("head.example:6380", ("head.example", 6380)),
    ("ray://10.0.0.1:10001", ("10.0.0.1", 10001)), ("ray://head", ("head", 10001)),
    ("[::1]:6379", ("::1", 6379)),
])
def test_ray_endpoint_reads_addresses_as_ray_init_does(address, endpoint):
    assert ray_endpoint(address) == endpoint


def test_address_nothing_answers_at_is_refused_quickly():
    address = f"127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    with pytest.raises(LadderInputError, match=f"no Ray cluster answers at {address}") as err:
        check_ray_address(address)
    assert err.value.field == "--address" and time.perf_counter() - t0 < 10
    check_ray_address("local")  # no probe for a private local Ray


def test_sweep_run_refuses_dead_address_before_the_store_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    address = f"127.0.0.1:{free_port()}"
    assert main(["sweep", "run", "smoke", "--address", address]) == 2
    err = _one_line_error(capsys)
    assert f"no Ray cluster answers at {address}" in err and "ray start --head" in err
    assert not Path("runs").exists()
    with pytest.raises(LadderInputError):
        run_sweep(load_spec("smoke"), address=address, tracking_uri=f"sqlite:///{tmp_path}/m.db")
    assert list(tmp_path.iterdir()) == []
