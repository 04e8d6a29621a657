"""L(N, D) = E + A/N^η + B/D^η: one exponent for N and D, the form fitted jointly over several
token multipliers for over-trained models (Gadre et al. 2024 write it E + (a·N^−η + b·D^−η)).

The same objective and machinery as `fits.chinchilla` with α = β = η: the 4-parameter problem is the
5-parameter one on the diagonal (its gradient in η is the sum of the α and β components), screened
on the diagonal of Hoffmann's grid and polished in centred coordinates to the same projected-gradient
tolerance.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from fits.chinchilla import (BOUNDS, MIN_POINTS, ChinchillaResult, _score, check_delta, check_n_starts, compute_optimal, hoffmann_starts,
                             natural_params, objective)
from fits.convergence import PG_TOL, polish, projected_gradient
from fits.errors import FitBoundaryError, FitConvergenceError
from fits.identify import require_span
from fits.robust import HUBER_DELTA
from fits.threads import one_blas_thread
from fits.validate import numeric_column, require_columns, require_points, row_ids

FORMULA = "L = E + A / N^eta + B / D^eta"


def _full(t: np.ndarray) -> np.ndarray:
    return np.array([t[0], t[1], t[2], t[3], t[3]])


def objective_shared(t: np.ndarray, log_n, log_d, log_l, delta: float, weight: float):
    f, g = objective(_full(t), log_n, log_d, log_l, delta, weight)
    return f, np.array([g[0], g[1], g[2], g[3] + g[4]])


def fit_shared_exponent(df: pd.DataFrame, n: str = "params", d: str = "tokens", y: str = "loss", *,
                        delta: float = HUBER_DELTA, n_starts: int = 64, id_column: str | None = "run_id") -> ChinchillaResult:
    check_n_starts(n_starts)  # a negative count would slice the grid from its end
    check_delta(delta)
    require_columns(df, [n, d, y])
    N, D, L = (numeric_column(df, c, positive=True) for c in (n, d, y))
    require_points(len(set(zip(N, D))), MIN_POINTS, "L(N, D) = E + A/N^η + B/D^η (4 parameters)", f"{n}, {d}")
    require_span(N, n, "N")
    require_span(D, d, "D")
    log_n, log_d, log_l = np.log(N), np.log(D), np.log(L)
    grid = hoffmann_starts()
    grid = grid[grid[:, 3] == grid[:, 4]]
    grid = grid[np.argsort(_score(grid, log_n, log_d, log_l, delta), kind="stable")[:n_starts]][:, :4]
    bounds = BOUNDS[:4]
    mn, md = float(log_n.mean()), float(log_d.mean())
    c_args = (log_n - mn, log_d - md, log_l, delta, 1.0)
    c_bounds = [(log_l.min() - 40.0, log_l.max() + 20.0)] * 2 + BOUNDS[2:4]
    ends = []
    with one_blas_thread():
        for s in grid:
            res = minimize(objective_shared, s, args=(log_n, log_d, log_l, delta, 1.0), jac=True, method="L-BFGS-B",
                           bounds=bounds)
            if np.all(np.isfinite(res.x)) and np.isfinite(res.fun):
                ends.append(res)
        if not ends:
            raise FitConvergenceError(f"shared exponent: every one of {len(grid)} starts ended non-finite")
        ends.sort(key=lambda r: r.fun)
        best = None
        for res in ends[:4]:
            a, b, e, eta = res.x
            p = polish(objective_shared, np.array([a - eta * mn, b - eta * md, e, eta]), c_args, c_bounds)
            if best is None or p.fun < best.fun:
                best = p
    a, b, e, eta = best.x
    theta = np.array([a + eta * mn, b + eta * md, e, eta])
    pg = projected_gradient(best.x, objective_shared(best.x, *c_args)[1], c_bounds)
    if pg > PG_TOL:
        raise FitConvergenceError(f"shared exponent: not converged (projected gradient {pg:.3g} > {PG_TOL:g})")
    for name, value, (lo, hi) in zip(("a", "b", "e", "eta"), theta, bounds):
        if value <= lo + 1e-6 * (hi - lo) or value >= hi - 1e-6 * (hi - lo):
            raise FitBoundaryError(f"shared exponent: {name} = {value:.4g} ended on its bound [{lo:g}, {hi:g}]",
                                   parameter=name, value=float(value))
    params = natural_params(_full(theta))
    pred = params["E"] + params["A"] / N ** eta + params["B"] / D ** eta
    return ChinchillaResult(
        law="chinchilla_shared_exponent", formula=FORMULA, params=params, objective=float(best.fun), n_points=len(L),
        rows_used=row_ids(df, id_column), residuals=(log_l - np.log(pred)).tolist(),
        options={"n": n, "d": d, "y": y, "delta": delta, "n_starts": n_starts, "shared_exponent": True},
        extra={"compute_optimal": compute_optimal(params), "eta": float(eta),
               "optimizer": {"converged": True, "projected_gradient": pg, "n_iterations": best.n_iterations,
                             "polished": True, "pg_tol": PG_TOL, "starts": len(grid)}},
    )
