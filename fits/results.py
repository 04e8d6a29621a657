"""Result objects: every fit returns one, built once, after its bootstrap, and frozen.

A result carries what a reader needs to trust (or distrust) a law: the parameters, their
intervals, the residuals, the rows it was fitted on, the options it was fitted with and the code
version that fitted it. Every law's result keeps one protocol (`LawResult`): `to_dict()` is plain
JSON, `summary()` a short human-readable table, `code_version` the code that fitted it and
`conf_int(level)` each parameter's interval at any level (percentiles of the stored bootstrap
draws here; the covariance where a law has no bootstrap).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fits.validate import check_level
from provenance import code_version


def jsonable(obj: Any) -> Any:
    """numpy scalars/arrays and other array scalars (torch) → Python, paths → str; non-finite floats →
    None (JSON has no inf/NaN). The one JSON normaliser: fit results and the CLI's --json both use it."""
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
    if isinstance(obj, PurePath):
        return str(obj)
    if not isinstance(obj, (str, bytes)) and callable(getattr(obj, "item", None)):  # torch and other scalars
        return jsonable(obj.item())
    return obj


def resolve_level(level: float | None, default: float | None) -> float:
    """An interval's level: `level` (checked), or the fit's own where it is None (0.95 where that is
    None too). A level of 0 is a level, not "the default"."""
    return check_level(level if level is not None else (default if default is not None else 0.95), "level")


def percentile_interval(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) percentiles of the draws (axis 0) bounding the central `level` of them."""
    level = check_level(level, "level")
    q = 50.0 * (1.0 - level)
    return np.percentile(draws, q, axis=0), np.percentile(draws, 100.0 - q, axis=0)


def normal_quantile(level: float | None) -> float:
    """z with P(|Z| ≤ z) = level (default 0.95): intervals of laws fitted without a bootstrap."""
    from statistics import NormalDist

    level = check_level(0.95 if level is None else level, "level")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def student_quantile(level: float | None, dof: float) -> float:
    """t with P(|T| ≤ t) = level (default 0.95) at `dof` degrees of freedom; NaN without any (dof ≤ 0 or NaN):
    intervals from a least-squares fit's own residuals."""
    from scipy import stats

    level = check_level(0.95 if level is None else level, "level")
    return float(stats.t.ppf(0.5 + level / 2.0, dof)) if dof > 0 else float("nan")


@runtime_checkable
class LawResult(Protocol):
    """What every fit result offers, whichever law it fitted."""

    code_version: str

    def to_dict(self) -> dict[str, Any]: ...

    def summary(self) -> str: ...

    def conf_int(self, level: float | None = None) -> dict[str, tuple[float, float]]: ...


@dataclass(frozen=True)
class BootstrapDraws:
    """What a bootstrap returns: the natural-parameter draws (one row per resample that gave a finite
    fit, in the law's parameter order) and how many resamples were left out (non-finite, or too few
    distinct x). A law turns them into its result's fields with `bootstrap_fields`."""

    params: np.ndarray
    failed: int


def bootstrap_fields(names: list[str], draws: BootstrapDraws, ci_level: float) -> dict[str, Any]:
    """The result fields a bootstrap fills: interval and standard error of each parameter, the level,
    the number of draws and the draws themselves."""
    lo, hi = percentile_interval(draws.params, ci_level)
    return {"ci": {k: (float(lo[i]), float(hi[i])) for i, k in enumerate(names)},
            "se": {k: float(np.std(draws.params[:, i], ddof=1)) for i, k in enumerate(names)},
            "ci_level": ci_level, "n_bootstrap": len(draws.params), "bootstrap_params": draws.params}


@dataclass(frozen=True)
class FitResult:
    """A fitted law, built once (after its bootstrap, if any) and not changed afterwards. `params`
    are the natural parameters (E, A, alpha, ...); `ci` maps a parameter to its (low, high)
    bootstrap interval at `ci_level` (empty when the law judged it unreliable: `extra["interval"]`
    says why); `residuals` are log(y) − log(ŷ)."""

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
        group = self.extra.get("group")
        lines = [f"{self.law}{f' [{group}]' if group else ''}: {self.formula}",
                 f"  {self.n_points} points, objective {self.objective:.6g}, code {self.code_version}"]
        level = f"{self.ci_level:.0%} CI" if self.ci_level else "CI"
        for name, value in self.params.items():
            ci = self.ci.get(name)
            ci_text = f"  {level} [{ci[0]:.6g}, {ci[1]:.6g}]" if ci else ""
            lines.append(f"  {name:>10} = {value:.6g}{ci_text}")
        if self.extra.get("floor_at_zero"):
            lines.append("  E = 0: no loss floor over these points (the nested law); E itself is not identified")
        if self.interval_note is not None and self.n_bootstrap:
            lines.append(f"  intervals not available: {self.interval_note}")
        if self.residuals:
            r = np.asarray(self.residuals)
            lines.append(f"  log residuals: rms {np.sqrt(np.mean(r**2)):.3g}, max |r| {np.max(np.abs(r)):.3g}")
        return "\n".join(lines)

    @property
    def interval_note(self) -> str | None:
        """The one interval rule: None when this fit's intervals may be shown, otherwise why not. Every
        interval drawn from the fit (its parameters', its predictions', a backtest's, a recipe card's, an
        efficiency gain's) reads it: there are no draws, or the law judged its bootstrap unreliable at fit
        time (`extra["interval"]`; a power law below 5 distinct x, say: `fits.bootstrap`)."""
        interval = self.extra.get("interval") or {}
        if interval.get("available") is False:
            return str(interval.get("reason") or "the law judged its bootstrap unreliable")
        if self.bootstrap_params is None:
            return "no bootstrap draws (fit with bootstrap > 0)"
        return None

    def conf_int(self, level: float | None = None) -> dict[str, tuple[float, float]]:
        """Each parameter's (low, high) percentile interval at `level` (default: the fit's ci_level),
        from the stored bootstrap draws; equals `ci` at ci_level. Raises where the interval rule
        (`interval_note`) says there is none."""
        note = self.interval_note
        if note is not None:
            raise ValueError(f"{self.law}: interval not available: {note}")
        lo, hi = percentile_interval(self.bootstrap_params, resolve_level(level, self.ci_level))
        return {k: (float(lo[i]), float(hi[i])) for i, k in enumerate(self.params)}

    def bootstrap_column(self, name: str) -> np.ndarray:
        if self.bootstrap_params is None:
            raise ValueError(f"{self.law}: no bootstrap draws; fit with bootstrap > 0")
        return self.bootstrap_params[:, list(self.params).index(name)]
