"""The robust objective the literature settled on for scaling laws (Hoffmann et al. 2022; Besiroglu
et al. 2024): Huber loss with δ = 1e-3 on log residuals, SUMMED over points. Averaging instead
divides the gradient by n, and L-BFGS then stops on its gradient tolerance long before the
optimum; that is the early stop Epoch found in Chinchilla's Approach 3."""

from __future__ import annotations

import numpy as np

HUBER_DELTA = 1e-3
# Huber's tuning constant for 95% efficiency at the normal: δ = 1.345·σ (Huber 1981, §4.6).
HUBER_EFFICIENCY_CONSTANT = 1.345


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def huber_grad(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """d huber / d r: r clipped to [−δ, δ] (as np.clip, NaN kept, without its wrappers' cost per call)."""
    return np.minimum(np.maximum(r, -delta), delta)


def reduce_weight(n: int, reduction: str) -> float:
    if reduction == "sum":
        return 1.0
    if reduction == "mean":
        return 1.0 / n
    raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")


def replicate_log_scale(x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Pooled within-x standard deviation of log y (σ̂ of replicate noise) and its degrees of freedom:
    Σ over x values of Σ (log y − mean log y at that x)² / (n − number of distinct x)."""
    log_y = np.log(np.asarray(y, dtype=float))
    _, group = np.unique(np.asarray(x, dtype=float), return_inverse=True)
    counts = np.bincount(group)
    means = np.bincount(group, weights=log_y) / counts
    dof = int(len(log_y) - len(counts))
    if dof <= 0:
        return float("nan"), 0
    return float(np.sqrt(((log_y - means[group]) ** 2).sum() / dof)), dof


def delta_from_replicates(x: np.ndarray, y: np.ndarray) -> tuple[float, str]:
    """δ = 1.345·σ̂ with σ̂ the replicate noise of log y: the Huber objective is least squares for
    points within the seed noise and robust beyond it. With δ = 1e-3 and seed noise of ~1%, every
    point sits in Huber's linear arm and the fit becomes a median fit (with three seeds per rung,
    the middle seed). Returns (δ, the rule as text for the result's provenance)."""
    from fits.errors import FitInputError

    scale, dof = replicate_log_scale(x, y)
    if dof == 0 or not scale > 0:
        raise FitInputError("delta 'auto' needs repeated runs (seeds) at some compute value to measure the noise; "
                            "every compute value has a single run (or identical values)")
    return HUBER_EFFICIENCY_CONSTANT * scale, (f"auto: {HUBER_EFFICIENCY_CONSTANT} × pooled within-x sd of log y "
                                               f"({scale:.4g}, {dof} dof)")
