"""The time a running sweep has left, from its finished trials: `make demo` prints it as it goes.

Trials of a ladder differ by 75× in compute, so the estimate weighs each by its training FLOPs (from the
sweep plan, no torch): time left ≈ time so far × FLOPs still to train / FLOPs trained. Only the trials this
run trains count (`todo`, from the orchestrator's `on_todo`: a trial finished before is skipped and never
ends here), and a trial that failed counts as neither trained nor left (it does not run again in this
sweep). The orchestrator reports each trial's end as "[k/N] word LABEL ..."; every message passes through
unchanged, the ones that end a trial with "elapsed …, about … left" appended (no time left after the last).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from ladder.errors import LadderInputError
from ladder.plan.values import finite_real

_END = re.compile(r"^\[(\d+)/(\d+)\]\s+(\S+)\s+(.+?)\s+(?:bpb \S+\s+)?\(\d+ s\)$")


def _minutes(seconds: float) -> str:
    # 59.6 s would print as "60 s": the unit follows the value as shown
    return f"{seconds / 60:.1f} min" if seconds >= 59.5 else f"{seconds:.0f} s"


class SweepEta:
    """A progress callback that adds the estimated time left to each trial-end message. Each trial's
    FLOPs are checked here, before the sweep starts: a bad one would otherwise surface as a crash or a
    "nan s left" only once the first trial ends."""

    def __init__(self, flops_by_label: dict[str, float], progress: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        for label, flops in flops_by_label.items():
            if not (finite_real(flops) and flops > 0):
                raise LadderInputError(f"trial {label!r}: training FLOPs must be a positive, finite number, got "
                                       f"{flops!r}", field="flops_by_label")
        self.flops = {label: float(flops) for label, flops in flops_by_label.items()}
        self.progress = progress
        self.clock = clock
        self.t0: float | None = None
        self.done: set[str] = set()

    def todo(self, labels: list[str]) -> None:
        """The trials this run trains: the others (finished before) are neither trained nor left here."""
        running = set(labels)
        self.flops = {label: flops for label, flops in self.flops.items() if label in running}

    def start(self) -> None:
        """Begin timing (when the sweep starts, after the corpus is prepared)."""
        self.t0 = self.clock()

    def __call__(self, message: str) -> None:
        match = _END.match(message)
        if match is None or self.t0 is None:
            self.progress(message)
            return
        word, label = match.group(3), match.group(4).strip()
        if word == "failed":  # not trained, and not run again by this sweep
            self.flops.pop(label, None)
        elif label in self.flops:
            self.done.add(label)
        last = match.group(1) == match.group(2)
        left = None if last else self.seconds_left()
        elapsed = self.clock() - self.t0
        tail = f"; elapsed {_minutes(elapsed)}" + (f", about {_minutes(left)} left" if left is not None else "")
        self.progress(message + tail)

    def seconds_left(self) -> float | None:
        """Elapsed × FLOPs left / FLOPs done; None before the first trial ends."""
        done = sum(self.flops[k] for k in self.done)
        left = sum(v for k, v in self.flops.items() if k not in self.done)
        if self.t0 is None or done <= 0:
            return None
        return (self.clock() - self.t0) * left / done
