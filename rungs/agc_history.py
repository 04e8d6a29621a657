"""The host-side statistics of activation gradient clipping that both engines keep identically: the
running history of per-step median norms per (layer, point), this step's clipped and measured unit
counts, the clip events (`ClipEvent`, one record per clip) and the per-step event budget, the job-wide merge of a sharded step, and the checkpointed state.

`rungs.agc.ActivationGradClipper` (torch, measured in an autograd Function) and
`rungs.jaxjob.agc.ClipRecorder` (JAX, measured in a custom_vjp and read back on the host) differ only
in how they measure; the thresholds they clip at come from here, so the two cannot drift. Imports no
framework.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from rungs.agc_settings import AGCSettings


@dataclass
class ClipEvent:
    """One clip: where it happened, how far over its threshold, and the sample it came from."""

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


@dataclass
class ClipHistory:
    settings: AGCSettings
    events: list[ClipEvent] = field(default_factory=list)
    _history: dict[tuple[int, str], deque] = field(default_factory=dict)
    _step_medians: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    _logged_this_step: int = 0
    clipped_units: int = 0  # tokens (or sequences) clipped in the current step, over all points
    total_units: int = 0  # tokens (or sequences) measured in the current step, over all points
    total_clips: int = 0  # since the start of the run (events may be capped; this is not)

    def _reset_step(self) -> None:
        self._logged_this_step = 0
        self.clipped_units = 0
        self.total_units = 0

    def history_threshold(self, layer: int, point: str) -> float | None:
        """The clip threshold at (layer, point): fixed, or `threshold` × the median of the running
        history of per-step medians; None before any history exists, when the current batch's own
        median stands in (one corrupt row out of many cannot move a median)."""
        if self.settings.mode == "fixed":
            return float(self.settings.threshold)
        hist = self._history.get((layer, point))
        return self.settings.threshold * max(median(hist), 1e-30) if hist else None

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
