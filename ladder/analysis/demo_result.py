"""What `ladder demo` produced: its laws, backtests, surfaces, cards and figures. Its own module so
that the demo (which fills it) and the report (which renders it) do not import each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DemoResult:
    out_dir: Path
    tracking_uri: str
    experiment: str
    sweep: dict[str, Any]
    power_laws: dict[str, Any] = field(default_factory=dict)
    backtests: dict[str, Any] = field(default_factory=dict)
    surfaces: list[Any] = field(default_factory=list)
    surface_errors: list[dict[str, Any]] = field(default_factory=list)
    cards: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Path] = field(default_factory=dict)
    wall_seconds: float = 0.0

    @property
    def report_path(self) -> Path:
        return self.out_dir / "report.html"
