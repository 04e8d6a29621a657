"""How routed (token, slot) pairs are counted per expert and planned into rounds: host-free counting
(`count_per_expert`), the round plan expert parallelism runs (`plan_rounds`, a group being one rank's
experts) and the capacity that keeps a quantile of steps in one round (`calibrate_capacity`).

Arithmetic on counts, apart from the experts' matmuls (`rungs.moe`), which import it: the plan is the
contract between the single-process rounds, expert parallelism (`rungs.parallel.ep_plan`) and the JAX
engine (`rungs.jaxjob.moe`), each tested against it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["MoEConfigError", "calibrate_capacity", "count_per_expert", "plan_rounds"]


class MoEConfigError(ValueError):
    """Invalid MoE configuration or inputs (bad sizes, indices out of range)."""


def count_per_expert(expert_idx: Tensor, n_experts: int) -> Tensor:
    """(E,) long: how many (token, slot) pairs chose each expert, with no host read (bincount sizes
    its output by the data's max, which CUDA reads on the host): a scatter-add of ones (integer
    sums: exact in any order), or sort + searchsorted on an accelerator in deterministic mode."""
    flat = expert_idx.reshape(-1).long()
    if flat.device.type != "cpu" and torch.are_deterministic_algorithms_enabled():
        return _count_sorted(flat, n_experts)
    counts = torch.zeros(n_experts, dtype=torch.long, device=flat.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat))


def _count_sorted(flat: Tensor, n_experts: int) -> Tensor:
    edges = torch.arange(n_experts + 1, device=flat.device, dtype=flat.dtype)
    return torch.diff(torch.searchsorted(torch.sort(flat).values, edges)).long()


def plan_rounds(tokens_per_expert: Sequence[int], capacity: int, group_size: int) -> list[list[int]]:
    """Rows each expert computes in each round: a list of rounds, each a list of E row counts.

    Per group and round: guaranteed min(remaining, capacity) per expert, then the group's spare
    slots (S - sum of guarantees) go to experts with rows left, by capped cumulative sum starting at
    expert (round mod group_size) of the group. Every round fills min(group load left, S) rows of
    each group, hence rounds = max_g ceil(load_g / S).
    """
    n_experts = len(tokens_per_expert)
    if capacity < 1 or group_size < 1 or n_experts % group_size:
        raise MoEConfigError(f"capacity {capacity} and group_size {group_size} must be >= 1 and "
                             f"group_size must divide n_experts={n_experts}")
    slab = group_size * capacity
    remaining = [int(n) for n in tokens_per_expert]
    if any(n < 0 for n in remaining):
        raise MoEConfigError(f"tokens_per_expert must be non-negative, got {remaining}")
    rounds: list[list[int]] = []
    while any(remaining):
        shift = len(rounds) % group_size
        take = [0] * n_experts
        for first in range(0, n_experts, group_size):
            members = [first + (shift + j) % group_size for j in range(group_size)]
            for e in members:
                take[e] = min(remaining[e], capacity)
            spare = slab - sum(take[e] for e in members)
            for e in members:
                extra = min(remaining[e] - take[e], spare)
                take[e] += extra
                spare -= extra
        for e in range(n_experts):
            remaining[e] -= take[e]
        rounds.append(take)
    return rounds


def calibrate_capacity(tokens_per_expert_samples: Tensor | Sequence[Sequence[int]], group_size: int,
                       quantile: float = 0.99) -> int:
    """Smallest per-expert capacity that keeps at least `quantile` of the sampled steps in one round.

    `tokens_per_expert_samples` is (steps, E): the routed counts of steady-state steps (for one layer,
    or every layer's rows stacked). A step fits one round iff max_g load_g <= group_size * capacity.
    """
    counts = torch.as_tensor(tokens_per_expert_samples, dtype=torch.long)
    if counts.ndim != 2 or counts.shape[0] == 0:
        raise MoEConfigError(f"tokens_per_expert_samples must be (steps>=1, E), got {tuple(counts.shape)}")
    if group_size < 1 or counts.shape[1] % group_size:
        raise MoEConfigError(f"group_size {group_size} must divide n_experts={counts.shape[1]}")
    if not 0.0 < quantile <= 1.0:
        raise MoEConfigError(f"quantile must be in (0, 1], got {quantile}")
    group_loads = counts.view(counts.shape[0], -1, group_size).sum(-1)   # (steps, groups)
    needed = torch.div(group_loads.max(-1).values + group_size - 1, group_size, rounding_mode="floor")
    needed = needed.sort().values
    index = max(0, math.ceil(quantile * len(needed)) - 1)
    return max(1, int(needed[index]))
