"""Nightly regression: tolerances from measured spread, one-sided verdicts, the report, exit codes."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import yaml

from ladder.cli import main
from ladder.errors import LadderInputError
from ladder.nightly import (FLOOR_BPB_ABS, FLOOR_TOKENS_PER_SECOND_LOG_RATIO, SAFETY_FACTOR, GOLDENS_DIR,
                            TrialMeasurement, build_golden, compare, load_golden)
from ladder.nightly_report import write_report
from sweeps.spec import load_spec


def m(bpb: dict, tps: float, rounds: float) -> TrialMeasurement:
    return TrialMeasurement(bpb=bpb, tokens_per_second=tps, moe_rounds_mean=rounds, key="k", run_id="r")


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
    golden = build_golden(load_spec("nightly"), [RUNS[0], RUNS[0]], machine={})
    tol = golden["tolerances"]["bpb_abs"]
    name = "rungs/L3/base/s0"

    def verdicts(bpb_code: float, tps: float, rounds: float) -> dict[str, str]:
        report = compare(golden, {name: m({"code": bpb_code, "web": 4.0}, tps, rounds)}, "nightly")
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
    missing = compare(golden, {}, "nightly")
    assert [c.verdict for c in missing.comparisons] == ["missing"] and missing.regressions


def test_report_has_every_comparison_and_its_plots(tmp_path):
    golden = build_golden(load_spec("nightly"), RUNS, machine={})
    report = compare(golden, {"rungs/L3/base/s0": m({"code": 9.0, "web": 4.0}, 10_000.0, 1.0)}, "nightly")
    path = write_report(report, golden, tmp_path)
    text = path.read_text()
    assert "FAIL (1 regression(s))" in text and "**REGRESSION**" in text
    assert text.count("| rungs/L3/base/s0 |") == len(report.comparisons) == 4
    for png in ("bpb.png", "throughput.png"):
        assert (tmp_path / png).stat().st_size > 1000 and f"({png})" in text


def test_shipped_golden_file_matches_the_shipped_spec():
    golden = load_golden(GOLDENS_DIR / "nightly.json")
    spec = load_spec("nightly")
    assert golden["spec"] == spec.name and golden["repeats"] >= 2
    assert set(golden["trials"]) == {f"rungs/L{L}/base/s0" for L in spec.blocks[0].rungs}
    for trial in golden["trials"].values():
        assert trial["bpb"] and all(0.0 < v < 8.0 for v in trial["bpb"].values())  # below 8 bits/byte (uniform bytes)


def test_missing_golden_exits_2_before_running_anything(tmp_path, capsys):
    rc = main(["nightly", "nightly", "--baseline", str(tmp_path / "none.json"), "--out", str(tmp_path)])
    assert rc == 2
    assert "--update-baseline" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    with pytest.raises(LadderInputError):
        load_golden(tmp_path / "none.json")


TINY = {"name": "tiny_nightly", "recipe": "cpu-demo", "max_steps": 6, "seeds": [0], "max_concurrent": 1,
        "resources": {"cpus": 1}, "overrides": {"deterministic": True}, "blocks": [{"name": "rungs", "rungs": [3]}]}


@pytest.mark.slow
def test_nightly_passes_against_its_own_baseline_and_fails_a_worse_one(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    golden_path = tmp_path / "golden.json"
    ladder = [sys.executable, "-m", "ladder", "nightly", str(spec), "--baseline", str(golden_path),
              "--out", str(tmp_path / "runs"), "--json"]
    made = subprocess.run([*ladder, "--update-baseline", "--repeats", "2"], capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stderr
    golden = json.loads(golden_path.read_text())
    assert golden["noise"]["bpb_abs_spread"] == 0.0  # deterministic mode repeats bit for bit on one machine
    # Tonight must look worse than the stored numbers: lower the golden BPB well past tolerance.
    worse = json.loads(golden_path.read_text())
    for trial in worse["trials"].values():
        trial["bpb"] = {d: v - 5 * worse["tolerances"]["bpb_abs"] for d, v in trial["bpb"].items()}
    golden_path.write_text(json.dumps(worse))
    out = subprocess.run(ladder, capture_output=True, text=True, timeout=900)
    assert out.returncode == 1, out.stderr
    result = json.loads(out.stdout)
    bpb = [c for c in result["comparisons"] if c["metric"].startswith("bpb/")]
    assert bpb and all(c["verdict"] == "regression" for c in bpb)
    # Against the true baseline the same numbers are within tolerance: BPB repeats exactly.
    for c in bpb:
        true_golden = golden["trials"][c["trial"]]["bpb"][c["metric"].split("/", 1)[1]]
        assert abs(c["current"] - true_golden) <= golden["tolerances"]["bpb_abs"]
    assert list((tmp_path / "runs").glob("report-*/report.md"))
