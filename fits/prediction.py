"""Prediction intervals of a compute law for a new run, calibrated for small ladders.

What a new run at compute x* will measure, log y* = f(x*; θ̂) + ε*, misses the law's prediction by
two independent parts, and the interval adds their variances:

(a) the law's parameter uncertainty: the delta method, g'·Cov(θ̂)·g with g = ∂ log ŷ(x*)/∂θ, in the
    fit's own parameters θ = (a, α, e) (log ŷ = LSE(a − α·z, e), `fits.power_law`), or (a, α) for the
    nested law A·x^(−α) (E at zero: log ŷ is then linear in θ and the formula exact). Cov(θ̂) is the
    sandwich (J'J)⁻¹ J'ΣJ (J'J)⁻¹ of the unweighted fit, Σ each run's noise variance;
(b) the new run's seed-to-seed noise, σ²_seed: the noise model (`fits.noise`), pooled with the
    ladder's repeated seeds where it has them;
    ladder's repeated seeds where it has them.

The held-out set's sampling error, (se/y)² where the runs carry a standard-error column, is not a third
part: every rung (and the new run, and an efficiency gain's candidate arm) is scored on the same held-out
documents, so that error is one shift δ of the whole curve in log space, which the fit absorbs into log A
(exactly for the nested law, nearly so with a floor) and the new run carries too. For what a run will
measure on the same held-out set it cancels; counted as independent per-run noise it widened intervals
several-fold. It is reported beside the interval (`heldout_sampling_common`, ± at the interval's level,
normal quantile): it moves the level of the whole curve, i.e. what the domain itself would score.

Every run's variance is φ·σ²_seed with one scale φ that the ladder's residuals estimate
(E Σ r² = φ·Σ (1 − h_ii)·v_i; with repeated runs, only the rung means' lack of fit, K − p dof for K rungs,
since the runs' scatter within a rung already went into σ²_seed) and the noise model anchors (φ = 1 with
ν₀ dof, the repeated seeds' dof included): φ̂ is their dof-weighted mean, and the half-width is Student-t
with ν₀ + K − p dof. The t quantile and the
prior's dof are the small-sample correction: 5 rungs and 3 parameters leave 2 residual dof, and the
residuals' mean square alone would understate the noise. With a target run's variance split into its
two parts, the shares say what would narrow the interval (more rungs or seeds for (a), nothing for
(b) but averaging seeds of the target); more held-out documents narrow only the common shift.

The coverage this gives is measured, not assumed: tests/fits/test_prediction_coverage.py draws
synthetic ladders from known laws with measured noise; docs/fits.md has the figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from fits.noise import SeedNoise
from fits.validate import check_level

SOURCES = ("parameters", "seed_noise")
HELDOUT_COMMON_NOTE = ("held-out sampling error, shared by every rung: it moves the whole curve's level, not a "
                       "prediction relative to the measured rungs; more held-out documents narrow it")


def heldout_common(rel_variance, level: float) -> np.ndarray:
    """± (relative) at `level` of the held-out set's sampling error, from its (se/y)²: normal quantile (the
    standard error is over thousands of documents, not estimated from the rungs)."""
    z = float(stats.norm.ppf(0.5 + level / 2.0))
    return np.expm1(z * np.sqrt(np.asarray(rel_variance, dtype=float)))


def log_law_jacobian(theta: np.ndarray, z: np.ndarray, nested: bool) -> np.ndarray:
    """∂ log ŷ / ∂θ at z = log(x / x0): (n, 3) for θ = (a, α, e), (n, 2) for the nested law's (a, α)."""
    if nested:
        return np.column_stack([np.ones_like(z), -z])
    a, alpha, e = theta
    t1 = a - alpha * z
    s1 = np.exp(t1 - np.logaddexp(t1, e))
    return np.column_stack([s1, -z * s1, 1.0 - s1])


@dataclass(frozen=True)
class PredictionModel:
    """What a prediction interval at any x needs, kept with the law (`to_dict`/`from_dict` travel in a
    laws file): θ̂, the unit-scale covariance, the noise's scale and its dof."""

    theta: list[float]
    log_x0: float
    nested: bool
    cov_unit: list[list[float]]  # Cov(θ̂) at φ = 1
    seed_variance: float
    scale: float  # φ̂
    residual_scale: float | None  # the residuals' own estimate of φ (None: no residual dof)
    dof: float
    n_points: int
    n_params: int
    noise_source: str
    heldout_variance: float = 0.0  # mean (se/y)² of the fitted runs: reported, common to every rung, not in Cov

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PredictionModel:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def interval(self, x, level: float = 0.95, *, eval_variance=None, n_runs=1) -> dict[str, Any]:
        """The interval of the mean of `n_runs` new runs at each x (arrays), scored on the ladder's held-out
        set, with each source's share of the variance. `eval_variance`: (se/y)² of the new runs' held-out
        BPB (None: the fitted runs' mean); it does not enter the interval (module docstring) and comes
        back as `heldout_sampling_common`, its ± at `level`."""
        level = check_level(level, "level")
        x = np.atleast_1d(np.asarray(x, dtype=float))
        z = np.log(x) - self.log_x0
        theta = np.asarray(self.theta)
        g = log_law_jacobian(theta, z, self.nested)
        log_pred = _log_predict(theta, z, self.nested)
        parts = np.stack([self.scale * np.einsum("ij,jk,ik->i", g, np.asarray(self.cov_unit), g),
                          np.full_like(z, self.scale * self.seed_variance) / n_runs])
        ev = self.heldout_variance if eval_variance is None else eval_variance
        total = parts.sum(axis=0)
        t = float(stats.t.ppf(0.5 + level / 2.0, self.dof))
        half = t * np.sqrt(total)
        return {"predicted": np.exp(log_pred), "lo": np.exp(log_pred - half), "hi": np.exp(log_pred + half),
                "half_width_log": half, "t": t, "dof": self.dof, "level": level,
                "shares": {name: parts[k] / total for k, name in enumerate(SOURCES)},
                "sd_log": {name: np.sqrt(parts[k]) for k, name in enumerate(SOURCES)},
                "heldout_sampling_common": heldout_common(np.broadcast_to(np.asarray(ev, dtype=float), z.shape), level)}

    def inverse_interval(self, y, level: float = 0.95, *, eval_variance=None, n_runs=1) -> dict[str, Any]:
        """The x at which the law reaches a measured y (the mean of `n_runs` runs), with its interval:
        the same three sources, carried to log x through the law's slope there (the delta method). An
        efficiency gain's interval (`fits.efficiency`: the candidate arm is scored on the baseline's held-out
        sets, so their sampling error is common to both and stays out)."""
        theta = np.asarray(self.theta)
        y = np.atleast_1d(np.asarray(y, dtype=float))
        z0 = _log_inverse(theta, np.log(y), self.nested)
        x0 = np.exp(z0 + self.log_x0)
        iv = self.interval(x0, level, eval_variance=eval_variance, n_runs=n_runs)
        half = iv["half_width_log"] / np.maximum(np.abs(_log_slope(theta, z0, self.nested)), 1e-300)
        return {"x": x0, "lo": x0 * np.exp(-half), "hi": x0 * np.exp(half), "half_width_log": half, "t": iv["t"],
                "dof": iv["dof"], "level": level, "shares": iv["shares"]}


def _log_slope(theta: np.ndarray, z: np.ndarray, nested: bool) -> np.ndarray:
    """d log ŷ / d log x."""
    if nested:
        return np.full_like(z, -theta[1])
    t1 = theta[0] - theta[1] * z
    return -theta[1] * np.exp(t1 - np.logaddexp(t1, theta[2]))


def _log_inverse(theta: np.ndarray, log_y: np.ndarray, nested: bool) -> np.ndarray:
    """z at which log ŷ = log_y; inf where y is at or below the floor."""
    a, alpha = theta[0], theta[1]
    if nested:
        return (a - log_y) / alpha
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.log(np.exp(log_y) - np.exp(theta[2]))
    return np.where(np.isfinite(gap), (a - gap) / alpha, np.inf)


def _log_predict(theta: np.ndarray, z: np.ndarray, nested: bool) -> np.ndarray:
    a, alpha = theta[0], theta[1]
    return a - alpha * z if nested else np.logaddexp(a - alpha * z, theta[2])


def prediction_model(theta: np.ndarray, log_x0: float, x: np.ndarray, y: np.ndarray, *, nested: bool,
                     noise: SeedNoise, eval_variance: np.ndarray | None = None) -> PredictionModel:
    """The prediction model of a law fitted (θ̂ in `fits.power_law`'s optimiser space) to (x, y);
    `eval_variance` per run is (se/y)², None where the runs carry no standard error: common to every rung
    (module docstring), so it is kept for reporting only and stays out of the covariance and φ̂."""
    theta = np.asarray(theta, dtype=float)[:2] if nested else np.asarray(theta, dtype=float)
    z = np.log(x) - log_x0
    J = log_law_jacobian(theta, z, nested)
    n, p = J.shape
    v = np.full(n, noise.variance)
    heldout = 0.0 if eval_variance is None else float(np.mean(np.asarray(eval_variance, dtype=float)))
    bread = np.linalg.pinv(J.T @ J, rcond=1e-12)
    cov_unit = bread @ (J.T * v) @ J @ bread
    r = np.log(y) - _log_predict(theta, z, nested)
    leverage = np.einsum("ij,jk,ik->i", J, bread, J)
    # Repeated runs of a rung already went into `noise` (pure error, with its dof): the residuals add only
    # their lack-of-fit part, the rung means' scatter about the law (K − p dof), or their evidence would
    # count twice.
    _, rung = np.unique(x, return_inverse=True)
    counts = np.bincount(rung)
    pure_ss = float(((r - (np.bincount(rung, weights=r) / counts)[rung]) ** 2).sum())
    pure_expected = float(((counts - 1) * np.bincount(rung, weights=v) / counts).sum())
    resid_dof = len(counts) - p
    denom = float(((1.0 - leverage) * v).sum()) - pure_expected
    residual_scale = float(((r**2).sum() - pure_ss) / denom) if resid_dof > 0 and denom > 0 else None
    prior_dof = noise.dof
    scale = 1.0 if residual_scale is None else (prior_dof + resid_dof * residual_scale) / (prior_dof + resid_dof)
    return PredictionModel(theta=theta.tolist(), log_x0=float(log_x0), nested=nested, cov_unit=cov_unit.tolist(),
                           seed_variance=float(noise.variance), scale=float(scale), residual_scale=residual_scale,
                           dof=float(prior_dof + max(resid_dof, 0)), n_points=n, n_params=p,
                           noise_source=noise.source, heldout_variance=heldout)


def describe_shares(shares: dict[str, float]) -> str:
    """'parameters 71%, seed noise 29%': the variance shares of one interval, largest first."""
    items = sorted(((float(v), k) for k, v in shares.items() if float(v) >= 0.005), reverse=True)
    return ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for v, k in items)
