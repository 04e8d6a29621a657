"""Activation gradient clipping (AGC): clip the gradient of an activation per token (or per
sequence), so that one bad sample cannot shrink the whole batch's update the way global-norm
clipping does, and log every clip: the data probe of the MAI-Base-2 report.

At each configured point (`residual`: the residual stream entering a block; `moe_input`: the
normed input of the MoE) the forward pass is the identity; the backward pass measures the L2
norm of the incoming gradient per token (over d_model) or per sequence (over T × d_model) and
rescales those above the threshold down to it. The threshold is fixed, or a multiple of the
running median of per-step median norms at that (layer, point). Each clip is recorded with its
step, layer, point, norm/threshold and, through the batch's `locate`, the source, document and
token offset it came from, plus the decoded text around it.

The backward pass reads nothing on the host: the threshold from the current batch's median, the
comparison and the rescale stay on the device, and each clip leaves its median, its count of
clipped units and its largest norms (at most the per-step event budget, `topk`: a fixed size) in
a pending list. The first read of the statistics after the step (`end_step`, `synchronise`,
`events`, `drain_events`, `state_dict`, the next `begin_step`) reads all of them in one transfer
and logs the events, in the order the clips ran, worst first within each clip, up to the budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# The settings live apart from the clipper so that config validation imports no torch.
from rungs.agc_settings import GRANULARITIES, MODES, POINTS, AGCConfigError, AGCSettings  # noqa: E402,F401
from rungs.agc_history import ClipEvent, ClipHistory  # noqa: E402
from rungs.run_files import append_jsonl, drop_jsonl_after  # noqa: E402


# (row, position) -> an object with .source, .doc_id, .token_offset (the sampler's TokenOrigin)
Locate = Callable[[int, int], Any]
# token ids -> text
Decode = Callable[[list[int]], str]


@dataclass
class _MicroBatch:
    step: int
    inputs: torch.Tensor | None
    locate: Locate | None
    decode: Decode | None


class _ClipGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, clipper: ActivationGradClipper, layer: int, point: str) -> torch.Tensor:
        ctx.clipper, ctx.layer, ctx.point = clipper, layer, point
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return ctx.clipper._clip(grad, ctx.layer, ctx.point), None, None, None


class _FlushedOnRead:
    """A ClipHistory field of the torch clipper whose every read first calls `flush()`, so the
    statistics of clips still on the device are never read stale."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        obj.flush()
        return obj.__dict__[self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.name] = value


@dataclass
class _PendingClip:
    """One clip's statistics, still on the device until `ActivationGradClipper.flush`."""

    micro: _MicroBatch
    layer: int
    point: str
    width: int                        # columns of the (rows, columns) norms: flat index -> (row, column)
    stats: torch.Tensor               # float64 [median, clipped units, threshold, top norms..., their flat indices...]


@dataclass
class ActivationGradClipper(ClipHistory):
    """Installed on a model as `model.activation_clip`; call `begin_micro_batch` before each backward."""

    _current: _MicroBatch = field(default_factory=lambda: _MicroBatch(0, None, None, None))
    _pending: list[_PendingClip] = field(default_factory=list)

    # ClipHistory fields that pending clips change: reading one first reads the pending clips.
    events = _FlushedOnRead()
    clipped_units = _FlushedOnRead()
    total_clips = _FlushedOnRead()

    def __call__(self, x: torch.Tensor, layer: int, point: str) -> torch.Tensor:
        if point not in self.settings.points or not torch.is_grad_enabled() or not x.requires_grad:
            return x
        return _ClipGrad.apply(x, self, layer, point)

    def begin_step(self, step: int) -> None:
        self.flush()
        self._current = _MicroBatch(step, None, None, None)
        self._reset_step()

    def begin_micro_batch(self, inputs: torch.Tensor | None = None, locate: Locate | None = None,
                          decode: Decode | None = None) -> None:
        self._current = _MicroBatch(self._current.step, inputs, locate, decode)

    def threshold(self, layer: int, point: str, current_median: float) -> float:
        from_history = self.history_threshold(layer, point)
        return from_history if from_history is not None else self.settings.threshold * max(current_median, 1e-30)

    def _clip(self, grad: torch.Tensor, layer: int, point: str) -> torch.Tensor:
        if self.settings.granularity == "token":
            norms = grad.float().norm(dim=-1)  # (B, T)
        else:
            norms = grad.float().flatten(1).norm(dim=-1)[:, None]  # (B, 1)
        median = norms.median()
        thr = self.history_threshold(layer, point)
        if thr is None:  # no history yet: a multiple of this batch's median, on the device (float64 as on the host)
            thr = median.double().clamp_min(1e-30) * self.settings.threshold
        over = norms > thr
        self.total_units += norms.numel()
        top = min(self.settings.max_logged_events_per_step, norms.numel())
        top_norms, top_index = norms.flatten().topk(top)
        # A history threshold is a host float: made on the device by a fill (a blocking copy of the
        # float would wait for every queued kernel, once per clip point and micro-batch).
        thr_device = thr if isinstance(thr, torch.Tensor) else norms.new_full((), thr, dtype=torch.float64)
        stats = torch.cat([torch.stack([median.double(), over.sum().double(), thr_device]),
                           top_norms.double(), top_index.double()])
        self._pending.append(_PendingClip(self._current, layer, point, norms.shape[1], stats))
        scale = torch.where(over, thr / norms, torch.ones_like(norms))  # (B, T) or (B, 1); 1 where not over
        return (grad.float() * scale[..., None]).to(grad.dtype)  # grad is (B, T, d)

    def flush(self) -> None:
        """Read every pending clip's statistics in one transfer; fold them into this step's
        medians and counts and log their events (budget and order as if logged at clip time)."""
        pending = self.__dict__.get("_pending")
        if not pending:
            return
        self._pending = []
        values = torch.cat([p.stats.to("cpu", non_blocking=False) for p in pending]).tolist()
        at = 0
        for clip in pending:
            top = (clip.stats.numel() - 3) // 2
            median, n_over, thr = values[at:at + 3]
            norms, index = values[at + 3:at + 3 + top], values[at + 3 + top:at + 3 + 2 * top]
            at += 3 + 2 * top
            self._step_medians.setdefault((clip.layer, clip.point), []).append(median)
            self.clipped_units += int(n_over)
            self.total_clips += int(n_over)
            budget = self.settings.max_logged_events_per_step - self._logged_this_step
            worst = [(norm, int(i)) for norm, i in zip(norms, index) if norm > thr][:max(budget, 0)]
            for norm, flat in worst:
                self._record(clip, flat // clip.width, flat % clip.width, norm, thr)

    def _record(self, clip: _PendingClip, row: int, col: int, norm: float, thr: float) -> None:
        cur = clip.micro
        position = col if self.settings.granularity == "token" else 0
        ev = ClipEvent(step=cur.step, layer=clip.layer, point=clip.point, row=row, position=position,
                       norm=norm, threshold=thr)
        if cur.locate is not None:
            origin = cur.locate(row, position)
            ev.source, ev.doc_id, ev.token_offset = origin.source, origin.doc_id, origin.token_offset
        if cur.inputs is not None and cur.decode is not None:
            c = self.settings.context_tokens
            ids = cur.inputs[row, max(0, position - c): position + c + 1].tolist()
            ev.text = cur.decode(ids)
        self.events.append(ev)
        self._logged_this_step += 1

    def synchronise(self, all_gather) -> None:
        self.flush()
        super().synchronise(all_gather)

    def end_step(self) -> float:
        self.flush()
        return super().end_step()

    def state_dict(self) -> dict:
        self.flush()
        return super().state_dict()


def write_events(events: list[ClipEvent], path: Path) -> None:
    """Append clip events as JSON lines (one event per line)."""
    append_jsonl([event_record(ev) for ev in events], path)


def event_record(ev: ClipEvent) -> dict[str, Any]:
    """One clip event as the JSON-able record of clip_events.jsonl."""
    return asdict(ev) | {"ratio": ev.ratio}


# Keep only events of steps a checkpoint covers (0-based step < completed_steps).
drop_events_after = drop_jsonl_after
