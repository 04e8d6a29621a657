"""What a sweep will cost before it runs: each trial's training FLOPs, GPU-hours and wall-clock on the
recipe's GPU pool at a stated MFU and goodput, and (when the spec names its GPU's memory) the per-rank
peak of the layout it launches with.

GPU-hours = train_flops / (peak bf16 FLOP/s per GPU × MFU × goodput) / 3600, the compute planner's
arithmetic (`ladder.plan.compute`): model FLOPs only (the config's training FLOPs per token × its
tokens), so evaluation, recompute and the optimizer step are in the MFU, not in the FLOPs. A trial capped
by `max_steps` trains that many steps' tokens. Wall-clock is a trial's GPU-hours over the GPUs it holds (workers × GPUs per worker); a
CPU-only trial has GPU-hours (what it would take on the pool) but no wall-clock.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ladder.errors import LadderInputError
from ladder.plan.compute import plan_compute
from ladder.plan.layout_search import DEFAULT_HEADROOM, trial_memory
from ladder.plan.recipe import Recipe
from ladder.plan.byte_sizes import format_bytes
from sweeps.plan import PlannedTrial

__all__ = ["SweepCost", "TrialCost", "check_fits_memory", "cost_sweep", "trained_steps"]


@dataclass(frozen=True)
class TrialCost:
    key: str
    trial: str
    L: int
    tpp: float
    lr: float
    weight_decay: float
    steps: int  # the steps it trains: the plan's, or max_steps when that is fewer
    tokens: float
    train_flops: float
    gpus: float  # held while it runs: workers × GPUs per worker
    gpu_hours: float
    wall_clock_days: float | None  # None for a CPU-only trial
    peak_bytes: int | None = None  # per rank, when the spec names its GPU's memory
    usable_bytes: int | None = None

    @property
    def fits(self) -> bool | None:
        return None if self.peak_bytes is None else self.peak_bytes <= self.usable_bytes

    def to_dict(self) -> dict:
        return asdict(self) | {"fits": self.fits}


@dataclass(frozen=True)
class SweepCost:
    pool: str
    peak_flops_per_gpu: float
    mfu: float
    goodput: float
    trials: list[TrialCost]

    def totals(self) -> dict:
        days = [t.wall_clock_days for t in self.trials if t.wall_clock_days is not None]
        return {"trials": len(self.trials), "train_flops": sum(t.train_flops for t in self.trials),
                "gpu_hours": sum(t.gpu_hours for t in self.trials),
                "longest_trial_days": max(days) if days else None,
                "gpus_per_trial_max": max((t.gpus for t in self.trials), default=0)}

    def to_dict(self) -> dict:
        return {"pool": self.pool, "peak_flops_per_gpu": self.peak_flops_per_gpu, "mfu": self.mfu,
                "goodput": self.goodput, "trials": [t.to_dict() for t in self.trials], "totals": self.totals()}


def trained_steps(config: dict) -> int:
    """The optimizer steps a trial trains: its plan's, or `max_steps` when that is fewer."""
    steps, cap = int(config["steps"]), config.get("max_steps")
    return min(steps, int(cap)) if cap else steps


def cost_sweep(planned: list[PlannedTrial], recipe: Recipe, *, mfu: float | None = None,
               goodput: float | None = None) -> SweepCost:
    """Each trial's cost on `recipe`'s GPU pool; `mfu` and `goodput` default to the pool's."""
    pool = recipe.gpu_pool
    mfu = pool.default_mfu if mfu is None else mfu
    goodput = pool.default_goodput if goodput is None else goodput
    memory: dict[tuple, tuple[int, int]] = {}  # trials that differ only in LR/WD share one layout
    out = []
    for p in planned:
        config, res = p.config, p.trial.resources
        steps = trained_steps(config)
        tokens = float(steps * config["batch_sequences"] * config["seq_len"])
        flops = float(config["flops_per_token"]) * tokens  # training FLOPs per token (ladder.plan.counting)
        gpus = res.workers * res.gpus
        compute = plan_compute(flops, gpus=1, peak_flops_per_gpu=pool.peak_bf16_flops_per_gpu, mfu=mfu,
                               goodput=goodput)
        peak = usable = None
        if res.gpu_memory_bytes is not None:
            ident = (p.trial.L, p.trial.max_steps, res, tuple(sorted((k, repr(v)) for k, v in config.items()
                                                                     if k not in ("lr", "weight_decay", "seed"))))
            if ident not in memory:
                _, mem = trial_memory(config, workers=res.workers, gpu=res.gpus > 0, ep=res.ep,
                                      device_memory_bytes=res.gpu_memory_bytes)
                memory[ident] = (mem.total, int(res.gpu_memory_bytes * (1 - DEFAULT_HEADROOM)))
            peak, usable = memory[ident]
        out.append(TrialCost(
            key=p.key, trial=p.label, L=int(config["L"]), tpp=float(config["tpp"]), lr=float(config["lr"]),
            weight_decay=float(config["weight_decay"]), steps=steps,
            tokens=tokens, train_flops=flops, gpus=gpus, gpu_hours=compute.gpu_hours,
            wall_clock_days=compute.wall_clock_days / gpus if gpus else None, peak_bytes=peak, usable_bytes=usable))
    return SweepCost(pool=pool.name, peak_flops_per_gpu=pool.peak_bf16_flops_per_gpu, mfu=mfu, goodput=goodput,
                     trials=out)


def check_fits_memory(cost: SweepCost, *, where: str) -> None:
    """Refuse a sweep whose trial's per-rank peak exceeds its GPU's memory less the planner's headroom."""
    for t in cost.trials:
        if t.fits is False:
            raise LadderInputError(
                f"trial {t.trial} needs {format_bytes(t.peak_bytes)} per rank at {t.gpus:g} GPUs, more than the "
                f"{format_bytes(t.usable_bytes)} usable of resources.gpu_memory ({DEFAULT_HEADROOM:.0%} kept free); "
                f"give it more workers, a smaller micro_batch_sequences or activation_checkpointing (`ladder plan "
                f"RECIPE --gpu-memory SIZE` shows the smallest layout that fits)", where=where, field="resources")
