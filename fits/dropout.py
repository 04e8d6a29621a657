"""The dropout law: the best dropout as a function of model size.

Per model size, the metric is profiled over the other hyperparameters (the best run at each
dropout value) and fitted by the weighted 1-D quadratic of `fits.surfaces` in dropout itself
(linear, since 0 is a valid value) → p*(N) with its standard error. Then a sigmoid in log active
parameters,

    p*(N) = p_max / (1 + exp(−k · (log N − m)))

fitted by weighted least squares (weights 1/se²). k's sign is free: the law may rise with size
(a larger model overfits repeated data more) or fall. Optima outside the sampled dropout range
are flagged and left out of the sigmoid fit, and so is a slice that sweeps no dropout (fewer than 3
values: a ladder rung run at one dropout), each with its reason in `excluded`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

from fits.errors import FitConvergenceError, FitInputError, FlatSurfaceError
from fits.results import jsonable, normal_quantile
from fits.surfaces import WEIGHT_SCALE_REL, SurfaceResult, fit_surface
from fits.validate import check_group_values, check_level, numeric_column, require_columns
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
    code_version: str = field(default_factory=code_version)

    def conf_int(self, level: float | None = None) -> dict[str, tuple[float, float]]:
        """Each sigmoid parameter's interval at `level` (default 0.95) from the fit's covariance."""
        z = normal_quantile(level)
        se = np.sqrt(np.clip(np.diag(self.cov), 0, None))
        return {k: (float(v - z * e), float(v + z * e)) for (k, v), e in zip(self.params.items(), se)}

    def summary(self) -> str:
        p = self.params
        return (f"dropout law p*(N) = {p['p_max']:.3g} / (1 + exp(-{p['k']:.3g}·(log N - {p['m']:.3g}))) from "
                f"{sum(s.ok for s in self.surfaces)} optima, {len(self.excluded)} excluded (code {self.code_version})")

    def predict(self, params_active, n_draws: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
        log_n = np.log(np.atleast_1d(np.asarray(params_active, dtype=float)))
        p = self.params
        mean = sigmoid(log_n, p["p_max"], p["k"], p["m"])
        draws = np.random.default_rng(seed).multivariate_normal([p["p_max"], p["k"], p["m"]], self.cov, n_draws)
        curves = np.clip(sigmoid(log_n[None, :], draws[:, 0:1], draws[:, 1:2], draws[:, 2:3]), 0.0, 1.0)
        level = check_level(level, "level")
        q = 50 * (1 - level)
        return {"dropout": mean.tolist(), "interval": [np.percentile(curves, q, axis=0).tolist(),
                                                       np.percentile(curves, 100 - q, axis=0).tolist()]}

    def to_dict(self) -> dict[str, Any]:
        se = np.sqrt(np.clip(np.diag(self.cov), 0, None))
        return jsonable({"form": "p*(N) = p_max / (1 + exp(-k (log N - m)))", "params": self.params,
                         "se": dict(zip(self.params, se)), "cov": self.cov,
                         "optima": [{"params_active": s.key["params_active"], "dropout": s.optimum_natural()[s.coords[0]],
                                     "tpp": s.key.get("tpp"), "se": s.optimum_se[0], "flags": s.flags,
                                     "notes": s.notes} for s in self.surfaces],
                         "excluded": self.excluded, "options": self.options, "code_version": self.code_version})


def _key_value(value: object) -> float | str:
    """A slice's value in its key: a number as float (sizes, TPP), anything else (a tokenizer, an arm) as text."""
    return float(value) if isinstance(value, (int, float, np.number)) and not isinstance(value, bool) else str(value)


def fit_dropout_law(df: pd.DataFrame, y: str = "bpb", *, dropout: str = "dropout", size: str = "params_active",
                    weight_scale_rel: float = WEIGHT_SCALE_REL, id_column: str | None = "run_id",
                    slice_cols: tuple[str, ...] | None = None) -> DropoutLawResult:
    """One dropout optimum per slice (model size, and TPP when the table has it), then the sigmoid
    over log size through all usable optima. A slice with too few dropout values for a curve is left out
    and reported in `excluded`, as one whose optimum is flagged."""
    require_columns(df, [dropout, size, y])
    df = df.assign(**{dropout: numeric_column(df, dropout), size: numeric_column(df, size, positive=True)})
    if (df[dropout] < 0).any() or (df[dropout] >= 1).any():
        raise FitInputError("dropout must lie in [0, 1)", column=dropout)
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
    se = np.array([s.optimum_se[0] for s in good])
    sigma = np.maximum(np.where(np.isfinite(se), se, np.nanmax(np.append(se, 0.02))), 1e-4)
    best = None
    for k0 in (2.0, -2.0):
        try:
            popt, pcov = curve_fit(sigmoid, log_n, p_opt, p0=[min(max(p_opt.max() * 1.2, 0.05), 0.99), k0, np.median(log_n)],
                                   sigma=sigma, bounds=([0.0, -50.0, log_n.min() - 10], [1.0, 50.0, log_n.max() + 10]),
                                   maxfev=20000)
        except RuntimeError:
            continue
        sse = float(np.sum(((sigmoid(log_n, *popt) - p_opt) / sigma) ** 2))
        if best is None or sse < best[2]:
            best = (popt, pcov, sse)
    if best is None or not np.all(np.isfinite(best[1])):
        raise FitConvergenceError("dropout law: the sigmoid fit did not converge (or its covariance is not finite); "
                                  "the optima may not follow a sigmoid in log size")
    popt, pcov, _ = best
    return DropoutLawResult(surfaces=surfaces, params=dict(zip(("p_max", "k", "m"), map(float, popt))), cov=pcov,
                            excluded=excluded, options={"y": y, "dropout": dropout, "size": size,
                                                        "weight_scale_rel": weight_scale_rel})
