"""The layout search of the memory planner: the smallest GPU layout a rung fits in, and the expert-parallel
size and MoE capacity factor a multi-worker sweep trial launches with.

Each candidate layout is priced by the per-rank byte model (`ladder.plan.rank_memory.memory_breakdown`);
the search walks rank counts from part of one node up to `max_gpus`, and within each the activation
checkpointing, micro-batch and expert-parallel sizes the rung's batch and experts allow. Pure
arithmetic, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ladder.errors import LadderInputError
from ladder.plan.byte_sizes import format_bytes, parse_bytes
from ladder.plan.compute import plan_compute
from ladder.plan.expert_memory import planned_capacity_factor
from ladder.plan.rank_memory import CHECKPOINTING, PRECISIONS, Layout, MemoryBreakdown, memory_breakdown
from ladder.plan.values import finite_real
from rungs.architecture import Architecture

__all__ = ["DEFAULT_HEADROOM", "DEFAULT_MAX_GPUS", "LayoutChoice", "candidate_worlds", "choose_layout", "gpus_for_days",
           "planned_expert_parallel", "trial_capacity_factor", "trial_memory"]

DEFAULT_HEADROOM = 0.10  # of device memory, kept for the CUDA context, NCCL and fragmentation
DEFAULT_MAX_GPUS = 4096


@dataclass(frozen=True)
class LayoutChoice:
    layout: Layout
    memory: MemoryBreakdown
    batch_sequences: int
    gpus_per_node: int
    device_bytes: int
    headroom: float

    @property
    def nodes(self) -> int:
        return math.ceil(self.layout.world / self.gpus_per_node)

    @property
    def usable_bytes(self) -> int:
        return int(self.device_bytes * (1 - self.headroom))

    def to_dict(self) -> dict[str, Any]:
        return {**self.layout.to_dict(), "gpus": self.layout.world, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "gpu_memory_bytes": self.device_bytes,
                "usable_bytes": self.usable_bytes, "headroom": self.headroom,
                "accumulation_steps": self.batch_sequences // self.layout.world // self.layout.micro_batch_sequences,
                # what to set: the training config's keys (its micro-batch counts the whole job's
                # sequences) and the launch's workers and ep
                "train_config": {"micro_batch_sequences": self.layout.micro_batch_sequences * self.layout.world,
                                 "activation_checkpointing": self.layout.checkpointing,
                                 "precision": self.layout.precision,
                                 "capacity_factor": self.layout.capacity_factor},
                "resources": {"workers": self.layout.world, "ep": self.layout.ep}}


def _divisors(n: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0]


def candidate_worlds(batch_sequences: int, gpus_per_node: int, max_gpus: int) -> list[int]:
    """Rank counts in increasing order: part of one node (divisors of gpus_per_node), then whole
    nodes; each must split the batch evenly (`rungs.parallel.engine`)."""
    partial = _divisors(gpus_per_node)
    whole = list(range(2 * gpus_per_node, max_gpus + 1, gpus_per_node))
    return [w for w in partial + whole if w <= max_gpus and batch_sequences % w == 0]


def _valid_eps(arch: Architecture, world: int, group_size: int | None) -> list[int]:
    out = []
    for ep in _divisors(world):
        if arch.n_experts % ep:
            continue
        local = arch.n_experts // ep
        if ep > 1 and local % min(group_size or arch.n_experts, local):  # ExpertParallelExperts' group rule
            continue
        out.append(ep)
    return out


def _device_bytes(value: object) -> int:
    """One GPU's memory in bytes: a whole number, or a size as people write it ('80GB', `parse_bytes`)."""
    if isinstance(value, str):
        return parse_bytes(value, field="gpu_memory_bytes")
    if not (finite_real(value) and value >= 1):
        raise LadderInputError(f"must be a memory size in bytes (a positive number, or text such as '80GB'), got "
                               f"{value!r}", field="gpu_memory_bytes")
    return int(value)


def choose_layout(arch: Architecture, *, batch_sequences: int, gpu_memory_bytes: int, gpus_per_node: int = 8,
                  precision: str = "bf16", headroom: float = DEFAULT_HEADROOM, max_gpus: int = DEFAULT_MAX_GPUS,
                  checkpointing: tuple[str, ...] = CHECKPOINTING, lb_loss: bool = True, z_loss: bool = False,
                  loss: str | None = None, min_gpus: int = 1) -> LayoutChoice:
    """The smallest layout of at least `min_gpus` GPUs whose per-rank peak fits `gpu_memory_bytes` ×
    (1 − headroom) (`min_gpus`: e.g. the GPUs a wall-clock budget needs, `gpus_for_days`).

    Order: fewest GPUs; then the least recompute (checkpointing none, selective, full); then the
    largest micro-batch (fewest accumulation steps); then ep within one node before ep across
    nodes; then the least memory. An expert-parallel layout runs at the planner's capacity factor
    (`ladder.plan.expert_memory.PLANNED_CAPACITY_FACTOR`): all-to-all buffers and send volume at
    1.5x the balanced load instead of ep x. Raises LadderInputError saying why when nothing fits.
    """
    for name, value in (("gpus_per_node", gpus_per_node), ("max_gpus", max_gpus), ("batch_sequences", batch_sequences),
                        ("min_gpus", min_gpus)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LadderInputError(f"must be a positive integer, got {value!r}", field=name)
    if not (finite_real(headroom) and 0 <= headroom < 1):
        raise LadderInputError(f"must be a fraction in [0, 1), got {headroom!r}", field="headroom")
    gpu_memory_bytes = _device_bytes(gpu_memory_bytes)
    if precision not in PRECISIONS:
        raise LadderInputError(f"must be one of {list(PRECISIONS)}, got {precision!r}", field="precision")
    if isinstance(checkpointing, str):  # one policy, not its letters
        checkpointing = (checkpointing,)
    if not checkpointing or any(c not in CHECKPOINTING for c in checkpointing):
        raise LadderInputError(f"must be some of {list(CHECKPOINTING)}, got {checkpointing!r}", field="checkpointing")
    usable = gpu_memory_bytes * (1 - headroom)
    best_miss: tuple[int, Layout, MemoryBreakdown] | None = None
    for world in (w for w in candidate_worlds(batch_sequences, gpus_per_node, max_gpus) if w >= min_gpus):
        fits: list[tuple[tuple, Layout, MemoryBreakdown]] = []
        per_rank = batch_sequences // world
        for ckpt_rank, ckpt in enumerate(c for c in CHECKPOINTING if c in checkpointing):
            for micro in sorted(_divisors(per_rank), reverse=True):
                for ep in _valid_eps(arch, world, None):
                    layout = Layout(dp=world // ep, ep=ep, micro_batch_sequences=micro, checkpointing=ckpt,
                                    precision=precision, capacity_factor=planned_capacity_factor(ep))
                    mem = memory_breakdown(arch, layout, accumulation_steps=per_rank // micro, lb_loss=lb_loss,
                                           z_loss=z_loss, loss=loss, device_memory_bytes=gpu_memory_bytes)
                    if mem.total <= usable:
                        fits.append(((ckpt_rank, -micro, ep > gpus_per_node, mem.total), layout, mem))
                    elif best_miss is None or mem.total < best_miss[0]:
                        best_miss = (mem.total, layout, mem)
            if fits:
                break
        if fits:
            _, layout, mem = min(fits, key=lambda item: item[0])
            return LayoutChoice(layout, mem, batch_sequences, gpus_per_node, gpu_memory_bytes, headroom)
    if best_miss is None:
        raise LadderInputError(f"no layout: none of {min_gpus}..{max_gpus} GPUs splits batch_sequences={batch_sequences} "
                               f"evenly in steps of {gpus_per_node} per node", field="--gpus-per-node")
    total, layout, mem = best_miss
    raise LadderInputError(
        f"no layout up to {max_gpus} GPUs fits {format_bytes(gpu_memory_bytes)} per GPU less {headroom:.0%} "
        f"headroom ({format_bytes(usable)}): the smallest per-rank peak is {format_bytes(total)} "
        f"(dp={layout.dp} ep={layout.ep}, micro-batch {layout.micro_batch_sequences}, checkpointing "
        f"{layout.checkpointing}: params {format_bytes(mem.params)}, grads {format_bytes(mem.grads)}, optimizer "
        f"{format_bytes(mem.optimizer)}, activations {format_bytes(mem.activations)}, buffers "
        f"{format_bytes(mem.buffers)})", field="--gpu-memory")


def gpus_for_days(train_flops: float, days: float, *, peak_flops_per_gpu: float, mfu: float, goodput: float) -> int:
    """The fewest GPUs that train `train_flops` within `days` at `mfu` and `goodput` (`ladder.plan.compute`)."""
    if not (days > 0 and math.isfinite(days)):
        raise LadderInputError(f"must be a positive number of days, got {days!r}", field="days")
    per_gpu = plan_compute(train_flops, gpus=1, peak_flops_per_gpu=peak_flops_per_gpu, mfu=mfu, goodput=goodput)
    return max(1, math.ceil(per_gpu.wall_clock_days / days - 1e-9))


def trial_capacity_factor(config: dict[str, Any], ep: int) -> float | None:
    """The capacity factor a torch trial of `ep` runs with: its config's, none when the config fixes
    `capacity_per_expert` (or runs the JAX job, which does not read it), else the planner's."""
    if config.get("backend") == "jax":
        return None
    return planned_capacity_factor(ep, capacity_per_expert=config.get("capacity_per_expert"),
                                   capacity_factor=config.get("capacity_factor"))


def _trial_layouts(config: dict[str, Any], workers: int, gpu: bool, ep: int | None = None,
                   device_memory_bytes: int | None = None):
    """(layout, memory) of a multi-worker trial at each ep its workers and experts allow (only `ep` when
    given): the trial's own micro-batch (the config's `micro_batch_sequences`, whole batch when unset),
    checkpointing, precision and capacity factor (`trial_capacity_factor`; a fixed
    `capacity_per_expert` is counted as the default's buffers, an upper bound)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise LadderInputError(f"must be a positive integer, got {workers!r}", field="resources.workers")
    arch = Architecture(**{k: config[k] for k in Architecture.__dataclass_fields__})
    batch = int(config["batch_sequences"])
    micro_global = int(config.get("micro_batch_sequences") or batch)
    micro = max(1, micro_global // workers)
    precision = config.get("precision", "auto")
    precision = ("bf16" if gpu else "fp32") if precision == "auto" else precision
    lb_loss = float(config.get("lb_loss_coef", 0.01)) > 0
    z_loss = float(config.get("z_loss_coef", 0.0)) > 0
    accumulation = max(1, batch // micro_global)
    checkpointing = config.get("activation_checkpointing", "none")
    for size in [ep] if ep is not None else _valid_eps(arch, workers, config.get("group_size")):
        layout = Layout(dp=workers // size, ep=size, micro_batch_sequences=micro, checkpointing=checkpointing,
                        precision=precision, capacity_factor=trial_capacity_factor(config, size))
        yield layout, memory_breakdown(arch, layout, accumulation_steps=accumulation, lb_loss=lb_loss, z_loss=z_loss,
                                       device_memory_bytes=device_memory_bytes)


def planned_expert_parallel(config: dict[str, Any], *, workers: int, gpu: bool) -> int:
    """The ep a multi-worker trial runs with when its spec does not set one: among the ep sizes the
    trial's workers and experts allow, the one with the least per-rank peak (`_trial_layouts`)."""
    if not isinstance(workers, bool) and workers == 1:
        return 1
    return min((mem.total, -layout.ep, layout.ep) for layout, mem in _trial_layouts(config, workers, gpu))[2]


def trial_memory(config: dict[str, Any], *, workers: int, gpu: bool, ep: int | None = None,
                 device_memory_bytes: int | None = None) -> tuple[Layout, MemoryBreakdown]:
    """The layout a sweep trial launches with and its per-rank bytes: `ep` as the spec sets it, else
    the planner's (`planned_expert_parallel`); `device_memory_bytes` sizes the loss's chunks as the job
    does on that device."""
    size = ep if ep is not None else planned_expert_parallel(config, workers=workers, gpu=gpu)
    ((layout, mem),) = _trial_layouts(config, workers, gpu, size, device_memory_bytes)
    return layout, mem
