"""Compute planner: training FLOPs → wall-clock days and GPU-hours on a pool.

wall_seconds = train_flops / (gpus · peak · MFU · goodput). MFU counts model FLOPs only (no
recompute, no optimizer), as the report does; goodput is the fraction of wall time spent making
progress (restarts and stalls excluded).
"""

from __future__ import annotations

from dataclasses import dataclass

from ladder.errors import LadderInputError

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
    if gpus <= 0:
        raise LadderInputError(f"must be a positive number of GPUs, got {gpus}", field="--gpus")
    if not 0 < mfu <= 1:
        raise LadderInputError(f"must be in (0, 1], got {mfu}", field="--mfu")
    if not 0 < goodput <= 1:
        raise LadderInputError(f"must be in (0, 1], got {goodput}", field="--goodput")
    if peak_flops_per_gpu <= 0 or train_flops <= 0:
        raise LadderInputError("peak FLOPs and training FLOPs must be positive", field="gpu_pool")
    return ComputePlan(gpus=gpus, peak_flops_per_gpu=peak_flops_per_gpu, mfu=mfu, goodput=goodput, train_flops=train_flops)
