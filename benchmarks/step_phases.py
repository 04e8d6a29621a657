"""Where a training step's time goes, measured without making the host wait inside it (a helper of
`benchmarks/gpu_rung.py`, not a benchmark of its own).

- `PhaseClock` marks the phases of the job's own step from hooks on the model and the optimizer:
  per micro-batch the forward up to the final norm, the loss (`rungs.loss`: the LM head, its
  softmax and its gradients, made in forward), the backward (until the embedding's gradient has
  accumulated); per step the optimizer's `step`, and the rest (grad-norm clipping, statistics). On
  CUDA each mark is an event recorded on the stream, read after the step; on the CPU the host
  clock (the CPU computes as it goes).
- `kernel_table` profiles a callable with `torch.profiler` and lists its top kernels by device time.
- `cuda_syncs` runs a callable under `torch.cuda.set_sync_debug_mode("warn")` and counts the
  synchronising calls by the Python line that made them (inside backward: the `.backward()` line).
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

PHASES = ("forward", "loss", "backward", "optimizer", "other")


class PhaseClock:
    """`with PhaseClock(model, optimizer, cuda) as clock: step()`; then `clock.seconds()`."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, cuda: bool) -> None:
        self.model, self.optimizer, self.cuda = model, optimizer, cuda
        self.marks: list[tuple[str, Any]] = []
        self._handles: list[Any] = []
        self._step = None

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def __enter__(self) -> PhaseClock:
        self.marks = []
        m = self.model
        self._handles = [m.register_forward_pre_hook(lambda *_: self.mark("forward")),
                         m.final_norm.register_forward_hook(lambda *_: self.mark("loss")),
                         m.register_forward_hook(lambda *_: self.mark("backward")),
                         m.embed.weight.register_post_accumulate_grad_hook(lambda *_: self.mark("backward_end"))]
        self._step = self.optimizer.step

        def timed_step(*args, **kwargs):
            self.mark("optimizer")
            out = self._step(*args, **kwargs)
            self.mark("optimizer_end")
            return out

        self.optimizer.step = timed_step
        self.mark("step")
        return self

    def __exit__(self, *exc) -> None:
        self.mark("step_end")
        for handle in self._handles:
            handle.remove()
        del self.optimizer.step                          # the class's method again

    def _elapsed(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def seconds(self) -> dict[str, float]:
        """Seconds per phase over the step (summed over micro-batches), and the whole step."""
        if self.cuda:
            torch.cuda.synchronize()
        out = dict.fromkeys(PHASES, 0.0)
        ends = {"forward": "loss", "loss": "backward", "backward": "backward_end", "optimizer": "optimizer_end"}
        for i, (name, start) in enumerate(self.marks):
            if name in ends:
                end = next(m for n, m in self.marks[i + 1:] if n == ends[name])
                out[name] += self._elapsed(start, end)
        total = self._elapsed(self.marks[0][1], self.marks[-1][1])
        out["other"] = max(0.0, total - sum(out[p] for p in PHASES if p != "other"))
        out["step"] = total
        return out


def kernel_table(fn: Callable[[], Any], cuda: bool, top: int = 15) -> list[dict[str, Any]]:
    """The top `top` kernels (CUDA) or ops (CPU) of one call of `fn` by self device time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0 and (not cuda or e.device_type == torch.autograd.DeviceType.CUDA):   # kernels and copies
            rows.append({"name": e.key[:160], "calls": e.count, "ms": us / 1e3})
    rows.sort(key=lambda r: -r["ms"])
    total = sum(r["ms"] for r in rows) or 1.0
    return [r | {"share": r["ms"] / total} for r in rows[:top]]


def cuda_syncs(fn: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """Synchronising CUDA calls made by `fn()` and where (file:line -> calls)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    places = Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    return sum(places.values()), dict(places)
