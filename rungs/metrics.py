"""Training-job measurements: the device's bf16 matmul peak (the MFU denominator), moving
medians, and the divergence rule.

The peak is measured here, at job start-up, on the device the job runs on (rungs must not
import `benchmarks`); MFU = achieved model FLOP/s ÷ this peak.
"""

from __future__ import annotations

import math
import time
from collections import deque
from statistics import median

import torch

_PEAK: dict[tuple[str, int], float] = {}


def measure_peak_bf16_flops(size: int = 1024, repeats: int = 5, device: str = "cpu") -> float:
    """Median bf16 FLOP/s of a size³ matmul on `device` (cached per process)."""
    key = (device, size)
    if key not in _PEAK:
        # A private generator: measuring must not move the global RNG the run's dropout draws from.
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(size, size, dtype=torch.bfloat16, device=device, generator=gen)
        b = torch.randn(size, size, dtype=torch.bfloat16, device=device, generator=gen)
        for _ in range(2):
            a @ b
        samples = []
        for _ in range(repeats):
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            a @ b
            if device != "cpu":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
        _PEAK[key] = 2.0 * size**3 / median(samples)
    return _PEAK[key]


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
