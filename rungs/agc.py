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
from rungs.agc_history import ClipHistory  # noqa: E402
from rungs.run_files import append_jsonl, drop_jsonl_after  # noqa: E402


@dataclass
class ClipEvent:
    step: int
    layer: int
    point: str
    row: int
    position: int  # first token of the sequence when granularity is "sequence"
    norm: float
    threshold: float
    source: str | None = None
    doc_id: Any = None
    token_offset: int | None = None
    text: str | None = None

    @property
    def ratio(self) -> float:
        return self.norm / self.threshold


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


@dataclass
class ActivationGradClipper(ClipHistory):
    """Installed on a model as `model.activation_clip`; call `begin_micro_batch` before each backward."""

    _current: _MicroBatch = field(default_factory=lambda: _MicroBatch(0, None, None, None))

    def __call__(self, x: torch.Tensor, layer: int, point: str) -> torch.Tensor:
        if point not in self.settings.points or not torch.is_grad_enabled() or not x.requires_grad:
            return x
        return _ClipGrad.apply(x, self, layer, point)

    def begin_step(self, step: int) -> None:
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
        current_median = norms.median().item()
        self._step_medians.setdefault((layer, point), []).append(current_median)
        thr = self.threshold(layer, point, current_median)
        over = norms > thr
        self.total_units += norms.numel()
        n_over = int(over.sum())
        if n_over == 0:
            return grad
        self.clipped_units += n_over
        self.total_clips += n_over
        self._record(norms, over, thr, layer, point)
        scale = torch.where(over, thr / norms, torch.ones_like(norms))  # (B, T) or (B, 1)
        return (grad.float() * scale[..., None]).to(grad.dtype)  # grad is (B, T, d)

    def _record(self, norms: torch.Tensor, over: torch.Tensor, thr: float, layer: int, point: str) -> None:
        cur = self._current
        budget = self.settings.max_logged_events_per_step - self._logged_this_step
        if budget <= 0:
            return
        idx = over.nonzero().tolist()
        # Log the worst offenders first when the per-step budget cannot hold them all.
        idx.sort(key=lambda rc: -float(norms[rc[0], rc[1]]))
        for row, col in idx[:budget]:
            position = col if self.settings.granularity == "token" else 0
            ev = ClipEvent(step=cur.step, layer=layer, point=point, row=row, position=position,
                           norm=float(norms[row, col]), threshold=thr)
            if cur.locate is not None:
                origin = cur.locate(row, position)
                ev.source, ev.doc_id, ev.token_offset = origin.source, origin.doc_id, origin.token_offset
            if cur.inputs is not None and cur.decode is not None:
                c = self.settings.context_tokens
                ids = cur.inputs[row, max(0, position - c): position + c + 1].tolist()
                ev.text = cur.decode(ids)
            self.events.append(ev)
            self._logged_this_step += 1


def write_events(events: list[ClipEvent], path: Path) -> None:
    """Append clip events as JSON lines (one event per line)."""
    append_jsonl([event_record(ev) for ev in events], path)


def event_record(ev: ClipEvent) -> dict[str, Any]:
    """One clip event as the JSON-able record of clip_events.jsonl."""
    return asdict(ev) | {"ratio": ev.ratio}


# Keep only events of steps a checkpoint covers (0-based step < completed_steps).
drop_events_after = drop_jsonl_after
