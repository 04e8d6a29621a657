"""Expert stacks held in the compute dtype across the micro-batches of one optimizer step.

Under bf16 every forward and every backward of an experts module casts its float32 stacks (gate, up,
down) to bf16, and from the second micro-batch of a step on autograd widens each weight gradient to
float32 and adds it into `.grad`. Inside `held_expert_weights` the casts happen once a step and the
single-process experts add their gradients into `.grad` in place; the values are the same bit for bit.
The experts modules (`rungs.moe.RoutedExperts`, `rungs.parallel.expert_parallel.ExpertParallelExperts`)
take part through two attributes: `cast_stacks(w_gate, w_up, w_down, dtype)`, the copies their
forward and backward multiply with, and `_held`, which their autograd functions read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from rungs.moe import MoEConfigError

__all__ = ["HeldWeights", "held_expert_weights"]


class HeldWeights:
    """An experts module's stacks (gate, up, down) in a compute dtype, made by `make(w_gate, w_up, w_down,
    dtype)` once and reused while the stacks are unchanged (their version counters: an optimizer step
    or a load writes them in place and bumps them), and the parameters whose existing `.grad` the
    backward adds into (`held_expert_weights`)."""

    def __init__(self, params: tuple[nn.Parameter, nn.Parameter, nn.Parameter],
                 make: Callable[[Tensor, Tensor, Tensor, torch.dtype], tuple[Tensor, ...]]) -> None:
        self.params, self._make = params, make
        self._key: tuple | None = None
        self._weights: tuple[Tensor, ...] | None = None

    def weights(self, dtype: torch.dtype) -> tuple[Tensor, ...]:
        key = (dtype, *(w._version for w in self.params))
        if key != self._key:
            self._weights = None  # the stale copies are freed before the new ones are made
            self._weights = self._make(*self.params, dtype)
            self._key = key
        return self._weights

    def grad_into(self, i: int) -> Tensor | None:
        """Parameter i's existing `.grad`, which this micro-batch's gradient is added into in place
        (None: the first micro-batch, whose gradient autograd stores)."""
        return self.params[i].grad


@contextmanager
def held_expert_weights(model: nn.Module) -> Iterator[None]:
    """Gradient accumulation over micro-batches with less traffic on the expert stacks.

    Inside the block every experts module of `model` (each with a `cast_stacks`: see the module
    docstring) casts its stacks to the compute dtype once and reuses the copies in every forward and
    backward (without it: two casts of all three stacks per micro-batch), and in `RoutedExperts` a
    micro-batch whose stacks already have a `.grad` adds its weight gradient into it in place (without
    it: a float32 copy of the gradient, then autograd's add). The values are the same bit for bit. The copies cost the stacks' size in the compute dtype until the block exits; a stack
    written inside (an optimizer step) is cast again at its next use. Refused where a stack has a
    gradient hook, which the in-place sum would bypass. For stacks that are plain parameters (one
    process, or expert parallelism, whose stacks FSDP leaves alone), not FSDP-sharded ones."""
    experts = [m for m in model.modules() if callable(getattr(m, "cast_stacks", None))]
    for m in experts:
        for name in ("w_gate", "w_up", "w_down"):
            w = getattr(m, name)
            if getattr(w, "_backward_hooks", None) or getattr(w, "_post_accumulate_grad_hooks", None):
                raise MoEConfigError(f"held_expert_weights: {name} has a gradient hook, which adding into .grad "
                                     "in place would bypass")
    for m in experts:
        m._held = HeldWeights((m.w_gate, m.w_up, m.w_down), m.cast_stacks)
    try:
        yield
    finally:
        for m in experts:
            m._held = None
