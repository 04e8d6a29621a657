"""Activation-gradient-clipping settings, apart from the clipper (`rungs.agc`) so that validating a
training config (`rungs.config`), and with it planning and keying sweep trials, imports no torch."""

from __future__ import annotations

from dataclasses import dataclass

POINTS = ("residual", "moe_input")
GRANULARITIES = ("token", "sequence")
MODES = ("fixed", "median")


class AGCConfigError(ValueError):
    """An invalid activation-gradient-clipping setting."""


@dataclass(frozen=True)
class AGCSettings:
    points: tuple[str, ...] = POINTS
    granularity: str = "token"  # "token": norm over d_model; "sequence": over the whole sequence
    mode: str = "median"  # "fixed": threshold is an absolute norm; "median": a multiple of the running median
    threshold: float = 8.0
    median_window_steps: int = 100
    context_tokens: int = 16  # decoded tokens each side of a clipped position in the event log
    max_logged_events_per_step: int = 32

    def __post_init__(self) -> None:
        bad = [p for p in self.points if p not in POINTS]
        if bad:
            raise AGCConfigError(f"unknown AGC point(s) {bad}; valid points are {list(POINTS)}")
        repeated = sorted({p for p in self.points if self.points.count(p) > 1})
        if repeated:  # a point is clipped once however often it is named; the repeat would only change the key
            raise AGCConfigError(f"AGC point(s) {repeated} named more than once; name each once")
        if self.granularity not in GRANULARITIES:
            raise AGCConfigError(f"agc granularity {self.granularity!r}; valid: {list(GRANULARITIES)}")
        if self.mode not in MODES:
            raise AGCConfigError(f"agc mode {self.mode!r}; valid: {list(MODES)}")
        if not self.threshold > 0:
            raise AGCConfigError(f"agc threshold must be positive, got {self.threshold}")
        if self.median_window_steps < 1:
            raise AGCConfigError(f"agc median window must be at least 1 step, got {self.median_window_steps}")
