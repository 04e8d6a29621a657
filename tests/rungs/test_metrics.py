"""MFU against the device's specification peak: the table holds the vendors' dense bf16 numbers, MFU
can never exceed 1 (a peak below the achieved rate is flagged and capped), and a training job
reports MFU, achieved TFLOP/s per device and where its peak came from, with no start-up timing."""

from __future__ import annotations

import math

import pytest

import rungs.metrics as metrics
from rungs.metrics import GPU_PEAK_BF16_FLOPS, DevicePeak, device_peak, utilisation
from rungs.train import train
from tests.rungs.train_helpers import tiny_config


@pytest.mark.parametrize("name, flops", [
    ("NVIDIA H100 80GB HBM3", 989e12),  # SXM5
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA B200", 2.25e15),
    ("NVIDIA GB200", 2.5e15),
])
def test_known_gpus_get_their_dense_bf16_spec_peak(name, flops):
    peak = device_peak("cuda", device_name=name)
    assert peak.flops == flops and peak.source.startswith("spec")


def test_the_table_holds_dense_not_sparse_figures():
    # The fastest dense bf16 part listed is GB200 at 2.5 PFLOP/s; a sparse (2x) figure would exceed it.
    for pattern, flops in GPU_PEAK_BF16_FLOPS:
        assert 1e14 <= flops <= 2.5e15, pattern


def test_an_unknown_gpu_reports_no_mfu_unless_the_config_names_its_peak():
    unknown = device_peak("cuda", device_name="Some Future Accelerator")
    assert unknown.flops is None
    assert math.isnan(utilisation(1e15, 1.0, devices=1, peak=unknown).mfu)
    assert device_peak("cuda", override=5e14, device_name="Some Future Accelerator") == DevicePeak(5e14, "config")


def test_mfu_is_bounded_by_one_and_a_wrong_peak_is_flagged():
    peak = DevicePeak(1e12, "config")
    use = utilisation(4e12, 1.0, devices=2, peak=peak)  # 2e12 per device on a 1e12 device: impossible
    assert use.mfu == 1.0 and use.mfu_capped and use.achieved_flops_per_device == 2e12
    fine = utilisation(1e12, 1.0, devices=2, peak=peak)
    assert fine.mfu == 0.5 and not fine.mfu_capped


def test_cpu_peak_is_cores_times_a_nominal_per_core_figure():
    peak = device_peak("cpu", cores=4)
    assert peak.flops == 4 * metrics.CPU_PEAK_FLOPS_PER_CORE and "4 cores" in peak.source


def test_a_training_job_reports_mfu_against_the_spec_peak(tmp_path):
    assert not hasattr(metrics, "measure_peak_bf16_flops")  # no per-job start-up timing
    res = train(tiny_config(max_steps=2), run_dir=tmp_path / "a", progress=False)
    assert 0 < res.mfu < 1 and not res.mfu_capped
    assert res.peak_flops_per_device == metrics.CPU_PEAK_FLOPS_PER_CORE  # threads=1: one core
    achieved = res.train_flops / (res.tokens / res.tokens_per_second)
    assert res.achieved_tflops_per_device * 1e12 == pytest.approx(achieved)
    assert res.mfu == pytest.approx(achieved / res.peak_flops_per_device)
    # A config whose peak is absurdly low: MFU says 1.0 and the result says the peak is wrong.
    low = train(tiny_config(max_steps=2, peak_flops_per_device=1.0), run_dir=tmp_path / "b", progress=False)
    assert low.mfu == 1.0 and low.mfu_capped and low.peak_source == "config"
