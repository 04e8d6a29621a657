"""The dropout law: the best dropout as a function of model size.

Per model size, the metric is profiled over the other hyperparameters (the best run at each
dropout value) and fitted by the weighted 1-D quadratic of `fits.surfaces` in dropout itself
(linear, since 0 is a valid value) → p*(N) with its standard error. Then a sigmoid in log active
parameters,

    p*(N) = p_max / (1 + exp(−k · (log N − m)))

fitted by least squares, unweighted: each optimum's own standard error rests on one or two residual
degrees of freedom (four or five dropout values, three coefficients), so its weight 1/se² would follow
the noise in the error estimate (weights over a range of ~100 in one sweep) and the law's 95% interval
covered the true dropout* in 73–80% of simulated sweeps; unweighted, with Student's t at n − 3 degrees of
freedom, it covers ~95%. k's sign is free: the law may rise with size
(a larger model overfits repeated data more) or fall. Optima outside the sampled dropout range
are flagged and left out of the sigmoid fit, and so is a slice that sweeps no dropout (fewer than 3
values: a ladder rung run at one dropout), each with its reason in `excluded`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

from fits.errors import FitConvergenceError, FitInputError, FlatSurfaceError
from fits.results import jsonable, student_quantile
from fits.surfaces import WEIGHT_SCALE_REL, SurfaceResult, fit_surface
from fits.validate import check_group_values, check_level, numeric_column, require_columns, snap_close
from provenance import code_version

MIN_SIZES = 3
MIN_OPTIMA = 4


def sigmoid(log_n, p_max, k, m):
    return p_max / (1.0 + np.exp(-k * (log_n - m)))


@dataclass(frozen=True)
class DropoutLawResult:
    surfaces: list[SurfaceResult]
    params: dict[str, float]
    cov: np.ndarray
    excluded: list[dict[str, Any]]
    options: dict[str, Any]
    dof: float = float("inf")  # residual degrees of freedom: optima used − 3
    code_version: str = field(default_factory=code_version)

    def conf_int(self, level: float | None = None) -> dict[str, tuple[float, float]]:
        """Each sigmoid parameter's interval at `level` (default 0.95) from the fit's covariance, Student's t
        at the fit's residual degrees of freedom."""
        z = student_quantile(level, self.dof)
        se = np.sqrt(np.clip(np.diag(self.cov), 0, None))
        return {k: (float(v - z * e), float(v + z * e)) for (k, v), e in zip(self.params.items(), se)}

    def summary(self) -> str:
        p = self.params
        return (f"dropout law p*(N) = {p['p_max']:.3g} / (1 + exp(-{p['k']:.3g}·(log N - {p['m']:.3g}))) from "
                f"{sum(s.ok for s in self.surfaces)} optima, {len(self.excluded)} excluded (code {self.code_version})")

    def predict(self, params_active, n_draws: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
        mean, lo, hi = sigmoid_interval(self.params, self.cov, self.dof, params_active, level=level,
                                        n_draws=n_draws, seed=seed)
        return {"dropout": mean.tolist(), "interval": [lo.tolist(), hi.tolist()]}

    def to_dict(self) -> dict[str, Any]:
        se = np.sqrt(np.clip(np.diag(self.cov), 0, None))
        return jsonable({"form": "p*(N) = p_max / (1 + exp(-k (log N - m)))", "params": self.params,
                         "se": dict(zip(self.params, se)), "cov": self.cov, "dof": self.dof,
                         "optima": [{"params_active": s.key["params_active"], "dropout": s.optimum_natural()[s.coords[0]],
                                     "tpp": s.key.get("tpp"), "se": s.optimum_se[0], "flags": s.flags,
                                     "notes": s.notes} for s in self.surfaces],
                         "excluded": self.excluded, "options": self.options, "code_version": self.code_version})


def sigmoid_interval(params: dict[str, float], cov: Any, dof: float, params_active: Any, *, level: float = 0.95,
                     n_draws: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dropout*(N) and its interval at `level`: the sigmoid at draws of its parameters from a multivariate
    Student t (the fit's covariance, `dof` residual degrees of freedom; inf: normal), clipped to [0, 1]."""
    log_n = np.log(np.atleast_1d(np.asarray(params_active, dtype=float)))
    centre = np.array([params["p_max"], params["k"], params["m"]])
    level = check_level(level, "level")
    rng = np.random.default_rng(seed)
    draws = rng.multivariate_normal(np.zeros(3), np.asarray(cov, dtype=float), n_draws)
    if math.isfinite(dof):
        draws /= np.sqrt(rng.chisquare(dof, n_draws) / dof)[:, None]
    draws += centre
    curves = np.clip(sigmoid(log_n[None, :], draws[:, 0:1], draws[:, 1:2], draws[:, 2:3]), 0.0, 1.0)
    q = 50 * (1 - level)
    return (sigmoid(log_n, *centre), np.percentile(curves, q, axis=0), np.percentile(curves, 100 - q, axis=0))


def _key_value(value: object) -> float | str:
    """A slice's value in its key: a number as float (sizes, TPP), anything else (a tokenizer, an arm) as text."""
    return float(value) if isinstance(value, (int, float, np.number)) and not isinstance(value, bool) else str(value)


def dropout_values(df: pd.DataFrame, dropout: str = "dropout") -> np.ndarray:
    """The dropout column as float64, each value in [0, 1), values within float noise of each other snapped
    to one (0.1 and 0.1000000001 are one point of a profile)."""
    values = numeric_column(df, dropout)
    if (values < 0).any() or (values >= 1).any():
        raise FitInputError("dropout must lie in [0, 1)", column=dropout)
    return snap_close(values)


def fit_dropout_law(df: pd.DataFrame, y: str = "bpb", *, dropout: str = "dropout", size: str = "params_active",
                    weight_scale_rel: float = WEIGHT_SCALE_REL, id_column: str | None = "run_id",
                    slice_cols: tuple[str, ...] | None = None) -> DropoutLawResult:
    """One dropout optimum per slice (model size, and TPP when the table has it), then the sigmoid
    over log size through all usable optima. A slice with too few dropout values for a curve is left out
    and reported in `excluded`, as one whose optimum is flagged."""
    require_columns(df, [dropout, size, y])
    df = df.assign(**{dropout: dropout_values(df, dropout), size: numeric_column(df, size, positive=True)})
    slice_cols = tuple(c for c in (slice_cols or (size, "tpp")) if c in df.columns)
    for column in slice_cols:
        check_group_values(df, column)
    surfaces, excluded = [], []
    for key_vals, group in df.groupby(list(slice_cols), sort=True):
        key = dict(zip(slice_cols, map(_key_value, key_vals if isinstance(key_vals, tuple) else (key_vals,))))
        profile = group.loc[group.groupby(dropout)[y].idxmin()]  # best run at each dropout value
        try:
            s = fit_surface(profile, [dropout], y, log_coords=[False], weight_scale_rel=weight_scale_rel,
                            id_column=id_column, key=key)
        except FlatSurfaceError as err:  # no dropout sweep here (a ladder rung at one dropout): said, left out
            excluded.append({**key, "reason": str(err)})
            continue
        surfaces.append(s)
        if not s.ok:
            excluded.append({**key, "reason": ", ".join(s.flags)})
    good = [s for s in surfaces if s.ok]
    n_sizes = len({s.key[size] for s in good})
    if len(good) < MIN_OPTIMA or n_sizes < MIN_SIZES:
        raise FitInputError(f"the dropout sigmoid has 3 parameters and needs usable optima at ≥ {MIN_SIZES} model sizes "
                            f"(≥ {MIN_OPTIMA} optima in all); got {len(good)} usable of {len(good) + len(excluded)} "
                            f"slices at {n_sizes} sizes", column=size)
    log_n = np.log([s.key[size] for s in good])
    p_opt = np.array([s.optimum[0] for s in good])
    best = None
    for k0 in (2.0, -2.0):
        try:
            popt, pcov = curve_fit(sigmoid, log_n, p_opt, p0=[min(max(p_opt.max() * 1.2, 0.05), 0.99), k0, np.median(log_n)],
                                   bounds=([0.0, -50.0, log_n.min() - 10], [1.0, 50.0, log_n.max() + 10]),
                                   maxfev=20000)
        except RuntimeError:
            continue
        sse = float(np.sum((sigmoid(log_n, *popt) - p_opt) ** 2))
        if best is None or sse < best[2]:
            best = (popt, pcov, sse)
    if best is None or not np.all(np.isfinite(best[1])):
        raise FitConvergenceError("dropout law: the sigmoid fit did not converge (or its covariance is not finite); "
                                  "the optima may not follow a sigmoid in log size")
    popt, pcov, _ = best
    return DropoutLawResult(surfaces=surfaces, params=dict(zip(("p_max", "k", "m"), map(float, popt))), cov=pcov,
                            dof=float(len(good) - 3), excluded=excluded, options={"y": y, "dropout": dropout, "size": size,
                                                        "weight_scale_rel": weight_scale_rel})
