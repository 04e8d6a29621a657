"""The power law's default starts reach the optimum a brute-force search finds:
L-BFGS-B from every one of the 64 variable-projection grid points, best kept, on varied synthetic
ladders and on Porian et al.'s compute-optimal losses (15 configurations, tests/data)."""

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import minimize

from fits.errors import FitError
from fits.power_law import _bounds, _grid_starts, _objective, fit_arrays

from .conftest import DATA


def brute_force_objective(x: np.ndarray, y: np.ndarray) -> float:
    log_x0 = float(np.log(x).mean())
    z, log_y = np.log(x) - log_x0, np.log(y)
    bounds = _bounds(log_y)
    lo, hi = np.array(bounds).T
    best = np.inf
    for s in _grid_starts(z, y, log_y, 1e-3):
        res = minimize(_objective, np.clip(s, lo, hi), args=(z, log_y, 1e-3, 1.0), jac=True, method="L-BFGS-B",
                       bounds=bounds, options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12})
        if np.isfinite(res.fun):
            best = min(best, float(res.fun))
    return best


def synthetic_sets(n_sets: int = 12, seed: int = 5):
    """Ladders of 4–40 points over 30×–10⁴× in compute, α 0.03–0.5, noise 0.2–3%."""
    rng = np.random.default_rng(seed)
    for _ in range(n_sets):
        n = int(rng.integers(4, 40))
        C = np.exp(rng.uniform(np.log(1e18), np.log(10 ** rng.uniform(19.5, 22)), n))
        E, A, alpha = rng.uniform(0.2, 2.0), 10 ** rng.uniform(0, 2.5), rng.uniform(0.03, 0.5)
        yield C, (E + A * (C / 1e18) ** -alpha) * np.exp(rng.normal(0, rng.uniform(0.002, 0.03), n))


def porian_sets():
    df = pd.read_csv(DATA / "porian_optimal_pairs.csv").dropna(subset=["loss_opt"])
    for _, g in df.groupby(["dataset", "hparams", "warmup", "decay", "param_count", "loss_source"]):
        yield g["flops"].to_numpy(float), g["loss_opt"].to_numpy(float)


@pytest.mark.parametrize("source", ["synthetic", "porian"])
def test_default_starts_reach_the_brute_force_optimum(source):
    sets = list(synthetic_sets() if source == "synthetic" else porian_sets())
    assert len(sets) == (12 if source == "synthetic" else 15)
    compared = 0
    for x, y in sets:
        try:
            fitted = fit_arrays(x, y, check=False).objective
        except FitError:
            continue  # every start non-finite: nothing to compare
        assert fitted <= brute_force_objective(x, y) * (1 + 1e-9)
        compared += 1
    if source == "porian":
        assert compared == 15  # every configuration of the published curves is fitted and compared

