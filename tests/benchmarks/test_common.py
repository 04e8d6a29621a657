"""The benchmarks contract's checks (benchmarks/common.py): a utilisation above 1 is a failed
measurement, never a pass; values that are not finite fail; every other check is its comparison."""

from __future__ import annotations

import math

import pytest

from benchmarks.common import Check, Report, valid_range


def test_a_utilisation_above_one_fails_whatever_its_target():
    """train_step once reported moe_mfu_vs_measured_bf16_peak = 95.4 against a CPU's bf16 'peak' of
    ~1 GFLOP/s and called it ok (>= 0.30)."""
    report = Report("train_step")
    impossible = report.check("moe_mfu_vs_measured_bf16_peak", 95.4, ">=", 0.30)
    assert not impossible.ok and "outside the possible [0, 1]" in impossible.invalid
    assert impossible.to_dict()["ok"] is False and "failed measurement" in impossible.to_dict()["invalid"]
    for name in ("mfu", "whole_step_mfu", "forward_backward_mfu", "gemm_utilisation", "tensor_core_utilization"):
        assert valid_range(name) == (0.0, 1.0), name
        assert Check(name, 0.31, ">=", 0.30).ok and not Check(name, 1.01, ">=", 0.30).ok
        assert not Check(name, -0.1, "<=", 0.5).ok


def test_ratios_that_may_exceed_one_keep_their_comparison():
    for name in ("moe_over_dense_flop_rate", "muon_step_over_comm_floor", "two_workers_over_one", "mfuzzy_ratio"):
        assert valid_range(name) is None, name
        assert Check(name, 95.4, ">=", 0.7).ok
    ok = Check("moe_over_dense_flop_rate", 95.4, ">=", 0.7).to_dict()
    assert set(ok) == {"name", "value", "op", "target", "ok"} and ok["ok"] is True


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_value_that_is_not_finite_fails(value):
    for op, target in (("<=", math.inf), (">=", -math.inf), ("==", value)):
        check = Check("seconds_per_step", value, op, target)
        assert not check.ok and "not a finite" in check.invalid


def test_an_explicit_range_and_a_bad_op():
    assert not Report("x").check("share_of_step", 1.2, "<=", 5.0, valid=(0.0, 1.0)).ok
    assert Report("x").check("share_of_step", 0.2, "<=", 5.0, valid=(0.0, 1.0)).ok
    with pytest.raises(ValueError, match="op must be one of"):
        Check("mfu", 0.5, "=>", 0.3)


def test_the_reference_matmul_is_timed_where_the_work_ran_never_on_the_host_during_a_gpu_run(monkeypatch):
    """A GPU run once timed 2048³ bf16 matmuls on the host CPU for its `machine` section (minutes on a CPU
    without bf16 units, the GPU idle): a report made by a process that used CUDA times it on the GPU."""
    import torch

    import benchmarks.common as common

    timed = []
    monkeypatch.setattr(common, "measured_peak_bf16_flops", lambda size, device="cpu": timed.append(device) or 1.0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert Report("x").computed_on() == "cpu" and Report("x", device="cuda").computed_on() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)   # this process ran its work on a GPU
    assert Report("x").computed_on() == "cuda" and Report("x", device="cpu").computed_on() == "cpu"
    Report("x").to_dict(quick=True)
    assert timed == ["cuda"]
