"""Result objects: every fit returns one.

A result carries what a reader needs to trust (or distrust) a law: the parameters, their
intervals, the residuals, the rows it was fitted on, the options it was fitted with and the code
version that fitted it. `to_dict()` is plain JSON; `summary()` is a short human-readable table.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Package version plus the git commit of the working tree when there is one."""
    try:
        version = metadata.version("scaling-ladder")
    except metadata.PackageNotFoundError:
        version = "unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
            text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{version}+g{commit}" if commit else version


def jsonable(obj: Any) -> Any:
    """numpy scalars/arrays and other array scalars (torch) → Python; non-finite floats → None (JSON has
    no inf/NaN). The one JSON normaliser: fit results and the CLI's --json both use it."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if not isinstance(obj, (str, bytes)) and callable(getattr(obj, "item", None)):  # torch and other scalars
        return jsonable(obj.item())
    return obj


@dataclass
class FitResult:
    """A fitted law. `params` are the natural parameters (E, A, alpha, ...); `ci` maps a parameter
    to its (low, high) bootstrap interval at `ci_level`; `residuals` are log(y) − log(ŷ)."""

    law: str
    formula: str
    params: dict[str, float]
    objective: float
    n_points: int
    rows_used: list[Any]
    residuals: list[float]
    options: dict[str, Any]
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    se: dict[str, float] = field(default_factory=dict)
    ci_level: float | None = None
    n_bootstrap: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    code_version: str = field(default_factory=code_version)
    # Bootstrap parameter draws, one row per resample in `params` order; not serialised.
    bootstrap_params: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self, include_draws: bool = False) -> dict[str, Any]:
        """Plain JSON. With include_draws the bootstrap parameter draws come along (a laws file
        for `ladder extrapolate` needs them for prediction intervals)."""
        draws = {"bootstrap_draws": self.bootstrap_params} if include_draws and self.bootstrap_params is not None else {}
        return jsonable({
            "law": self.law,
            "formula": self.formula,
            "params": self.params,
            "ci": {k: list(v) for k, v in self.ci.items()},
            "se": self.se,
            "ci_level": self.ci_level,
            "n_bootstrap": self.n_bootstrap,
            "objective": self.objective,
            "n_points": self.n_points,
            "rows_used": self.rows_used,
            "residuals": self.residuals,
            "options": self.options,
            "code_version": self.code_version,
            **self.extra,
            **draws,
        })

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def summary(self) -> str:
        lines = [f"{self.law}: {self.formula}", f"  {self.n_points} points, objective {self.objective:.6g}, "
                 f"code {self.code_version}"]
        level = f"{self.ci_level:.0%} CI" if self.ci_level else "CI"
        for name, value in self.params.items():
            ci = self.ci.get(name)
            ci_text = f"  {level} [{ci[0]:.6g}, {ci[1]:.6g}]" if ci else ""
            lines.append(f"  {name:>10} = {value:.6g}{ci_text}")
        if self.residuals:
            r = np.asarray(self.residuals)
            lines.append(f"  log residuals: rms {np.sqrt(np.mean(r**2)):.3g}, max |r| {np.max(np.abs(r)):.3g}")
        return "\n".join(lines)

    def bootstrap_column(self, name: str) -> np.ndarray:
        if self.bootstrap_params is None:
            raise ValueError(f"{self.law}: no bootstrap draws; fit with bootstrap > 0")
        return self.bootstrap_params[:, list(self.params).index(name)]
