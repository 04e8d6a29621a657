"""A sweep with a JAX arm: it finishes on a private local Ray, its MLflow runs have the
PyTorch runs' schema, and `ladder fit` reads the runs of both backends as one table. And the
nightly's JAX rung is judged against a golden entry of its own.

Three trials of the smallest cpu-demo rung, a few steps each: PyTorch at 3 and 9 steps, JAX at 6, so
the fit sees three distinct compute values only if it reads the runs of both backends together.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ladder.cli import main
from ladder.plan.recipe import load_recipe
from ladder.run.nightly import (GOLDENS_DIR, NOT_COMPARABLE, THROUGHPUT_METRIC, TrialMeasurement, compare,
                                golden_machine_class, load_golden, trial_name)
from ladder.run.sweep_runs import find_runs
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec
from tests.rungs.train_helpers import DATA_CACHE, ONE_DOC_EVAL, REPO

LADDER = [sys.executable, "-m", "ladder"]
GUARD_SECONDS = 3600  # ends a hung run; never a judgement of speed
# Tags only one backend can carry: which engine ran, and the JAX job's version, platform and compile time.
BACKEND_TAGS = {"backend", "jax_version", "jax_platform", "jax_compile_seconds"}


def _spec() -> dict:
    rung = min(load_recipe("cpu-demo").ladder_rungs)
    small = {"data_cache_root": str(DATA_CACHE), **ONE_DOC_EVAL, "checkpoint_interval": 1000, "eval_interval": 1000}
    return {"name": "jax_smoke", "recipe": "cpu-demo", "seeds": [0], "max_concurrent": 1, "max_failures": 0,
            "resources": {"cpus": 1}, "overrides": small,
            "blocks": [{"name": "short", "rungs": [rung], "max_steps": 3, "arms": {"torch": {}}},
                       {"name": "long", "rungs": [rung], "max_steps": 6, "arms": {"jax": {"backend": "jax"}}},
                       {"name": "longer", "rungs": [rung], "max_steps": 9, "arms": {"torch": {}}}]}


def _ladder(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*LADDER, *args], capture_output=True, text=True, timeout=GUARD_SECONDS, cwd=cwd)


@pytest.mark.slow
def test_a_sweep_with_a_jax_arm_logs_one_schema_and_fits_read_both_backends(tmp_path, capsys):
    spec_path = tmp_path / "jax_smoke.yaml"
    spec_path.write_text(yaml.safe_dump(_spec()))
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = _ladder(["sweep", "run", str(spec_path), "--tracking-uri", store, "--new-store", "--json"], REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert {k: summary[k] for k in ("trials", "completed", "failed", "diverged")} == {
        "trials": 3, "completed": 3, "failed": 0, "diverged": 0}

    client = MlflowClient(store)
    runs = [client.get_run(r.run_id) for rs in find_runs(store, "sweep-jax_smoke").values() for r in rs]
    by_backend: dict[str, list] = {}
    for run in runs:
        by_backend.setdefault(run.data.tags.get("backend", "torch"), []).append(run)
    assert {k: len(v) for k, v in by_backend.items()} == {"jax": 1, "torch": 2}
    torch_run, jax_run = by_backend["torch"][0], by_backend["jax"][0]
    assert set(jax_run.data.params) == set(torch_run.data.params)
    assert jax_run.data.params["backend"] == "jax" and torch_run.data.params["backend"] == "torch"
    assert set(jax_run.data.metrics) == set(torch_run.data.metrics)
    assert set(jax_run.data.tags) - BACKEND_TAGS == set(torch_run.data.tags) - BACKEND_TAGS
    for run in runs:
        assert run.data.tags["outcome"] == "finished" and run.data.tags["sweep"] == "jax_smoke"
        assert any(k.startswith("final_bpb/") for k in run.data.metrics)

    # The fit in this process: it only reads the store (a process of its own would add ~5 s of imports).
    capsys.readouterr()
    fit_rc = main(["fit", "power-law", "--experiment", "sweep-jax_smoke", "--tracking-uri", store, "--all-runs",
                   "--bootstrap", "0", "--holdout-top", "0", "--json"])
    fit = capsys.readouterr()
    # 1: no domain's law identified from a few steps (a boundary, said per domain), never bad input (2)
    assert fit_rc in (0, 1), fit.err[-3000:]
    payload = json.loads(fit.out)
    assert payload["source"]["n_runs"] == 3
    domains = {k.split("/", 1)[1] for k in torch_run.data.metrics if k.startswith("final_bpb/")}
    assert {f["group"] for f in payload["fits"]} == domains
    for f in payload["fits"]:
        if f["E"] is None:  # refused on its shape, not for want of compute points (3 only with both backends)
            assert "distinct" not in f["reason"], f["reason"]
        else:
            assert f["n_points"] == 3, f
    if fit_rc == 0:
        logged = client.get_run(payload["mlflow_fit_run_id"]).data.tags["source_runs"].split(",")
        assert set(logged) == {r.info.run_id for r in runs}


def _measurements(golden: dict) -> dict[str, TrialMeasurement]:
    return {name: TrialMeasurement(bpb=dict(t["bpb"]), tokens_per_second=t["tokens_per_second"],
                                   moe_rounds_mean=t["moe_rounds_mean"], key=t["key"], run_id=None)
            for name, t in golden["trials"].items()}


def test_the_nightly_judges_its_jax_rung_against_its_own_golden_entry():
    planned = plan_sweep(load_spec("nightly"), where="nightly")
    names = {trial_name(p.trial): p for p in planned}
    assert {n for n, p in names.items() if p.config.get("backend") == "jax"} == {"jax/L3/jax/s0"}
    golden = load_golden(GOLDENS_DIR / "nightly.json")
    assert set(golden["trials"]) == set(names)
    assert all(golden["trials"][n]["key"] == p.key for n, p in names.items())  # measured on these very trials

    tonight = _measurements(golden)
    tonight["jax/L3/jax/s0"].bpb["code"] += 2 * golden["tolerances"]["bpb_abs"]  # the JAX rung alone regresses
    report = compare(golden, tonight, "nightly")
    assert {(c.trial, c.metric) for c in report.regressions} == {("jax/L3/jax/s0", "bpb/code")}

    without = {**golden, "trials": {n: t for n, t in golden["trials"].items() if n != "jax/L3/jax/s0"}}
    report = compare(without, _measurements(golden), "nightly")
    assert not report.regressions and any("no golden entry for jax/L3/jax/s0" in note for note in report.notes)


def test_a_golden_entry_measured_on_another_machine_judges_its_throughput_on_that_class_only():
    golden = load_golden(GOLDENS_DIR / "nightly.json")
    jax_class = golden["trials"]["jax/L3/jax/s0"].get("machine_class", golden_machine_class(golden))
    for tonight in (golden["machine"], {"class": jax_class}):
        report = compare(golden, _measurements(golden), "nightly", tonight)
        verdicts = {c.trial: c.verdict for c in report.comparisons if c.metric == THROUGHPUT_METRIC}
        for name, entry in golden["trials"].items():
            own_class = entry.get("machine_class", golden_machine_class(golden))
            assert verdicts[name] == ("ok" if own_class == tonight["class"] else NOT_COMPARABLE), (name, tonight)
        assert not report.regressions
