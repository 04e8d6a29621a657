"""The robust objective the literature settled on for scaling laws (Hoffmann et al. 2022; Besiroglu
et al. 2024): Huber loss with δ = 1e-3 on log residuals, SUMMED over points. Averaging instead
divides the gradient by n, and L-BFGS then stops on its gradient tolerance long before the
optimum; that is the early stop Epoch found in Chinchilla's Approach 3."""

from __future__ import annotations

import numpy as np

HUBER_DELTA = 1e-3


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def huber_grad(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """d huber / d r."""
    return np.clip(r, -delta, delta)


def reduce_weight(n: int, reduction: str) -> float:
    if reduction == "sum":
        return 1.0
    if reduction == "mean":
        return 1.0 / n
    raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")


def lse_terms(terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log Σ_k exp(terms[k]) over axis 0 and the softmax weights (for the gradient)."""
    top = terms.max(axis=0)
    ex = np.exp(terms - top)
    total = ex.sum(axis=0)
    return top + np.log(total), ex / total
