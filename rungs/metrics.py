"""Training-job measurements: the device's specification peak (the MFU denominator), moving
medians, and the divergence rule. (The per-job start-up bf16 matmul timing that used to be the
denominator is gone: it cost 20-50 s on CPUs without bf16 units and measured load, not a peak.)

MFU = achieved model FLOP/s ÷ (devices × the device's dense bf16 peak from its specification),
the definition published MFU numbers use (PaLM's appendix B; torchtitan, Megatron and MaxText
report against the same spec peaks). A timed matmul is not a peak: on a busy CPU one read 4.59
(459% "MFU"), and on an H100 a small matmul reaches well under the spec, inflating MFU 2-3x.
Achieved TFLOP/s per device is reported beside MFU, so a wrong table entry shows as an impossible
pair. A config's `peak_flops_per_device` overrides the table (an unlisted GPU, a clock-capped part).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from statistics import median

log = logging.getLogger(__name__)

# Dense (no 2:4 sparsity) bf16 tensor-core peak FLOP/s per GPU, from NVIDIA's datasheets, which
# quote the sparse figure (2x) with a footnote; halved here:
#   H100 SXM5 "BF16 Tensor Core 1,979 TFLOPS*"   -> 989e12;  H100 PCIe 1,513* -> 756e12;
#   H100 NVL 1,671* -> 835e12 (H100 datasheet, 2023);  H200 SXM 1,979* -> 989e12 (H200 datasheet);
#   A100 (SXM and PCIe) "BF16 Tensor Core 312 TFLOPS | 624 TFLOPS*" -> 312e12 (A100 datasheet);
#   HGX B200 "FP16/BF16 Tensor Core 36 PFLOPS*" for 8 GPUs -> 2.25e15 per GPU;
#   GB200 NVL72 "FP16/BF16 Tensor Core 360 PFLOPS*" for 72 GPUs -> 2.5e15 per GPU;
#   L40S 733* -> 366e12 (L40S datasheet).
# Matched against torch.cuda.get_device_name() in order: the first entry whose every word occurs wins.
GPU_PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H200 NVL", 835e12),  # H200 NVL 1,671*
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("A100", 312e12),
    ("L40S", 366e12),
)
# A CPU has no bf16 spec sheet a job can read; its nominal peak is the vector-FMA peak of a server
# core (2 FMA units x 16 fp32 lanes of AVX-512 x 2 FLOPs x 3.5 GHz = 224 GFLOP/s) times the cores
# (intra-op threads) the job uses. CPU jobs run fp32 by default; AMX bf16 parts can exceed this, so
# set peak_flops_per_device for them.
CPU_PEAK_FLOPS_PER_CORE = 2 * 16 * 2 * 3.5e9


@dataclass(frozen=True)
class DevicePeak:
    """The MFU denominator of one device: FLOP/s and where the number came from."""

    flops: float | None  # None: an unknown GPU and no config value (MFU is then not reported)
    source: str  # "config", "spec: H100", "cpu nominal: 4 cores x 2.24e11"


def device_peak(device: str, *, override: float | None = None, cores: float | None = None,
                device_name: str | None = None) -> DevicePeak:
    """The spec peak of one device the job runs on (`override`, e.g. the config's, wins). On the CPU,
    `cores` is the device's share of the cores (a fraction where several host devices share them)."""
    if override is not None:
        return DevicePeak(float(override), "config")
    import torch  # here, not at the top: the training loop (rungs.loop) imports no framework

    if device == "cpu":
        n = cores or torch.get_num_threads()
        return DevicePeak(n * CPU_PEAK_FLOPS_PER_CORE, f"cpu nominal: {n:.3g} cores x {CPU_PEAK_FLOPS_PER_CORE:.3g}")
    name = device_name if device_name is not None else torch.cuda.get_device_name()
    words = name.upper().split()
    for pattern, flops in GPU_PEAK_BF16_FLOPS:
        if all(any(p.upper() in w for w in words) for p in pattern.split()):
            return DevicePeak(flops, f"spec: {pattern}")
    log.warning("no specification peak known for %r: MFU is not reported; set peak_flops_per_device", name)
    return DevicePeak(None, f"unknown device {name!r}")


@dataclass(frozen=True)
class Utilisation:
    """MFU and the achieved rate behind it. `mfu_capped`: the achieved rate exceeded the peak, so the
    peak is wrong (a mislabelled device, a bad override); MFU is reported as 1.0 and flagged."""

    mfu: float
    achieved_flops_per_device: float
    mfu_capped: bool


def utilisation(model_flops: float, seconds: float, *, devices: int, peak: DevicePeak) -> Utilisation:
    """MFU = model FLOPs / seconds / (devices x peak), never above 1 (see `Utilisation`)."""
    if seconds <= 0 or devices <= 0:
        return Utilisation(0.0, 0.0, False)
    achieved = model_flops / seconds / devices
    if peak.flops is None:
        return Utilisation(math.nan, achieved, False)
    mfu = achieved / peak.flops
    if mfu > 1.0:
        log.warning("achieved %.3g FLOP/s per device exceeds the peak %.3g (%s): the peak is wrong; MFU "
                    "reported as 1.0 (mfu_capped)", achieved, peak.flops, peak.source)
        return Utilisation(1.0, achieved, True)
    return Utilisation(mfu, achieved, False)


class MovingMedian:
    """Median of the last `window` values (the report's grad-norm monitor uses 1000 steps)."""

    def __init__(self, window: int, values: list[float] | None = None) -> None:
        self.values: deque[float] = deque(values or [], maxlen=window)

    def add(self, value: float) -> float:
        self.values.append(value)
        return median(self.values)

    @property
    def value(self) -> float:
        return median(self.values) if self.values else math.nan


class DivergenceRule:
    """A run diverged when its loss is not finite, or, after `warmup_steps`, exceeds
    `spike_factor` × the median of the previous `window` losses."""

    def __init__(self, spike_factor: float, warmup_steps: int, window: int = 100,
                 history: list[float] | None = None) -> None:
        self.spike_factor = spike_factor
        self.warmup_steps = warmup_steps
        self.recent = MovingMedian(window, history)

    def check(self, step: int, loss: float) -> str | None:
        """Reason the run diverged at this step, or None."""
        if not math.isfinite(loss):
            return f"non-finite loss {loss} at step {step}"
        reason = None
        if step >= self.warmup_steps and self.recent.values:
            ref = self.recent.value
            if loss > self.spike_factor * ref:
                reason = f"loss spike at step {step}: {loss:.4g} > {self.spike_factor:g} × running median {ref:.4g}"
        self.recent.add(loss)
        return reason

    def state(self) -> list[float]:
        return list(self.recent.values)
