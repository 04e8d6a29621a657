"""What the benchmarks' command lines refuse, and what they do without a GPU: `python -m benchmarks.gpu_suite`
refuses a budget that is not a finite positive number, an --out that is a file and an --only that names
no child or an unknown one (exit 2, one line, nothing run or written); without a CUDA device it starts
no child and says why, in seconds (it once timed 2048³ bf16 matmuls on the host CPU in each child, for
minutes); `python -m benchmarks --only` refuses unknown names before the machine's reference matmul is
timed."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import benchmarks.common as common
from benchmarks import gpu_rung, gpu_suite
from benchmarks.common import Report

cli = importlib.import_module("benchmarks.__main__")
REPO = Path(__file__).resolve().parents[2]


def _no_child(*args, **kwargs):
    raise AssertionError("a child was started")


def _no_calibration(*args, **kwargs):
    raise AssertionError("the reference matmul was timed")


# --- gpu_suite: bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["--budget-seconds", "nan"], "finite"),
    (["--budget-seconds", "inf"], "finite"),
    (["--budget-seconds", "-3"], "> 0"),
    # budget 0.5: were the empty --only taken for "all children", every child is skipped at once
    (["--only", ",", "--budget-seconds", "0.5"], "gpu_rung,jax_gpu_rung,block_kernels,muon"),
    (["--only", " , ", "--budget-seconds", "0.5"], "gpu_rung,jax_gpu_rung,block_kernels,muon"),
    (["--only", "", "--budget-seconds", "0.5"], "gpu_rung,jax_gpu_rung,block_kernels,muon"),
    (["--only", "muon,nosuch", "--budget-seconds", "0.5"], "unknown nosuch"),
])
def test_the_suite_refuses_bad_flags_in_one_line_with_exit_2(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.setattr(gpu_suite, "_run_child", _no_child)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        gpu_suite.main(["--out", str(out), *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m benchmarks.gpu_suite: error:") and err.count("\n") == 1, err
    assert says in err and "Traceback" not in err
    if argv[0] == "--only":
        assert all(name in err for name in gpu_suite.SHARES)
    assert not out.exists()


def test_the_suite_refuses_an_out_that_is_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_suite, "_run_child", _no_child)
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    for out in (afile, afile / "below"):
        with pytest.raises(SystemExit) as stop:
            gpu_suite.main(["--out", str(out), "--budget-seconds", "0.5"])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--out" in err and "Traceback" not in err, err
    assert afile.read_text() == "keep me\n"


def test_a_budget_that_is_not_finite_is_refused_by_the_api_too(tmp_path):
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            gpu_suite.plan_limits(bad, {}, list(gpu_suite.SHARES))
        with pytest.raises(ValueError, match="finite"):
            gpu_suite.run_suite(tmp_path / "x", budget_seconds=bad)
    with pytest.raises(ValueError, match="distinct names"):
        gpu_suite.run_suite(tmp_path / "x", budget_seconds=1.0, only=[])
    assert not (tmp_path / "x").exists()


# --- gpu_suite and its children without a GPU ---------------------------------------------------

def test_without_a_cuda_device_the_suite_starts_no_child_and_says_why(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_suite, "gpu_device", lambda: None)
    monkeypatch.setattr(gpu_suite, "cuda_missing", lambda device: "no CUDA device: nvidia-smi lists no GPU (faked)")
    monkeypatch.setattr(gpu_suite, "_run_child", _no_child)
    code = gpu_suite.main(["--out", str(tmp_path), "--json"])
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert code == 1 and summary == json.loads((tmp_path / "summary.json").read_text())
    assert summary["results"]["ran"] is False and "no CUDA device" in summary["results"]["reason"]
    rows = summary["results"]["children"]
    assert [r["name"] for r in rows] == list(gpu_suite.SHARES)
    assert all(r["status"] == "skipped" and "no CUDA device" in r["reason"] for r in rows)
    assert "no CUDA device" in captured.err and summary["checks"] == []


def test_with_a_gpu_listed_by_nvidia_smi_nothing_is_probed():
    """The GPU machine's run goes as before: nvidia-smi's device is enough, no probe process is started."""
    assert gpu_suite.cuda_missing({"name": "NVIDIA H200", "memory_mib": 143771, "driver": "570"}) is None


def test_the_suite_run_as_a_command_without_a_gpu_ends_at_once(tmp_path):
    """nvidia-smi out of PATH and CUDA hidden from torch: the command probes torch in a child, skips every
    child and writes its summary. (The guard only stops a hung run; the skip takes seconds.)"""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_suite", "--out", str(tmp_path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.terminate()                # the suite takes its running child with it
        _, err = proc.communicate(timeout=60)
        raise AssertionError(f"the suite without a GPU was still running after 90 s: {err[-2000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert "no CUDA device" in err and "Traceback" not in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["status"] for r in summary["results"]["children"]] == ["skipped"] * len(gpu_suite.SHARES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_gpu_benchmark_that_did_not_run_times_no_reference_matmul(capsys, monkeypatch):
    """gpu_rung's full mode without a GPU reports ran: false at once, its machine section untimed."""
    monkeypatch.setattr(gpu_rung.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(common, "measured_peak_bf16_flops", _no_calibration)
    assert gpu_rung.main(["--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["results"]["ran"] is False and payload["checks"] == []
    assert "cores" in payload["machine"] and "peak_bf16_flops_measured" not in payload["machine"]


def test_a_report_of_a_run_that_happened_still_times_its_reference_matmul(monkeypatch):
    timed = []
    monkeypatch.setattr(common, "measured_peak_bf16_flops", lambda size, device="cpu": timed.append(size) or 2.0)
    machine = Report("x", {"ran": True}, device="cpu").to_dict(quick=True)["machine"]
    assert timed == [common.QUICK_PEAK_MATMUL_SIZE] and machine["peak_bf16_flops_measured"] == 2.0
    assert Report("x", {"n": 1}, device="cpu").to_dict(quick=True)["machine"]["peak_bf16_matmul_device"] == "cpu"
    assert "peak_bf16_flops_measured" not in Report("x", {"ran": False}, device="cpu").to_dict()["machine"]
    assert len(timed) == 2


# --- python -m benchmarks --only ---------------------------------------------------------------------

@pytest.mark.parametrize("only, says", [("nosuch,moe_typo", "unknown nosuch,moe_typo"), ("moe,nosuch", "unknown nosuch"),
                                        (",", "names no benchmark")])
@pytest.mark.parametrize("quick", [[], ["--quick"]])
def test_benchmarks_refuses_unknown_names_before_timing_anything(capsys, monkeypatch, only, says, quick):
    monkeypatch.setattr(cli, "machine_info", _no_calibration)
    monkeypatch.setattr(common, "measured_peak_bf16_flops", _no_calibration)
    with pytest.raises(SystemExit) as stop:
        cli.main([*quick, "--only", only, "--json"])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and says in captured.err, captured.err
    assert "the benchmarks are" in captured.err and "moe" in captured.err and "muon" in captured.err


def test_benchmarks_runs_the_names_it_is_given(capsys, monkeypatch):
    monkeypatch.setattr(cli, "machine_info", lambda quick: {"cores": 1})
    ran = []

    def fake_module(name):
        short = name.rsplit(".", 1)[-1]
        return SimpleNamespace(run=lambda quick: ran.append(short) or SimpleNamespace(
            to_dict=lambda quick: {"results": {"n": 1}, "checks": []}))

    monkeypatch.setattr(cli.importlib, "import_module", fake_module)
    assert cli.main(["--quick", "--only", "muon, moe", "--json"]) == 0
    assert ran == ["moe", "muon"] and set(json.loads(capsys.readouterr().out)["results"]) == {"moe", "muon"}
