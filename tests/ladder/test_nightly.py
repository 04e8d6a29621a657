"""Nightly regression: tolerances from measured spread, one-sided verdicts, the report, exit codes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ladder.cli import main
from ladder.errors import LadderInputError
from ladder.machine import cpu_model, machine_class, machine_info
from ladder.run.nightly import (FLOOR_BPB_ABS, FLOOR_TOKENS_PER_SECOND_LOG_RATIO, NOT_COMPARABLE, SAFETY_FACTOR,
                                GOLDENS_DIR, TrialMeasurement, build_golden, compare, load_golden)
from ladder.run.nightly_report import write_report
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec
from tests.rungs.train_helpers import ONE_DOC_EVAL


def m(bpb: dict, tps: float, rounds: float) -> TrialMeasurement:
    return TrialMeasurement(bpb=bpb, tokens_per_second=tps, moe_rounds_mean=rounds, key="k", run_id="r")


HERE = {"cpu_model": "AMD EPYC", "cores": 2, "class": "cpu:AMD EPYC x2"}
ELSEWHERE = {"cpu_model": "Intel(R) Xeon(R) Platinum 8488C", "cores": 8,
             "class": "cpu:Intel(R) Xeon(R) Platinum 8488C x8"}

RUNS = [
    {"rungs/L3/base/s0": m({"code": 3.00, "web": 4.00}, 10_000.0, 1.00)},
    {"rungs/L3/base/s0": m({"code": 3.02, "web": 4.00}, 6_000.0, 1.10)},
]


def test_tolerances_are_the_measured_spread_times_the_safety_factor_with_floors():
    golden = build_golden(load_spec("nightly"), RUNS, machine={})
    tol = golden["tolerances"]
    assert golden["noise"]["bpb_abs_spread"] == pytest.approx(0.02)
    assert tol["bpb_abs"] == pytest.approx(max(SAFETY_FACTOR * 0.02, FLOOR_BPB_ABS))
    assert golden["noise"]["tokens_per_second_log_ratio_spread"] == pytest.approx(math.log(10_000 / 6_000))
    assert tol["tokens_per_second_log_ratio"] == pytest.approx(
        max(SAFETY_FACTOR * math.log(10_000 / 6_000), FLOOR_TOKENS_PER_SECOND_LOG_RATIO))
    assert tol["moe_rounds_abs"] == pytest.approx(SAFETY_FACTOR * 0.1)
    assert golden["trials"]["rungs/L3/base/s0"]["bpb"] == {"code": 3.00, "web": 4.00}  # the first repeat
    identical = build_golden(load_spec("nightly"), [RUNS[0], RUNS[0]], machine={})
    assert identical["tolerances"]["bpb_abs"] == FLOOR_BPB_ABS  # zero spread: the floor, never zero


def test_only_the_bad_direction_beyond_tolerance_is_a_regression():
    golden = build_golden(load_spec("nightly"), [RUNS[0], RUNS[0]], machine=HERE)
    tol = golden["tolerances"]["bpb_abs"]
    name = "rungs/L3/base/s0"

    def verdicts(bpb_code: float, tps: float, rounds: float) -> dict[str, str]:
        report = compare(golden, {name: m({"code": bpb_code, "web": 4.0}, tps, rounds)}, "nightly", HERE)
        assert report.throughput_compared and not report.notes  # same machine class: everything compared
        return {c.metric: c.verdict for c in report.comparisons}

    assert set(verdicts(3.0, 10_000.0, 1.0).values()) == {"ok"}
    assert verdicts(3.0 + 0.5 * tol, 10_000.0, 1.0)["bpb/code"] == "ok"
    assert verdicts(3.0 + 2 * tol, 10_000.0, 1.0)["bpb/code"] == "regression"
    assert verdicts(3.0 - 2 * tol, 10_000.0, 1.0)["bpb/code"] == "improvement"
    slower = 10_000.0 / math.exp(1.01 * FLOOR_TOKENS_PER_SECOND_LOG_RATIO)
    assert verdicts(3.0, slower, 1.0)["log_tokens_per_second"] == "regression"
    assert verdicts(3.0, 10_000.0 / math.exp(0.9 * FLOOR_TOKENS_PER_SECOND_LOG_RATIO), 1.0)["log_tokens_per_second"] == "ok"
    assert verdicts(3.0, 30_000.0, 1.0)["log_tokens_per_second"] == "improvement"
    assert verdicts(3.0, 10_000.0, 1.5)["moe_rounds_mean"] == "regression"
    assert verdicts(float("nan"), 10_000.0, 1.0)["bpb/code"] == "missing"
    missing = compare(golden, {}, "nightly", HERE)
    assert [c.verdict for c in missing.comparisons] == ["missing"] and missing.regressions


def test_throughput_from_another_machine_class_is_not_comparable_while_bpb_and_rounds_are_judged():
    """BPB matched bit for bit on other hardware, and the nightly failed on tokens/s."""
    name = "rungs/L3/base/s0"
    golden = build_golden(load_spec("nightly"), [RUNS[0], RUNS[0]], machine=ELSEWHERE)
    tol = golden["tolerances"]["bpb_abs"]
    ten_times_slower = m({"code": 3.0, "web": 4.0}, 1_000.0, 1.0)
    report = compare(golden, {name: ten_times_slower}, "nightly", HERE)
    verdicts = {c.metric: c.verdict for c in report.comparisons}
    assert verdicts == {"bpb/code": "ok", "bpb/web": "ok", "log_tokens_per_second": NOT_COMPARABLE,
                        "moe_rounds_mean": "ok"}
    assert not report.regressions and not report.throughput_compared
    assert len(report.notes) == 1 and ELSEWHERE["class"] in report.notes[0] and HERE["class"] in report.notes[0]
    on_golden_class = compare(golden, {name: ten_times_slower}, "nightly", ELSEWHERE)
    assert {c.metric: c.verdict for c in on_golden_class.comparisons}["log_tokens_per_second"] == "regression"
    # BPB and MoE rounds stay judged across machine classes.
    worse = compare(golden, {name: m({"code": 3.0 + 2 * tol, "web": 4.0}, 1_000.0, 1.5)}, "nightly", HERE)
    assert {(c.metric, c.verdict) for c in worse.regressions} == {("bpb/code", "regression"),
                                                                   ("moe_rounds_mean", "regression")}
    # A golden written before machine classes existed (the old file format): throughput not compared, said so.
    legacy = {k: v for k, v in golden.items() if k != "machine"}
    old = compare(legacy, {name: ten_times_slower}, "nightly", HERE)
    assert not old.regressions and "records no machine class" in old.notes[0]
    as_json = old.to_json()
    assert as_json["throughput_compared"] is False and as_json["notes"] == old.notes and as_json["ok"]


def test_machine_class_is_the_gpu_else_the_cpu_model_and_cores(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R)  Xeon(R) CPU @ 2.20GHz\n")
    assert cpu_model(cpuinfo) == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    assert cpu_model(tmp_path / "absent")  # no /proc/cpuinfo: what platform knows, never empty
    assert machine_class({"cpu_model": "AMD EPYC", "cores": 2}) == "cpu:AMD EPYC x2"
    gpu_box = {"cpu_model": "AMD EPYC", "cores": 64, "gpu": "NVIDIA H200", "gpus": 8}
    assert machine_class(gpu_box) == "gpu:NVIDIA H200 x8"
    here = machine_info()
    assert here["class"] == machine_class(here) and here["cores"] >= 1
    assert "peak_bf16_flops_measured" not in here  # a machine's identity is not timed


def test_the_nightly_imports_no_benchmark_code():
    """product code took `machine_info` from benchmarks/; it lives in ladder.machine now."""
    import ast

    import ladder

    for name in ("run/nightly", "run/nightly_report", "cli/nightly", "machine"):
        tree = ast.parse((Path(ladder.__file__).parent / f"{name}.py").read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m.split(".")[0] == "benchmarks" for m in imported), (name, imported)


def test_report_has_every_comparison_and_its_plots(tmp_path):
    golden = build_golden(load_spec("nightly"), RUNS, machine=HERE)
    report = compare(golden, {"rungs/L3/base/s0": m({"code": 9.0, "web": 4.0}, 10_000.0, 1.0)}, "nightly", HERE)
    path = write_report(report, golden, tmp_path)
    text = path.read_text()
    assert "FAIL (1 regression(s))" in text and "**REGRESSION**" in text
    assert text.count("| rungs/L3/base/s0 |") == len(report.comparisons) == 4
    for png in ("bpb.png", "throughput.png"):
        assert (tmp_path / png).stat().st_size > 1000 and f"({png})" in text
    assert "throughput compared" in text
    elsewhere = compare(golden, report.measurements, "nightly", ELSEWHERE)
    text = write_report(elsewhere, golden, tmp_path / "elsewhere").read_text()
    assert "throughput not compared" in text and "not comparable (other machine class)" in text
    assert f"**Note:** {elsewhere.notes[0]}" in text


def test_shipped_golden_file_matches_the_shipped_spec():
    golden = load_golden(GOLDENS_DIR / "nightly.json")
    spec = load_spec("nightly")
    assert golden["spec"] == spec.name and golden["repeats"] >= 2
    from ladder.run.nightly import nightly_names

    names = nightly_names(plan_sweep(spec, where="nightly"), where="nightly")
    assert {n: golden["trials"][n]["key"] for n in names.values()} == {n: k for k, n in names.items()}
    assert set(golden["trials"]) == ({f"rungs/L{L}/base/s0" for L in spec.blocks[0].rungs}
                                     | {f"jax/L{L}/jax/s0" for L in spec.blocks[1].rungs})  # the JAX rung
    for trial in golden["trials"].values():
        assert trial["bpb"] and all(0.0 < v < 8.0 for v in trial["bpb"].values())  # below 8 bits/byte (uniform bytes)
    # The machine class its throughput was measured on: without it no machine compares throughput.
    assert golden["machine"]["class"] == machine_class(golden["machine"])


def test_missing_golden_exits_2_before_running_anything(tmp_path, capsys):
    rc = main(["nightly", "nightly", "--baseline", str(tmp_path / "none.json"), "--out", str(tmp_path)])
    assert rc == 2
    assert "--update-baseline" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    with pytest.raises(LadderInputError):
        load_golden(tmp_path / "none.json")


# The smallest nightly that still goes through everything real (Ray, the MLflow tracking server, one
# cpu-demo trial): one L3 trial of 6 steps, its final BPB on the first held-out document of each domain
# (the full held-out sets cost ~12 s a trial and prove nothing more here).
TINY = {"name": "tiny_nightly", "recipe": "cpu-demo", "max_steps": 6, "seeds": [0], "max_concurrent": 1,
        "resources": {"cpus": 1},
        "overrides": {"deterministic": True, **ONE_DOC_EVAL},
        "blocks": [{"name": "rungs", "rungs": [3]}]}
# A guard against a hung command, not a speed limit: each command takes ~1 min on the idle 2-core box.
HUNG_COMMAND_S = 3600


@pytest.mark.slow
def test_nightly_passes_against_its_own_baseline_and_fails_a_worse_one(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    golden_path = tmp_path / "golden.json"
    ladder = [sys.executable, "-m", "ladder", "nightly", str(spec), "--baseline", str(golden_path),
              "--out", str(tmp_path / "runs"), "--json"]
    made = subprocess.run([*ladder, "--update-baseline", "--repeats", "2"], capture_output=True, text=True,
                          timeout=HUNG_COMMAND_S)
    assert made.returncode == 0, made.stderr
    golden = json.loads(golden_path.read_text())
    assert golden["noise"]["bpb_abs_spread"] == 0.0  # deterministic mode repeats bit for bit on one machine
    assert golden["machine"]["class"] == machine_info()["class"]  # measured where the trials ran: this machine
    # Tonight must look worse than the stored numbers: lower the golden BPB well past tolerance, and
    # claim a throughput no 2-core machine reaches (compared: the golden's class is tonight's).
    worse = json.loads(golden_path.read_text())
    for trial in worse["trials"].values():
        trial["bpb"] = {d: v - 5 * worse["tolerances"]["bpb_abs"] for d, v in trial["bpb"].items()}
        trial["tokens_per_second"] = 1e12
    golden_path.write_text(json.dumps(worse))
    out = subprocess.run(ladder, capture_output=True, text=True, timeout=HUNG_COMMAND_S)
    assert out.returncode == 1, out.stderr
    result = json.loads(out.stdout)
    assert result["throughput_compared"] and result["machine_class"] == golden["machine"]["class"]
    bpb = [c for c in result["comparisons"] if c["metric"].startswith("bpb/")]
    assert bpb and all(c["verdict"] == "regression" for c in bpb)
    assert [c["verdict"] for c in result["comparisons"] if c["metric"] == "log_tokens_per_second"] == ["regression"]
    # Against the true baseline the same numbers are within tolerance: BPB repeats exactly.
    for c in bpb:
        true_golden = golden["trials"][c["trial"]]["bpb"][c["metric"].split("/", 1)[1]]
        assert abs(c["current"] - true_golden) <= golden["tolerances"]["bpb_abs"]
    assert list((tmp_path / "runs").glob("report-*/report.md"))


@pytest.mark.parametrize("name", ["smoke", "lr_wd", "dropout", "nightly"])
def test_every_trial_of_a_spec_has_its_own_nightly_name(name):
    """The name was block/L/arm/seed: smoke's three LR points were one name, lr_wd's 81 trials three, and the
    measurement of one overwrote the others'. The grid offsets, TPP and dropout are in it now, where they vary."""
    from ladder.run.nightly import nightly_names, trial_name

    planned = plan_sweep(load_spec(name), where=name)
    names = nightly_names(planned, where=name)
    assert len(set(names.values())) == len(planned)
    assert all(names[p.key] == trial_name(p.trial) for p in planned)


def test_the_nightly_name_shows_what_a_trials_block_varies():
    from ladder.run.nightly import trial_name

    planned = plan_sweep(load_spec("lr_wd"), where="lr_wd")
    names = {trial_name(p.trial) for p in planned}
    assert "surface/L3/tpp2.5/base/s0" in names  # the centre: no offsets
    assert "surface/L3/tpp2.5/dlr-0.5/dlrwd+0.7/base/s0" in names
    dropout = {trial_name(p.trial) for p in plan_sweep(load_spec("dropout"), where="dropout")}
    assert all("/p" in n for n in dropout)


def test_two_trials_of_one_nightly_name_are_refused_before_anything_runs():
    from dataclasses import replace

    from ladder.run.nightly import nightly_names, trial_name

    first, second, _ = plan_sweep(load_spec("smoke"), where="smoke")
    twin = replace(second, trial=replace(second.trial, log_lr_offset=first.trial.log_lr_offset))
    with pytest.raises(LadderInputError) as err:
        nightly_names([first, twin], where="smoke.yaml")
    assert err.value.field == "blocks.lr" and trial_name(first.trial) in err.value.detail


def test_a_regression_in_any_grid_point_is_measured_and_caught(monkeypatch):
    """Smoke's three LR points: the centre's BPB regressed, and the nightly said ok (the other two points, later
    under the same name, overwrote its measurement)."""
    import types

    import mlflow.tracking

    from ladder.run.nightly import measure, nightly_names
    from ladder.run.orchestrate import SweepOutcome, TrialRow

    planned = plan_sweep(load_spec("smoke"), where="smoke")
    bpb = {f"run{i}": 3.0 for i in range(len(planned))}
    rows = [TrialRow(key=p.key, label=p.label, state="finished", run_id=f"run{i}") for i, p in enumerate(planned)]

    class Client:
        def __init__(self, uri):
            pass

        def get_run(self, run_id):
            return types.SimpleNamespace(data=types.SimpleNamespace(metrics={"final_bpb/web": bpb[run_id]}))

        def get_metric_history(self, run_id, metric):
            return [types.SimpleNamespace(value=1.0 if metric == "moe_rounds_mean" else 1000.0)]

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", Client)
    names = nightly_names(planned, where="smoke")
    golden = build_golden(load_spec("smoke"), [measure(SweepOutcome("smoke", "e", "u", rows), names)] * 2, HERE)
    assert len(golden["trials"]) == len(planned) == 3
    bpb["run0"] = 9.99  # the law's centre regresses
    report = compare(golden, measure(SweepOutcome("smoke", "e", "u", rows), names), "smoke", HERE)
    assert [(c.trial, c.metric) for c in report.regressions] == [(names[planned[0].key], "bpb/web")]


@pytest.mark.parametrize("trials, field", [({}, "trials"),
                                           ({"rungs/L3/base/s0": {"bpb": {}, "tokens_per_second": 1.0,
                                                                  "moe_rounds_mean": 1.0}},
                                            "trials.rungs/L3/base/s0.bpb")])
def test_an_empty_golden_is_refused_before_anything_runs(tmp_path, capsys, trials, field):
    """`trials: {}` passed, trained the whole nightly, then crashed drawing 0 plots; `bpb: {}` passed any BPB."""
    path = tmp_path / "golden.json"
    path.write_text(json.dumps({"tolerances": {"bpb_abs": 0.01, "tokens_per_second_log_ratio": 1.0,
                                               "moe_rounds_abs": 0.05}, "trials": trials}))
    with pytest.raises(LadderInputError) as err:
        load_golden(path)
    assert "empty" in err.value.detail and field in str(err.value)
    out = tmp_path / "out"
    rc = main(["nightly", "nightly", "--baseline", str(path), "--out", str(out)])
    assert rc == 2 and "empty" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("argv, says", [(["--repeats", "0"], "at least 2"),
                                        (["--repeats", "1", "--update-baseline"], "at least 2"),
                                        (["--repeats", "3"], "--update-baseline")])
def test_repeats_that_measure_nothing_or_are_ignored_are_refused(tmp_path, capsys, argv, says):
    rc = main(["nightly", "nightly", "--baseline", str(tmp_path / "g.json"), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and "--repeats" in err and says in err
    assert not any(tmp_path.iterdir())
