"""The compute law of one eval domain: BPB(C) = E + A·C^(−α).

Fitted in log space, log ŷ = LSE(a − α·z, e) with z = log(C / C0), A = exp(a + α·log C0) and
E = exp(e), so E and A stay positive and the optimiser works on well-scaled numbers (C0 is the
geometric mean of the sampled compute). Objective: Huber(δ = 1e-3) on log residuals, summed.

Starts come from variable projection: for each α on a grid, E and A enter linearly, so they are
solved exactly by least squares; the best few grid points then start L-BFGS-B with the analytic
gradient. A solution on a bound raises `FitBoundaryError` (an α at the grid's end), a non-finite one
`FitConvergenceError`. What happens to an E that wants to be 0 is the floor rule (`fits.floors`):

- "fit" (the default): E is fitted, and an E on its lower bound is refused (`FitBoundaryError` on
  "log E"): these points show no loss floor, so E and α are not separately identified;
- "auto": E is fitted, and where it runs to its lower bound the constrained optimum under E ≥ 0 is
  kept, the nested law A·x^(−α), reported with E = 0 and `extra["floor_at_zero"] = True` (predictions
  inside and near the range are identified, E itself is not). Its bootstrap leaves E free, so the band
  also carries the floors the resamples find; E's own interval then runs from 0 (the value reported)
  to the resamples' upper percentile (`floor_interval`), so that it contains the E reported.
  `ladder demo` and every backtest fit this way: what a backtest tests is the prediction, not E;
- "zero": E is fixed at 0 for the fit and for every resample: the nested law A·x^(−α) by assumption.

δ may be a number or "auto" (δ = 1.345 × the replicate noise of log y, `fits.robust`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from fits.bootstrap import bootstrap_power_law, judge_power_law_interval
from fits.errors import FitBoundaryError, FitConvergenceError, FitInputError
from fits.floors import DEFAULT_FLOOR, check_floor
from fits.identify import require_span
from fits.noise import seed_noise
from fits.prediction import PredictionModel, prediction_model
from fits.results import BootstrapDraws, FitResult, bootstrap_fields, percentile_interval, resolve_level
from fits.robust import HUBER_DELTA, delta_from_replicates, huber, huber_grad, reduce_weight
from fits.threads import one_blas_thread
from fits.validate import (check_bootstrap, check_level, cluster_labels, numeric_column, require_columns, require_points,
                           row_ids)

log = logging.getLogger(__name__)

ALPHA_BOUNDS = (1e-4, 4.0)
ALPHA_GRID = np.geomspace(2e-4, 3.5, 64)
MIN_DISTINCT_X = 3
N_REFINED_STARTS = 4
LOG_E_SPAN_BELOW = 12.0  # log E may go this far below log min(y)
PARAM_NAMES = ("E", "A", "alpha")
FORMULA = "y = E + A * x^(-alpha)"


@dataclass(frozen=True)
class RawFit:
    """Optimiser-space solution: theta = (a, alpha, e) with z = log(x / x0)."""

    theta: np.ndarray
    objective: float
    log_x0: float

    @property
    def params(self) -> tuple[float, float, float]:
        a, alpha, e = self.theta
        return float(np.exp(e)), float(np.exp(a + alpha * self.log_x0)), float(alpha)


def _objective(theta: np.ndarray, z: np.ndarray, log_y: np.ndarray, delta: float, weight: float):
    # L-BFGS-B calls this some 600 times a fit on a few dozen points, so each numpy call counts: the two
    # terms of the LSE are kept apart, not stacked (the same operations on the same numbers, bit for bit)
    a, alpha, e = theta
    power = a - alpha * z
    top = np.maximum(power, e)
    ex_power, ex_floor = np.exp(power - top), np.exp(e - top)
    total = ex_power + ex_floor
    r = top + np.log(total) - log_y
    psi = weight * huber_grad(r, delta)
    soft_power = ex_power / total  # d LSE / d power; the floor's is ex_floor / total
    grad = np.array([psi @ soft_power, -(psi * z) @ soft_power, psi @ (ex_floor / total)])
    return weight * huber(r, delta).sum(), grad


def _grid_starts(z: np.ndarray, y: np.ndarray, log_y: np.ndarray, delta: float) -> np.ndarray:
    """Variable projection over α: exact least squares for (E, A) at every grid α, scored by the
    robust log objective. Returns starts (a, α, e): first the best grid point of every basin (a local
    minimum of the score along α), best first, then the rest by score. Refining only the best few
    points by score would refine one basin three times (neighbouring α) and miss a second one."""
    u = np.exp(-ALPHA_GRID[:, None] * z[None, :])  # (G, n)
    u_mean, y_mean = u.mean(axis=1), y.mean()
    cov = ((u - u_mean[:, None]) * (y - y_mean)).mean(axis=1)
    var = ((u - u_mean[:, None]) ** 2).mean(axis=1)
    floor = 1e-6 * y.min()
    A = np.maximum(cov / np.maximum(var, 1e-300), floor)
    E = np.clip(y_mean - A * u_mean, floor, 0.999 * y.min())
    pred = E[:, None] + A[:, None] * u
    score = huber(np.log(pred) - log_y[None, :], delta).sum(axis=1)
    padded = np.concatenate([[np.inf], score, [np.inf]])
    basin = (score <= padded[:-2]) & (score <= padded[2:])
    order = np.argsort(score, kind="stable")
    order = np.concatenate([order[basin[order]], order[~basin[order]]])
    return np.column_stack([np.log(A), ALPHA_GRID, np.log(E)])[order]


def _bounds(log_y: np.ndarray, *, pin_floor: bool = False) -> list[tuple[float, float]]:
    """Bounds on (a, α, e); with pin_floor, e is held on its lower bound (E ≈ 0: the nested law)."""
    lo, hi = float(log_y.min()), float(log_y.max())
    e_lo = lo - LOG_E_SPAN_BELOW
    return [(lo - 30.0, hi + 10.0), ALPHA_BOUNDS, (e_lo, e_lo if pin_floor else hi + 1.0)]


def fit_arrays(x: np.ndarray, y: np.ndarray, *, delta: float = HUBER_DELTA, reduction: str = "sum",
               start: np.ndarray | None = None, log_x0: float | None = None, check: bool = True,
               floor: str = DEFAULT_FLOOR) -> RawFit:
    """Core fit on float arrays (already validated). `start` (optimiser space) skips the grid:
    the bootstrap warm-starts every resample from the full-data solution. `floor`: `fits.floors`."""
    log_x = np.log(x)
    log_x0 = float(log_x.mean()) if log_x0 is None else log_x0
    z = log_x - log_x0
    log_y = np.log(y)
    weight = reduce_weight(len(y), reduction)
    bounds = _bounds(log_y, pin_floor=floor == "zero")
    starts = [start] if start is not None else list(_grid_starts(z, y, log_y, delta)[:N_REFINED_STARTS])
    best = None
    with one_blas_thread():
        for s in starts:
            s = np.clip(s, [b[0] for b in bounds], [b[1] for b in bounds])
            res = minimize(_objective, s, args=(z, log_y, delta, weight), jac=True, method="L-BFGS-B", bounds=bounds,
                           options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12 * weight})
            if np.all(np.isfinite(res.x)) and np.isfinite(res.fun) and (best is None or res.fun < best.fun):
                best = res
    if best is None:
        raise FitConvergenceError(f"power law: every start ended non-finite ({FORMULA})")
    if floor == "auto" and floor_at_bound(best.x, bounds):
        # The nested law: E pinned to its lower bound (≈ 0), A and α refitted to it, so that reporting
        # E = 0 moves no prediction.
        pinned = _bounds(log_y, pin_floor=True)
        start = np.clip(best.x, [b[0] for b in pinned], [b[1] for b in pinned])
        with one_blas_thread():
            nested = minimize(_objective, start, args=(z, log_y, delta, weight), jac=True, method="L-BFGS-B",
                              bounds=pinned, options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12 * weight})
        if np.all(np.isfinite(nested.x)) and np.isfinite(nested.fun):
            best = nested
    raw = RawFit(theta=best.x, objective=float(best.fun), log_x0=log_x0)
    if check:
        check_bounds(raw.theta, bounds, zero_floor=floor != "fit")
    return raw


# An E below this fraction of the smallest y is no floor the data can show: the optimiser, working in
# log E where the objective goes flat as E → 0, stops anywhere down there, so such an E is on its
# lower bound in all but name.
NEGLIGIBLE_FLOOR = 1e-2


_NO_FLOOR_HINT = (" (E → 0: these points show no loss floor, so E and α are not separately identified; add rungs "
                  "further up in compute or repeat runs to beat the noise, or fit with floor 'auto': the nested "
                  "law A·x^(−α), flagged E = 0)")


def floor_at_bound(theta: np.ndarray, bounds: list[tuple[float, float]]) -> bool:
    """E on its lower bound, or negligible against the smallest y (NEGLIGIBLE_FLOOR)."""
    log_y_min = bounds[2][0] + LOG_E_SPAN_BELOW
    return bool(theta[2] <= log_y_min + np.log(NEGLIGIBLE_FLOOR))


def check_bounds(theta: np.ndarray, bounds: list[tuple[float, float]], zero_floor: bool = False) -> None:
    names = ("log A (at the reference compute)", "alpha", "log E")
    for k, (name, value, (lo, hi)) in enumerate(zip(names, theta, bounds)):
        tol = 1e-6 * (hi - lo)
        if k == 2 and floor_at_bound(theta, bounds):
            if zero_floor:
                continue  # E = 0 accepted: the nested law A·x^(−α)
            raise FitBoundaryError(f"power law: log E = {value:.4g} is at or near its lower bound {lo:.4g} (E below "
                                   f"{NEGLIGIBLE_FLOOR:g} × the smallest y){_NO_FLOOR_HINT}", parameter=name,
                                   value=float(value))
        if value <= lo + tol or value >= hi - tol:  # (E's lower bound is caught above, as no floor)
            raise FitBoundaryError(f"power law: {name} = {value:.4g} ended on its bound [{lo:.4g}, {hi:.4g}]",
                                   parameter=name, value=float(value))


class PowerLawResult(FitResult):
    """E + A·x^(−α) with prediction, inversion and bootstrap bands."""

    def predict(self, x) -> np.ndarray:
        p = self.params
        return p["E"] + p["A"] * np.asarray(x, dtype=float) ** (-p["alpha"])

    def inverse(self, y) -> np.ndarray:
        """The x at which the law reaches y; inf where y is at or below the floor E."""
        p = self.params
        return _inverse(np.asarray(y, dtype=float), p["E"], p["A"], p["alpha"])

    def predict_draws(self, x) -> np.ndarray:
        """(n_bootstrap, len(x)) predictions from the bootstrap parameter draws."""
        E, A, alpha = (self.bootstrap_column(n)[:, None] for n in PARAM_NAMES)
        return E + A * np.atleast_1d(np.asarray(x, dtype=float))[None, :] ** (-alpha)

    def inverse_draws(self, y) -> np.ndarray:
        E, A, alpha = (self.bootstrap_column(n)[:, None] for n in PARAM_NAMES)
        return _inverse(np.atleast_1d(np.asarray(y, dtype=float))[None, :], E, A, alpha)

    @property
    def prediction_model(self) -> PredictionModel | None:
        """What a new run's prediction interval needs (`fits.prediction`); None for a law saved before it."""
        d = self.extra.get("prediction")
        return PredictionModel.from_dict(d) if d else None

    def new_run_interval(self, x, level: float | None = None, **kwargs) -> dict:
        """The prediction interval of a new run at x, with each source's share (`fits.prediction`):
        what a backtest, a recipe card and an efficiency gain read. Raises where the interval rule
        (`interval_note`) says there is none, or the law carries no prediction model."""
        note = self.interval_note
        model = self.prediction_model
        if note is not None or model is None:
            raise ValueError(f"{self.law}: interval not available: {note or 'no prediction model (refit the law)'}")
        return model.interval(x, resolve_level(level, self.ci_level), **kwargs)

    def conf_int(self, level: float | None = None) -> dict[str, tuple[float, float]]:
        """Each parameter's interval at `level` from the draws; E's from 0 where the law reports E = 0
        (`floor_interval`)."""
        return floor_interval(super().conf_int(level), bool(self.extra.get("floor_at_zero")))

    def predict_interval(self, x, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of the law's bootstrap band at x. Raises where the interval rule
        (`interval_note`) says there is none: callers show "not available" instead."""
        note = self.interval_note
        if note is not None:
            raise ValueError(f"{self.law}: interval not available: {note}")
        return percentile_interval(self.predict_draws(x), resolve_level(level, self.ci_level))


def floor_interval(ci: dict[str, tuple[float, float]], floor_at_zero: bool) -> dict[str, tuple[float, float]]:
    """Where the law reports E = 0 (the nested law under floor "auto"), E's interval from 0 to the draws'
    upper percentile. Under "auto" the resamples leave E free and stop at its lower bound (e^−12 ≈ 6e-6 ×
    the smallest y, `LOG_E_SPAN_BELOW`, not 0) or above, so their percentiles exclude the 0 reported; 0 is
    the value the data cannot tell from the resamples' smallest floors, the upper end the largest floor
    they find. (Under "zero" the draws' E is 0 already.)"""
    if not floor_at_zero or "E" not in ci:
        return ci
    return {**ci, "E": (0.0, max(0.0, float(ci["E"][1])))}


# What a saved law's parameters may be: name → (test, what it must be).
_PARAM_RULES = {"E": (lambda v: v >= 0, "a finite number ≥ 0"), "A": (lambda v: v > 0, "a finite number > 0"),
                "alpha": (lambda v: v > 0, "a finite number > 0")}


def _finite(value, key: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise FitInputError(f"{key} must be a finite number, got {value!r}") from None
    if not np.isfinite(number):
        raise FitInputError(f"{key} must be a finite number, got {value!r}")
    return number


def power_law_from_dict(d: dict) -> PowerLawResult:
    """Rebuild a result from its `to_dict(include_draws=True)` form (a saved laws file). A parameter, an
    interval end or a bootstrap draw that is not a finite number (NaN or inf in the file), or a parameter
    out of its range, is refused naming its key."""
    known = {"law", "formula", "params", "ci", "se", "ci_level", "n_bootstrap", "objective", "n_points",
             "rows_used", "residuals", "options", "code_version", "bootstrap_draws"}
    if not isinstance(d.get("params"), dict) or any(k not in d["params"] for k in PARAM_NAMES):
        raise FitInputError(f"not a power-law result: needs params {list(PARAM_NAMES)}")
    params = {k: _finite(d["params"][k], f"params.{k}") for k in PARAM_NAMES}
    for k, (ok, what) in _PARAM_RULES.items():
        if not ok(params[k]):
            raise FitInputError(f"params.{k} must be {what}, got {params[k]!r}")
    ci_in = d.get("ci") or {}
    if not isinstance(ci_in, dict):
        raise FitInputError(f"ci must be an object of parameter → [low, high], got {type(ci_in).__name__}")
    ci = {}
    for k, v in ci_in.items():
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise FitInputError(f"ci.{k} must be [low, high], got {v!r}")
        lo, hi = _finite(v[0], f"ci.{k}[0]"), _finite(v[1], f"ci.{k}[1]")
        if lo > hi:
            raise FitInputError(f"ci.{k} must be [low, high] with low ≤ high, got {list(v)!r}")
        ci[k] = (lo, hi)
    draws = d.get("bootstrap_draws")
    bootstrap = None
    if draws:
        try:
            bootstrap = np.asarray(draws, dtype=float)
        except (TypeError, ValueError):
            raise FitInputError(f"bootstrap_draws must be rows of {len(PARAM_NAMES)} numbers "
                                f"({', '.join(PARAM_NAMES)})") from None
        if bootstrap.ndim != 2 or bootstrap.shape[1] != len(PARAM_NAMES):
            raise FitInputError(f"bootstrap_draws must be rows of {len(PARAM_NAMES)} numbers ({', '.join(PARAM_NAMES)}), "
                                f"got shape {list(bootstrap.shape)}")
        bad = ~np.isfinite(bootstrap)
        if bad.any():
            row, col = (int(i) for i in np.argwhere(bad)[0])
            raise FitInputError(f"bootstrap_draws[{row}][{col}] ({PARAM_NAMES[col]}) must be a finite number, got "
                                f"{bootstrap[row, col]!r} ({int(bad.any(axis=1).sum())} draw(s) have one)")
    return PowerLawResult(
        law="power_law", formula=d.get("formula", FORMULA), params=params, objective=float(d.get("objective") or 0.0),
        n_points=int(d.get("n_points") or 0), rows_used=list(d.get("rows_used") or []),
        residuals=list(d.get("residuals") or []), options=dict(d.get("options") or {}),
        ci=floor_interval(ci, bool(d.get("floor_at_zero"))), se=dict(d.get("se") or {}),
        ci_level=d.get("ci_level"), n_bootstrap=int(d.get("n_bootstrap") or 0),
        extra={k: v for k, v in d.items() if k not in known}, code_version=d.get("code_version") or "unknown",
        bootstrap_params=bootstrap,
    )


def resolve_delta(delta: float | str, xs: np.ndarray, ys: np.ndarray) -> tuple[float, str]:
    """(δ, how it was chosen) from a number or "auto"."""
    if isinstance(delta, str):
        if delta != "auto":
            raise FitInputError(f"delta must be a positive number or 'auto', got {delta!r}")
        return delta_from_replicates(xs, ys)
    if not (np.isfinite(delta) and delta > 0):
        raise FitInputError(f"delta must be a positive number or 'auto', got {delta!r}")
    return float(delta), "given"


def _eval_variance(df: pd.DataFrame, y: str, ys: np.ndarray, se_column: str | None) -> np.ndarray | None:
    """(se/y)² per row from the standard-error column, None where there is none (or it has gaps: old runs)."""
    name = f"{y}_se" if se_column == "auto" else se_column
    if name is None or name not in df.columns:
        if se_column not in (None, "auto"):
            raise FitInputError("no such column (the held-out standard error of y)", column=se_column)
        return None
    se = pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float)
    return (se / ys) ** 2 if np.all(np.isfinite(se)) and np.all(se >= 0) else None


def _inverse(y, E, A, alpha):
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (A / (y - E)) ** (1.0 / alpha)
    return np.where(y > E, out, np.inf)


def fit_power_law(df: pd.DataFrame, x: str = "train_flops", y: str = "bpb", *, delta: float | str = HUBER_DELTA,
                  reduction: str = "sum", bootstrap: int = 0, ci_level: float = 0.95, seed: int = 0,
                  id_column: str | None = "run_id", group: str | None = None,
                  cluster: str | None = None, floor: str = DEFAULT_FLOOR, se_column: str | None = "auto") -> PowerLawResult:
    """Fit y = E + A·x^(−α) to the rows of `df` (one law; `fits.compute_laws.fit_power_laws` fits one per
    group). With `cluster`, the bootstrap draws whole clusters (rows sharing that column's value).
    `delta="auto"` scales the Huber threshold to the replicate noise of these rows; `floor` says what
    an E that runs to zero becomes (`fits.floors`, module docstring). `se_column` ("auto": `<y>_se` where the
    table has it) holds each run's held-out sampling standard error of y, for the prediction interval."""
    check_floor(floor)
    bootstrap, ci_level = check_bootstrap(bootstrap), check_level(ci_level)
    require_columns(df, [x, y] + ([cluster] if cluster else []))
    clusters = cluster_labels(df, cluster) if cluster and bootstrap else None
    xs = numeric_column(df, x, positive=True)
    ys = numeric_column(df, y, positive=True)
    require_points(len(np.unique(xs)), MIN_DISTINCT_X, "the power law E + A·x^(−α) (3 parameters)", x)
    require_span(xs, x, x)
    delta, delta_rule = resolve_delta(delta, xs, ys)
    raw = fit_arrays(xs, ys, delta=delta, reduction=reduction, floor=floor)
    E, A, alpha = raw.params
    at_zero = floor != "fit" and floor_at_bound(raw.theta, _bounds(np.log(ys)))
    if at_zero:
        E = 0.0
    residuals = np.log(ys) - np.log(E + A * xs ** (-alpha))
    params = {"E": E, "A": A, "alpha": alpha}
    se = _eval_variance(df, y, ys, se_column)
    model = prediction_model(raw.theta, raw.log_x0, xs, ys, nested=at_zero or floor == "zero",
                             noise=seed_noise(xs, np.log(ys)), eval_variance=se)
    extra = {"group": group, "log_x0": raw.log_x0, "x_range": [float(xs.min()), float(xs.max())],
             "floor_at_zero": at_zero, "prediction": model.to_dict()}
    intervals: dict = {}
    if bootstrap > 0:
        draws = bootstrap_power_law(raw, xs, ys, n=bootstrap, seed=seed, delta=delta,
                                    bounds=_bounds(np.log(ys), pin_floor=floor == "zero"),
                                    min_distinct_x=MIN_DISTINCT_X, clusters=clusters)
        if floor == "zero":  # E is 0 by assumption in every resample, as in the law itself
            draws = BootstrapDraws(params=draws.params * np.array([0.0, 1.0, 1.0]), failed=draws.failed)
        intervals = bootstrap_fields(list(PARAM_NAMES), draws, ci_level)
        intervals["ci"] = floor_interval(intervals["ci"], at_zero)  # E reported as 0: its interval from 0
        judged = judge_power_law_interval(params, intervals["ci"], draws.params[:, PARAM_NAMES.index("alpha")],
                                          ci_level=ci_level, n_distinct=len(np.unique(xs)), alpha_bounds=ALPHA_BOUNDS)
        extra |= {"bootstrap_failed": draws.failed, **judged}
        if not judged["interval"]["available"]:
            intervals |= {"ci": {}, "se": {}}
    return PowerLawResult(
        law="power_law", formula=FORMULA.replace("x", x).replace("y =", f"{y} ="), params=params,
        objective=raw.objective, n_points=len(ys), rows_used=row_ids(df, id_column), residuals=residuals.tolist(),
        options={"x": x, "y": y, "delta": delta, "delta_rule": delta_rule, "floor": floor,
                 "zero_floor": floor != "fit", "reduction": reduction, "bootstrap": bootstrap, "seed": seed,
                 "ci_level": ci_level, "cluster": cluster,
                 "alpha_grid": [float(ALPHA_GRID[0]), float(ALPHA_GRID[-1]), len(ALPHA_GRID)]},
        extra=extra, **intervals,
    )
