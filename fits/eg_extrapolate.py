"""Each data arm's efficiency gain carried to a target's compute: the card's "data arms".

`fits.eg_scaling` fits, per arm and domain, the trend log EG = a + b·log C across the rungs (generalised
least squares on the rungs' covariance, or weighted where a trend was fitted without it; the Birge-scaled
covariance of (a, b), and the degrees of freedom of its slope's quantile, `quantile_dof`). At a target
compute C* the EG is exp(a + b·log C*), and its interval is the interval of the trend's mean there: log EG ±
t(quantile_dof)·√(g·Σ·g), g = (1, log C*), Σ the covariance of (a, b), exponentiated: the quantile of the
trend's own interval (the normal one where quantile_dof is null, every rung's σ known; t(n − 2) for a trend
saved before it had one). It is the interval of the mean EG, not of one new measurement of it: what a
recipe decision rests on. Two rungs give a trend and no interval (no degree of freedom is left); an interval
holding EG = 1 is "no measured gain", the wording of the fit (`fits.eg_scaling.eg_verdict`).

A target beyond `fits.extrapolate.FAR_EXTRAPOLATION` times the largest compute an arm was measured at
is warned about: a trend fitted over two decades of compute says little about ten more, whatever its
interval.

Everything here works on the JSON form `ladder fit arms --save` writes, so a card can be made from a
saved laws file as from a fit made in this process.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from fits.eg_scaling import eg_verdict
from fits.extrapolate import FAR_EXTRAPOLATION

NO_INTERVAL_NOTE = ("{n} rungs give a trend and no interval (no degree of freedom is left); an interval needs "
                    "three rungs")
NO_COV_NOTE = "the trend was saved without its covariance (re-fit with `ladder fit arms --save`)"


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _exp(value: float) -> float:
    return math.exp(value) if value < 700 else math.inf  # JSON writes inf as null (fits.results.jsonable)


def eg_at(cell: dict[str, Any], train_flops: float, level: float = 0.95) -> dict[str, Any]:
    """One arm's EG in one domain at `train_flops`, from its cell of a `fits.eg_scaling.eg_by_domain`
    result ({"rungs": [...], "trend": {...}, "train_flops_range": [lo, hi]}), with the interval of the
    trend's mean at `level` where the trend has one. A malformed cell raises KeyError, TypeError or
    ValueError (the laws file reader names the part)."""
    trend = cell["trend"]
    if not isinstance(trend, dict):
        raise TypeError(f"trend must be an object, got {type(trend).__name__}")
    lo_c, hi_c = (_number(v, "train_flops_range") for v in cell["train_flops_range"])
    if not 0 < lo_c <= hi_c:
        raise ValueError(f"train_flops_range must be positive and ordered, got {[lo_c, hi_c]}")
    out: dict[str, Any] = {"eg": None, "interval": None, "ci_level": level, "verdict": "no trend",
                           "trend_slope": trend.get("slope"), "trend_interval": trend.get("interval"),
                           "trend_verdict": trend.get("verdict"), "rungs": trend.get("rungs", len(cell["rungs"])),
                           "dof": trend.get("dof"), "method": trend.get("method"),
                           "extrapolation_factor": train_flops / hi_c}
    if trend.get("slope") is None:  # fewer than two rungs, or an EG of 0: no trend to carry
        out["interval_note"] = trend.get("note") or "no trend was fitted"
        return out
    slope, intercept = _number(trend["slope"], "trend.slope"), _number(trend["intercept"], "trend.intercept")
    x0 = math.log(train_flops)
    mean = intercept + slope * x0
    out["eg"] = _exp(mean)
    cov, dof = trend.get("cov"), trend.get("dof")
    if not dof:
        out.update(verdict="no interval", interval_note=NO_INTERVAL_NOTE.format(n=out["rungs"]))
        return out
    if cov is None:
        out.update(verdict="no interval", interval_note=NO_COV_NOTE)
        return out
    cov = np.asarray(cov, dtype=float)
    if cov.shape != (2, 2) or not np.all(np.isfinite(cov)):
        raise ValueError(f"trend.cov must be a finite 2×2 matrix, got shape {cov.shape}")
    if isinstance(dof, bool) or not isinstance(dof, int) or dof < 0:
        raise ValueError(f"trend.dof must be a whole number ≥ 0, got {dof!r}")
    quantile_dof = trend["quantile_dof"] if "quantile_dof" in trend else dof
    if quantile_dof is not None and (isinstance(quantile_dof, bool) or not isinstance(quantile_dof, (int, float))
                                     or not quantile_dof > 0):
        raise ValueError(f"trend.quantile_dof must be a number above 0 or null (normal), got {quantile_dof!r}")
    out["quantile_dof"] = quantile_dof
    g = np.array([1.0, x0])
    se = math.sqrt(max(float(g @ cov @ g), 0.0))
    q = 0.5 + level / 2
    half = float(stats.norm.ppf(q) if quantile_dof is None else stats.t.ppf(q, quantile_dof)) * se
    out["interval"] = [_exp(mean - half), _exp(mean + half)]
    out["log_eg_se"] = se
    out["verdict"] = eg_verdict(out["interval"])
    return out


def arms_at(sections: dict[str, dict[str, Any]], train_flops: float, level: float = 0.95) -> dict[str, Any]:
    """{baseline: {arm: {domain: eg_at(...)}}} for every arm of every saved `ladder fit arms` result
    ({baseline: {"arms": {arm: {domain: cell}}, ...}})."""
    return {baseline: {arm: {domain: eg_at(cell, train_flops, level) for domain, cell in per.items()}
                       for arm, per in section["arms"].items()}
            for baseline, section in sections.items()}


def arms_warnings(data_arms: dict[str, dict[str, Any]]) -> list[str]:
    """A warning when an arm's EG is carried beyond FAR_EXTRAPOLATION × the compute it was measured at."""
    far: dict[str, float] = {}
    for baseline, per_arm in data_arms.items():
        for arm, per_domain in per_arm.items():
            factors = [c["extrapolation_factor"] for c in per_domain.values() if c.get("eg") is not None]
            if factors and max(factors) > FAR_EXTRAPOLATION:
                far[f"{arm} vs {baseline}"] = max(factors)
    if not far:
        return []
    where = ", ".join(f"{name} ×{factor:.3g}" for name, factor in far.items())
    return [f"data arms' EG extrapolated more than {FAR_EXTRAPOLATION:g}× beyond the largest compute the arms were "
            f"measured at ({where}): the trend log EG = a + b·log C and its interval are carried far past what "
            "the rungs measured; read them as a guess"]
