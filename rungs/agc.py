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
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import torch

log = logging.getLogger(__name__)

# The settings live apart from the clipper so that config validation imports no torch.
from rungs.agc_settings import GRANULARITIES, MODES, POINTS, AGCConfigError, AGCSettings  # noqa: E402,F401
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
class ActivationGradClipper:
    """Installed on a model as `model.activation_clip`; call `begin_micro_batch` before each backward."""

    settings: AGCSettings
    events: list[ClipEvent] = field(default_factory=list)
    _history: dict[tuple[int, str], deque] = field(default_factory=dict)
    _step_medians: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    _current: _MicroBatch = field(default_factory=lambda: _MicroBatch(0, None, None, None))
    _logged_this_step: int = 0
    clipped_units: int = 0  # tokens (or sequences) clipped in the current step, over all points
    total_units: int = 0  # tokens (or sequences) measured in the current step, over all points
    total_clips: int = 0  # since the start of the run (events may be capped; this is not)

    def __call__(self, x: torch.Tensor, layer: int, point: str) -> torch.Tensor:
        if point not in self.settings.points or not torch.is_grad_enabled() or not x.requires_grad:
            return x
        return _ClipGrad.apply(x, self, layer, point)

    def begin_step(self, step: int) -> None:
        self._current = _MicroBatch(step, None, None, None)
        self._logged_this_step = 0
        self.clipped_units = 0
        self.total_units = 0

    def begin_micro_batch(self, inputs: torch.Tensor | None = None, locate: Locate | None = None,
                          decode: Decode | None = None) -> None:
        self._current = _MicroBatch(self._current.step, inputs, locate, decode)

    def synchronise(self, all_gather: Callable[[Any], list[Any]]) -> None:
        """Make this step's statistics the whole job's before `end_step` (sharded jobs): every rank's
        per-point medians (so every rank folds the same values into the same history, and later
        thresholds agree) and clipped/measured unit counts (so the clip rate is the job's).
        `all_gather(obj)` returns the list of every rank's obj, in rank order."""
        gathered = all_gather({"medians": self._step_medians, "clipped": self.clipped_units, "total": self.total_units})
        merged: dict[tuple[int, str], list[float]] = {}
        for part in gathered:
            for key, values in part["medians"].items():
                merged.setdefault(key, []).extend(values)
        self._step_medians = merged
        self.clipped_units = sum(part["clipped"] for part in gathered)
        self.total_units = sum(part["total"] for part in gathered)

    def end_step(self) -> float:
        """Fold this step's per-point median norms into the running history; returns the clip rate."""
        for key, medians in self._step_medians.items():
            hist = self._history.setdefault(key, deque(maxlen=self.settings.median_window_steps))
            hist.append(median(medians))
        self._step_medians.clear()
        return self.clipped_units / self.total_units if self.total_units else 0.0

    def threshold(self, layer: int, point: str, current_median: float) -> float:
        if self.settings.mode == "fixed":
            return self.settings.threshold
        hist = self._history.get((layer, point))
        # Before any history exists the current batch's median stands in: one corrupt row out of
        # many cannot move a median.
        ref = median(hist) if hist else current_median
        return self.settings.threshold * max(ref, 1e-30)

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

    def state_dict(self) -> dict:
        return {"history": {f"{k[0]}:{k[1]}": list(v) for k, v in self._history.items()},
                "total_clips": self.total_clips}

    def load_state_dict(self, state: dict) -> None:
        self._history = {}
        for key, values in state["history"].items():
            layer, point = key.split(":", 1)
            self._history[(int(layer), point)] = deque(values, maxlen=self.settings.median_window_steps)
        self.total_clips = state["total_clips"]

    def drain_events(self) -> list[ClipEvent]:
        out, self.events = self.events, []
        return out


def write_events(events: list[ClipEvent], path: Path) -> None:
    """Append clip events as JSON lines (one event per line)."""
    append_jsonl([event_record(ev) for ev in events], path)


def event_record(ev: ClipEvent) -> dict[str, Any]:
    """One clip event as the JSON-able record of clip_events.jsonl."""
    return asdict(ev) | {"ratio": ev.ratio}


# Keep only events of steps a checkpoint covers (0-based step < completed_steps).
drop_events_after = drop_jsonl_after
