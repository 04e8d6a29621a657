"""Progress of a training job on stderr (rich), off for library callers that ask for quiet."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    def __init__(self, total_steps: int, *, enabled: bool, start: int = 0) -> None:
        self._progress = None
        if not enabled:
            return
        self._progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("{task.fields[status]}"), console=Console(file=sys.stderr),
                                  transient=False)
        self._task = self._progress.add_task("train", total=total_steps, completed=start, status="")
        self._progress.start()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if self._progress is None:
            return
        status = f"loss {metrics['loss']:.3f}  {metrics['tokens_per_second']:,.0f} tok/s"
        bpb = [v for k, v in metrics.items() if k.startswith("bpb/")]
        if bpb:
            status += f"  bpb(mean) {sum(bpb) / len(bpb):.3f}"
        self._progress.update(self._task, completed=step, status=status)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
