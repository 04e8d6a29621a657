"""The two-variable law L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022, Approach 3).

Fitted exactly as Epoch's replication settled it (Besiroglu et al. 2024): in log space,
log L̂ = LSE(a − α·log N, b − β·log D, e) with A = e^a, B = e^b, E = e^e; Huber (δ = 1e-3) on
log L̂ − log L, SUMMED; L-BFGS-B with the analytic gradient from a grid of starts, best kept.

Starts:
- "hoffmann": the published grid α, β ∈ {0, .5, …, 2}, e ∈ {−1, −.5, …, 1}, a, b ∈ {0, 5, …, 25}
  (4,500 points). All of them are scored in one vectorised pass and L-BFGS-B runs from the
  `n_starts` best (all of them with n_starts=None, which is Epoch's "replicate exactly").
- "varpro": variable projection, a grid over (α, β) with E, A, B solved by least squares at each
  point (they enter linearly), the best `n_starts` refined. Cheaper and as robust.

`reduction="mean"` reproduces Hoffmann's mistake: the averaged objective's gradient is n times
smaller, so L-BFGS-B's gradient tolerance stops it near its start.

By default (`options=None`) the starts run at scipy's tolerances and the best `POLISH_TOP` distinct
end points are then polished to a tight projected-gradient tolerance (`fits.convergence`) in centred
coordinates a' = a − α·mean(log N), b' = b − β·mean(log D), which take the α–a and β–b correlation
(a ridge of slope log N ≈ 20) out of the problem. Without it the default stopped partway along the
flat β–log B valley of well-fitted data (β 0.45–0.51 against published 0.58–0.69). The
result reports `extra["optimizer"]["converged"]` and the projected gradient; a default fit that does
not converge raises `FitConvergenceError`. Explicit `options` run as given, unpolished (how Hoffmann
and Epoch ran it), and only report convergence.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from fits.bootstrap import bootstrap_chinchilla
from fits.convergence import PG_TOL, polish, projected_gradient
from fits.errors import FitBoundaryError, FitConvergenceError, FitInputError
from fits.identify import require_span, wide_interval_flags
from fits.results import FitResult, bootstrap_fields, percentile_interval
from fits.robust import HUBER_DELTA, huber, huber_grad, reduce_weight
from fits.threads import one_blas_thread
from fits.validate import check_bootstrap, check_level, numeric_column, require_columns, require_points, row_ids

log = logging.getLogger(__name__)

THETA_NAMES = ("a", "b", "e", "alpha", "beta")
BOUNDS = [(-20.0, 60.0), (-20.0, 60.0), (-5.0, 5.0), (1e-4, 3.0), (1e-4, 3.0)]
HOFFMANN_GRID = {
    "a": np.arange(0.0, 25.0 + 1e-9, 5.0), "b": np.arange(0.0, 25.0 + 1e-9, 5.0),
    "e": np.arange(-1.0, 1.0 + 1e-9, 0.5), "alpha": np.arange(0.0, 2.0 + 1e-9, 0.5),
    "beta": np.arange(0.0, 2.0 + 1e-9, 0.5),
}
VARPRO_EXPONENTS = np.linspace(0.02, 2.5, 60)
MIN_POINTS = 6
# Default optimiser options are scipy's (what Hoffmann and Epoch ran); with the summed objective
# they converge to Epoch's optimum. TIGHT_OPTIONS converge even the averaged objective, which
# shows that Hoffmann's early stop is a tolerance artefact, not a different minimum.
TIGHT_OPTIONS = {"ftol": 1e-15, "gtol": 1e-10, "maxiter": 5000}
FORMULA = "L = E + A / N^alpha + B / D^beta"
POLISH_TOP = 4  # distinct best end points of the start grid that are polished


@dataclass(frozen=True)
class RawChinchilla:
    theta: np.ndarray  # (a, b, e, alpha, beta)
    objective: float
    n_iterations: int
    message: str
    starts_tried: int
    converged: bool = True
    projected_gradient: float = 0.0
    polished: bool = False


def natural_params(theta: np.ndarray) -> dict[str, float]:
    a, b, e, alpha, beta = (float(v) for v in theta)
    return {"E": float(np.exp(e)), "A": float(np.exp(a)), "B": float(np.exp(b)), "alpha": alpha, "beta": beta}


def compute_optimal(params: dict[str, float]) -> dict[str, float]:
    """N_opt = G·(C/6)^a, D_opt = G^(−1)·(C/6)^b with a = β/(α+β), b = α/(α+β)."""
    al, be = params["alpha"], params["beta"]
    G = (al * params["A"] / (be * params["B"])) ** (1.0 / (al + be))
    return {"a": be / (al + be), "b": al / (al + be), "G": G}


def objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray, delta: float,
              weight: float) -> tuple[float, np.ndarray]:
    # L-BFGS-B calls this ~45 times per start, 4,500 starts in Epoch's grid: the three terms of the LSE are
    # kept apart, not stacked (the same operations on the same numbers, bit for bit, in fewer numpy calls)
    a, b, e, al, be = theta
    t_n, t_d = a - al * log_n, b - be * log_d
    top = np.maximum(np.maximum(t_n, t_d), e)
    ex_n, ex_d, ex_e = np.exp(t_n - top), np.exp(t_d - top), np.exp(e - top)
    tot = ex_n + ex_d + ex_e
    r = top + np.log(tot) - log_l
    psi = weight * huber_grad(r, delta) / tot
    grad = np.array([psi @ ex_n, psi @ ex_d, psi @ ex_e, -(psi * log_n) @ ex_n, -(psi * log_d) @ ex_d])
    return weight * float(huber(r, delta).sum()), grad


def _score(thetas: np.ndarray, log_n, log_d, log_l, delta: float) -> np.ndarray:
    """Objective of many candidate thetas at once (rows), in chunks to bound memory."""
    out = np.empty(len(thetas))
    for i in range(0, len(thetas), 512):
        t = thetas[i:i + 512]
        terms = np.stack([t[:, 0:1] - t[:, 3:4] * log_n, t[:, 1:2] - t[:, 4:5] * log_d,
                          np.broadcast_to(t[:, 2:3], (len(t), len(log_n)))])
        lse = np.logaddexp.reduce(terms, axis=0)
        out[i:i + 512] = huber(lse - log_l, delta).sum(axis=1)
    return out


def hoffmann_starts() -> np.ndarray:
    g = HOFFMANN_GRID
    return np.array(list(itertools.product(g["a"], g["b"], g["e"], g["alpha"], g["beta"])))


def varpro_starts(N: np.ndarray, D: np.ndarray, L: np.ndarray) -> np.ndarray:
    """For each (α, β) on a grid, E, A, B by least squares in linear space (clipped positive)."""
    al, be = np.meshgrid(VARPRO_EXPONENTS, VARPRO_EXPONENTS, indexing="ij")
    al, be = al.ravel(), be.ravel()
    # Scale N and D so the columns are O(1); the coefficients are rescaled back below.
    n0, d0 = np.exp(np.log(N).mean()), np.exp(np.log(D).mean())
    u = (N / n0)[None, :] ** (-al[:, None])
    v = (D / d0)[None, :] ** (-be[:, None])
    X = np.stack([np.ones_like(u), u, v], axis=-1)  # (G, n, 3)
    XtX = np.einsum("gni,gnj->gij", X, X) + 1e-12 * np.eye(3)
    coef = np.linalg.solve(XtX, np.einsum("gni,n->gi", X, L)[..., None])[..., 0]
    floor = 1e-6 * L.min()
    E = np.clip(coef[:, 0], floor, 0.999 * L.min())
    A = np.maximum(coef[:, 1], floor) * n0**al
    B = np.maximum(coef[:, 2], floor) * d0**be
    return np.column_stack([np.log(A), np.log(B), np.log(E), al, be])


def check_n_starts(n_starts: int | None) -> None:
    """n_starts is a count of grid starts (≥ 1) or None (all): a negative one would slice the grid from its end."""
    if n_starts is None:
        return
    if isinstance(n_starts, bool) or not isinstance(n_starts, (int, np.integer)) or n_starts < 1:
        raise FitInputError(f"n_starts must be a whole number ≥ 1, the grid starts refined (--n-starts 0, "
                            f"n_starts=None: all of them), got {n_starts!r}")


def check_delta(delta: object) -> float:
    """The Huber threshold of an L(N, D) fit: a positive finite number ("auto" is the power law's, from
    replicate runs at one x, which an L(N, D) table does not have)."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.number)) or not (np.isfinite(delta) and delta > 0):
        raise FitInputError(f"delta must be a positive finite number (the Huber threshold on log residuals, default "
                            f"{HUBER_DELTA:g}), got {delta!r}")
    return float(delta)


def fit_chinchilla_arrays(N: np.ndarray, D: np.ndarray, L: np.ndarray, *, delta: float = HUBER_DELTA,
                          reduction: str = "sum", starts: str | np.ndarray = "hoffmann", n_starts: int | None = 64,
                          options: dict | None = None, check: bool = True) -> RawChinchilla:
    check_delta(delta)
    if isinstance(starts, str) and starts not in ("hoffmann", "varpro"):
        raise FitInputError(f"starts must be 'hoffmann', 'varpro' or an array of starts, got {starts!r}")
    log_n, log_d, log_l = np.log(N), np.log(D), np.log(L)
    weight = reduce_weight(len(L), reduction)
    if isinstance(starts, str):
        check_n_starts(n_starts)
        grid = hoffmann_starts() if starts == "hoffmann" else varpro_starts(N, D, L)
        if n_starts is not None and n_starts < len(grid):
            grid = grid[np.argsort(_score(grid, log_n, log_d, log_l, delta), kind="stable")[:n_starts]]
    else:
        grid = np.atleast_2d(starts)
    ends = []
    with one_blas_thread():
        for i, s in enumerate(grid):
            if len(grid) > 256 and i % 500 == 0:
                log.info("chinchilla: L-BFGS-B from start %d of %d", i, len(grid))
            res = minimize(objective, s, args=(log_n, log_d, log_l, delta, weight), jac=True, method="L-BFGS-B",
                           bounds=BOUNDS, options=options or {})
            if np.all(np.isfinite(res.x)) and np.isfinite(res.fun):
                ends.append(res)
        if not ends:
            raise FitConvergenceError(f"chinchilla: every one of {len(grid)} starts ended non-finite")
        ends.sort(key=lambda r: r.fun)
        best = ends[0]
        theta, fun, n_it = best.x, float(best.fun), int(best.nit)
        centred = _Centred(log_n, log_d, log_l, delta)
        if options is None:
            for res in _distinct(ends, POLISH_TOP):
                p = polish(objective, centred.to_centred(res.x), centred.args, centred.bounds)
                if np.all(np.isfinite(p.x)) and weight * p.fun <= fun:
                    theta, fun, n_it = centred.from_centred(p.x), weight * p.fun, int(res.nit) + p.n_iterations
        pg = centred.projected_gradient(theta)
    raw = RawChinchilla(theta=theta, objective=float(fun), n_iterations=n_it, message=str(best.message),
                        starts_tried=len(grid), converged=pg <= PG_TOL, projected_gradient=pg,
                        polished=options is None)
    if check and options is None and not raw.converged:
        raise FitConvergenceError(f"chinchilla: not converged (projected gradient {pg:.3g} > {PG_TOL:g} after "
                                  f"{n_it} iterations); the objective is too flat here to trust the parameters")
    if check:
        for name, value, (lo, hi) in zip(THETA_NAMES, raw.theta, BOUNDS):
            if value <= lo + 1e-6 * (hi - lo) or value >= hi - 1e-6 * (hi - lo):
                raise FitBoundaryError(f"chinchilla: {name} = {value:.4g} ended on its bound [{lo:g}, {hi:g}]; the "
                                       "optimum lies outside the searched region", parameter=name, value=float(value))
    return raw


def _distinct(ends: list, k: int) -> list:
    """The best k end points that are not the same optimum twice."""
    out = []
    for res in ends:
        if all(not np.allclose(res.x, o.x, rtol=0.0, atol=1e-4) for o in out):
            out.append(res)
        if len(out) == k:
            break
    return out


class _Centred:
    """The objective in centred coordinates (a', b', e, α, β); the same minimum, well conditioned."""

    def __init__(self, log_n, log_d, log_l, delta: float) -> None:
        self.mn, self.md = float(log_n.mean()), float(log_d.mean())
        self.args = (log_n - self.mn, log_d - self.md, log_l, delta, 1.0)
        lo, hi = float(log_l.min()), float(log_l.max())
        self.bounds = [(lo - 40.0, hi + 20.0)] * 2 + BOUNDS[2:]

    def to_centred(self, theta: np.ndarray) -> np.ndarray:
        a, b, e, al, be = theta
        return np.array([a - al * self.mn, b - be * self.md, e, al, be])

    def from_centred(self, c: np.ndarray) -> np.ndarray:
        a, b, e, al, be = c
        return np.array([a + al * self.mn, b + be * self.md, e, al, be])

    def projected_gradient(self, theta: np.ndarray) -> float:
        """Of the summed objective, in centred coordinates (whatever the reduction)."""
        c = self.to_centred(theta)
        return projected_gradient(c, objective(c, *self.args)[1], self.bounds)


class ChinchillaResult(FitResult):
    def predict(self, N, D) -> np.ndarray:
        p = self.params
        return p["E"] + p["A"] / np.asarray(N, float) ** p["alpha"] + p["B"] / np.asarray(D, float) ** p["beta"]


def fit_chinchilla(df: pd.DataFrame, n: str = "params", d: str = "tokens", y: str = "loss", *,
                   delta: float = HUBER_DELTA, reduction: str = "sum", starts: str = "hoffmann",
                   n_starts: int | None = 64, options: dict | None = None, bootstrap: int = 0, ci_level: float = 0.95, seed: int = 0,
                   id_column: str | None = "run_id") -> ChinchillaResult:
    """Fit L(N, D) = E + A/N^α + B/D^β to the rows of `df`. `n_starts`: how many grid starts are refined
    (a whole number ≥ 1; None: every one)."""
    check_n_starts(n_starts)
    bootstrap, ci_level = check_bootstrap(bootstrap), check_level(ci_level)
    require_columns(df, [n, d, y])
    N = numeric_column(df, n, positive=True)
    D = numeric_column(df, d, positive=True)
    L = numeric_column(df, y, positive=True)
    require_points(len(set(zip(N, D))), MIN_POINTS, "L(N, D) = E + A/N^α + B/D^β (5 parameters)", f"{n}, {d}")
    for col, values, symbol in ((n, N, "N"), (d, D, "D")):
        require_points(len(np.unique(values)), 2, "an exponent on this column", col)
        require_span(values, col, symbol)
    raw = fit_chinchilla_arrays(N, D, L, delta=delta, reduction=reduction, starts=starts, n_starts=n_starts,
                                options=options)
    params = natural_params(raw.theta)
    pred = params["E"] + params["A"] / N ** params["alpha"] + params["B"] / D ** params["beta"]
    extra = {"compute_optimal": compute_optimal(params), "theta": dict(zip(THETA_NAMES, raw.theta.tolist())),
             "optimizer": {"n_iterations": raw.n_iterations, "message": raw.message, "starts": raw.starts_tried,
                           "converged": raw.converged, "projected_gradient": raw.projected_gradient,
                           "polished": raw.polished, "pg_tol": PG_TOL}}
    intervals: dict = {}
    if bootstrap > 0:
        draws = bootstrap_chinchilla(raw, N, D, L, n=bootstrap, seed=seed, delta=delta, bounds=BOUNDS,
                                     natural_params=natural_params)
        intervals = bootstrap_fields(list(params), draws, ci_level)
        al, be = draws.params[:, 3], draws.params[:, 4]
        lo, hi = percentile_interval(be / (al + be), ci_level)
        extra |= {"bootstrap_failed": draws.failed,
                  "compute_optimal_ci": {"a": [float(lo), float(hi)], "b": [float(1 - hi), float(1 - lo)]},
                  "flags": wide_interval_flags(params, intervals["ci"], ("alpha", "beta"))}
    return ChinchillaResult(
        law="chinchilla", formula=FORMULA, params=params, objective=raw.objective, n_points=len(L),
        rows_used=row_ids(df, id_column), residuals=(np.log(L) - np.log(pred)).tolist(),
        options={"n": n, "d": d, "y": y, "delta": delta, "reduction": reduction, "starts": starts,
                 "n_starts": n_starts, "optimizer_options": options, "bootstrap": bootstrap, "seed": seed, "ci_level": ci_level},
        extra=extra, **intervals,
    )
