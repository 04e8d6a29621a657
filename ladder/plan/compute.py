"""Compute planner: training FLOPs → wall-clock days and GPU-hours on a pool.

wall_seconds = train_flops / (gpus · peak · MFU · goodput). MFU counts model FLOPs only (no
recompute, no optimizer), as the report does; goodput is the fraction of wall time spent making
progress (restarts and stalls excluded).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from ladder.errors import LadderInputError
from ladder.plan.values import finite_real

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class ComputePlan:
    gpus: int
    peak_flops_per_gpu: float
    mfu: float
    goodput: float
    train_flops: float

    @property
    def effective_flops_per_second(self) -> float:
        return self.gpus * self.peak_flops_per_gpu * self.mfu * self.goodput

    @property
    def wall_seconds(self) -> float:
        return self.train_flops / self.effective_flops_per_second

    @property
    def wall_clock_days(self) -> float:
        return self.wall_seconds / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.wall_seconds / 3600.0


def plan_compute(train_flops: float, *, gpus: int, peak_flops_per_gpu: float, mfu: float, goodput: float) -> ComputePlan:
    if isinstance(gpus, bool) or not isinstance(gpus, numbers.Integral) or gpus <= 0:
        raise LadderInputError(f"must be a positive number of GPUs, got {gpus!r}", field="--gpus")
    if not (finite_real(mfu) and 0 < mfu <= 1):
        raise LadderInputError(f"must be in (0, 1], got {mfu!r}", field="--mfu")
    if not (finite_real(goodput) and 0 < goodput <= 1):
        raise LadderInputError(f"must be in (0, 1], got {goodput!r}", field="--goodput")
    if not (finite_real(peak_flops_per_gpu) and finite_real(train_flops) and peak_flops_per_gpu > 0 and train_flops > 0):
        raise LadderInputError(f"peak FLOPs and training FLOPs must be positive, finite numbers, got "
                               f"{peak_flops_per_gpu!r} and {train_flops!r}", field="gpu_pool")
    return ComputePlan(gpus=int(gpus), peak_flops_per_gpu=float(peak_flops_per_gpu), mfu=float(mfu),
                       goodput=float(goodput), train_flops=float(train_flops))
