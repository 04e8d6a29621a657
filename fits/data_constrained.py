"""The data-constrained law of Muennighoff et al. 2023 ("Scaling Data-Constrained Language
Models"): repeated data is worth less than fresh data, with a decay constant R*_D in epochs.

    L(N, D, U) = E + A / N'^α + B / D'^β
    D' = U_D + U_D·R*_D·(1 − exp(−R_D / R*_D)),   U_D = U,  R_D = max(D/U_D − 1, 0)
    N' = U_N + U_N·R*_N·(1 − exp(−R_N / R*_N)),   U_N = min(N, G·(G·U_D)^(β/α)),  R_N = max(N/U_N − 1, 0)
    G  = (α·A / (β·B))^(1/(α+β))   (the Chinchilla compute-optimal split)

U_N is the compute-optimal model size for the unique data; parameters beyond it count as
"repeated" parameters. The base (E, A, B, α, β) is fitted on unrepeated data; with it fixed, R*_D
and R*_N are fitted with the same summed Huber(δ = 1e-3) log objective, from the authors' start
grid, then polished with Nelder–Mead, because the objective is very flat along R*_D (L-BFGS-B
alone stops early there). This is the form that describes source scaling: every source of a rung
is repeated e_s times, and D' says how much those epochs are worth.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from fits.errors import FitBoundaryError, FitConvergenceError
from fits.results import FitResult
from fits.robust import HUBER_DELTA, huber, huber_grad
from fits.threads import one_blas_thread
from fits.validate import numeric_column, require_columns, require_points, row_ids

# Muennighoff et al.'s base, unrounded (datablations README / utils/parametric_fit.ipynb, commit 13701315).
MUENNIGHOFF_BASE = {"a": 6.255414, "b": 7.3049974, "e": 0.6254804, "alpha": 0.3526596, "beta": 0.3526596}
R_STAR_BOUNDS = (1e-3, 1e3)
START_GRID = np.linspace(0.0, 20.0, 4)[1:]  # the authors' grid, without the degenerate R* = 0
FORMULA = "L = E + A / N'^alpha + B / D'^beta (repetition-discounted N', D')"


def effective_data(D: np.ndarray, U: np.ndarray, r_star_d: float) -> np.ndarray:
    """D' in tokens: the first epoch counts fully, repeats decay with constant R*_D."""
    R_D = np.maximum(D / U - 1.0, 0.0)
    return U + U * r_star_d * (1.0 - np.exp(-R_D / r_star_d))


def unique_params(N: np.ndarray, U: np.ndarray, base: dict[str, float]) -> np.ndarray:
    A, B, al, be = np.exp(base["a"]), np.exp(base["b"]), base["alpha"], base["beta"]
    G = (al * A / (be * B)) ** (1.0 / (al + be))
    return np.minimum(N, G * (G * U) ** (be / al))


def effective_params(N: np.ndarray, U: np.ndarray, r_star_n: float, base: dict[str, float]) -> np.ndarray:
    U_N = unique_params(N, U, base)
    R_N = np.maximum(N / U_N - 1.0, 0.0)
    return U_N + U_N * r_star_n * (1.0 - np.exp(-R_N / r_star_n))


def predict_loss(N, D, U, r_star_d: float, r_star_n: float, base: dict[str, float] = MUENNIGHOFF_BASE) -> np.ndarray:
    N, D, U = (np.asarray(v, dtype=float) for v in (N, D, U))
    Dp, Np = effective_data(D, U, r_star_d), effective_params(N, U, r_star_n, base)
    return np.exp(base["e"]) + np.exp(base["a"]) / Np ** base["alpha"] + np.exp(base["b"]) / Dp ** base["beta"]


def _decay_and_grad(U_x: np.ndarray, R: np.ndarray, r_star: float) -> tuple[np.ndarray, np.ndarray]:
    """X' = U + U·R*·(1 − e^{−R/R*}) and dX'/dR*."""
    q = np.exp(-R / r_star)
    return U_x + U_x * r_star * (1.0 - q), U_x * ((1.0 - q) - (R / r_star) * q)


def objective(r_star: np.ndarray, N, D, U, log_l, base, delta: float) -> tuple[float, np.ndarray]:
    r_d, r_n = r_star
    U_N = unique_params(N, U, base)
    Dp, dDp = _decay_and_grad(U, np.maximum(D / U - 1.0, 0.0), r_d)
    Np, dNp = _decay_and_grad(U_N, np.maximum(N / U_N - 1.0, 0.0), r_n)
    terms = np.stack([base["a"] - base["alpha"] * np.log(Np), base["b"] - base["beta"] * np.log(Dp),
                      np.full_like(Np, base["e"])])
    top = terms.max(axis=0)
    ex = np.exp(terms - top)
    soft = ex / ex.sum(axis=0)
    r = top + np.log(ex.sum(axis=0)) - log_l
    psi = huber_grad(r, delta)
    grad = np.array([psi @ (soft[1] * -base["beta"] * dDp / Dp), psi @ (soft[0] * -base["alpha"] * dNp / Np)])
    return float(huber(r, delta).sum()), grad


class DataConstrainedResult(FitResult):
    def predict(self, N, D, U) -> np.ndarray:
        return predict_loss(N, D, U, self.params["R_star_D"], self.params["R_star_N"], self.extra["base"])


def fit_data_constrained(df: pd.DataFrame, n: str = "N_params", d: str = "D_tokens", u: str = "U_unique_tokens",
                         y: str = "val_loss", *, base: dict[str, float] | None = None, delta: float = HUBER_DELTA,
                         id_column: str | None = "run_name") -> DataConstrainedResult:
    """Fit R*_D and R*_N with the base law (log-space a, b, e, alpha, beta) held fixed."""
    base = dict(MUENNIGHOFF_BASE if base is None else base)
    require_columns(df, [n, d, u, y])
    N, D, U, L = (numeric_column(df, c, positive=True) for c in (n, d, u, y))
    require_points(len(set(zip(N, D, U))), 3, "the data-constrained law (2 free parameters)", f"{n}, {d}, {u}")
    if not np.any(D > U):
        raise FitBoundaryError("data-constrained law: no run repeats its data (D > U nowhere), so R*_D is not "
                               "identified", parameter="R_star_D")
    if not np.any(N > unique_params(N, U, base)):  # R_N = 0 everywhere: the objective is flat in R*_N
        raise FitBoundaryError("data-constrained law: no run has more parameters than its unique data supports "
                               "(N > U_N nowhere), so R*_N is not identified (the fit would return its start)",
                               parameter="R_star_N")
    log_l = np.log(L)
    args = (N, D, U, log_l, base, delta)
    bounds = [R_STAR_BOUNDS, R_STAR_BOUNDS]
    best = None
    with one_blas_thread():
        for start in itertools.product(START_GRID, START_GRID):
            res = minimize(objective, np.array(start), args=args, jac=True, method="L-BFGS-B", bounds=bounds,
                           options={"ftol": 1e-15, "gtol": 1e-12})
            if np.isfinite(res.fun) and (best is None or res.fun < best.fun):
                best = res
    if best is None:
        raise FitConvergenceError("data-constrained law: every start ended non-finite")
    # Inside the same bounds: unbounded, the simplex walked R* to 1e8 (and could to R* < 0, where exp(−R/R*)
    # overflows) on data whose optimum lies past the bound, and the refusal then named that value.
    polish = minimize(lambda t: objective(t, *args)[0], best.x, method="Nelder-Mead", bounds=bounds,
                      options={"xatol": 1e-6, "fatol": 1e-14, "maxiter": 4000})
    x = polish.x if polish.fun <= best.fun else best.x
    fun = min(polish.fun, best.fun)
    for name, value in zip(("R_star_D", "R_star_N"), x):
        if not R_STAR_BOUNDS[0] * 1.001 < value < R_STAR_BOUNDS[1] * 0.999:
            side = "upper" if value >= R_STAR_BOUNDS[1] * 0.999 else "lower"
            hint = (" (the repeated data show no decay within it: the runs cannot tell how many repetitions are "
                    "worth fresh data)" if side == "upper" else "")
            raise FitBoundaryError(f"data-constrained law: {name} = {value:.4g} ended on its {side} bound "
                                   f"{R_STAR_BOUNDS[1 if side == 'upper' else 0]:g}{hint}",
                                   parameter=name, value=float(value))
    pred = predict_loss(N, D, U, x[0], x[1], base)
    ss_res, ss_tot = np.sum((L - pred) ** 2), np.sum((L - L.mean()) ** 2)
    return DataConstrainedResult(
        law="data_constrained", formula=FORMULA, params={"R_star_D": float(x[0]), "R_star_N": float(x[1])},
        objective=float(fun), n_points=len(L), rows_used=row_ids(df, id_column),
        residuals=(log_l - np.log(pred)).tolist(),
        options={"n": n, "d": d, "u": u, "y": y, "delta": delta, "start_grid": START_GRID.tolist()},
        extra={"base": base, "r2_linear": float(1.0 - ss_res / ss_tot)},
    )
