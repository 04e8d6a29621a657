"""Quadratic surfaces of held-out loss over hyperparameter coordinates, and their optimum.

For one slice of a sweep (one model size and TPP), the loss is fitted by weighted least squares
as a full quadratic in the coordinates (2-D: log LR and log LR·WD, the diagonal coordinates in
which good runs line up; 1-D: dropout):

    y ≈ c + gᵀx + ½ xᵀHx,        optimum x* = −H⁻¹g   (a minimum only if H is positive definite)

Weights decay with a point's distance in loss from the slice's best:

    w_i = exp(−(y_i − y_min) / (WEIGHT_SCALE_REL · |y_min|)),   WEIGHT_SCALE_REL = 0.01

so a run 1% worse than the best counts e⁻¹ as much and one 5% worse e⁻⁵. The loss is only
quadratic near its minimum; without the weights, far-off (and diverging) runs dominate the fit
and drag the optimum. The scale is relative to the loss, so a best loss of 0 (or one so near 0
that the weights leave too few runs to determine the quadratic) is refused, not fitted.
The optimum's uncertainty is the delta method on the WLS coefficient covariance, its interval Student's
t at the fit's residual degrees of freedom. A surface whose Hessian is not positive definite, or whose optimum lies outside the
sampled region (the convex hull of the sampled points), is flagged, never silently used.
A cross-shaped design (points only along the two axes) cannot see the u·v term: the separable
quadratic is fitted instead and noted (`no_cross_term`); a slice with exactly as many points as
coefficients gets its optimum but no standard error (`no_residual_dof`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy.spatial import Delaunay

from fits.errors import FitInputError, FlatSurfaceError
from fits.results import jsonable, student_quantile
from fits.validate import n_distinct, numeric_column, require_columns
from provenance import code_version

WEIGHT_SCALE_REL = 0.01


def design(x: np.ndarray) -> np.ndarray:
    """Columns [1, x_j, x_j·x_k (j ≤ k)]; the quadratic terms enter as ½H, see `hessian`."""
    n, d = x.shape
    cols = [np.ones(n)] + [x[:, j] for j in range(d)]
    cols += [x[:, j] * x[:, k] for j in range(d) for k in range(j, d)]
    return np.column_stack(cols)


def gradient_hessian(coef: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    g = coef[1:1 + d]
    H = np.zeros((d, d))
    i = 1 + d
    for j in range(d):
        for k in range(j, d):
            if j == k:
                H[j, j] = 2.0 * coef[i]
            else:
                H[j, k] = H[k, j] = coef[i]
            i += 1
    return g, H


def optimum_of(coef: np.ndarray, d: int) -> np.ndarray:
    g, H = gradient_hessian(coef, d)
    return -np.linalg.solve(H, g)


@dataclass(frozen=True)
class SurfaceResult:
    coords: list[str]
    log_coords: list[bool]
    center: np.ndarray  # coordinates are centred before fitting (conditioning); the optimum is not
    coef: np.ndarray
    cov: np.ndarray
    optimum: np.ndarray  # in fitted coordinates (log where log_coords)
    optimum_se: np.ndarray
    predicted_min: float
    positive_definite: bool
    inside_sampled: bool
    n_points: int
    best_observed: dict[str, float]
    rows_used: list[Any]
    weight_scale: float
    key: dict[str, Any] = field(default_factory=dict)
    samples: np.ndarray | None = field(default=None, repr=False)  # (n, d+1): fit-space coords, then y
    notes: list[str] = field(default_factory=list)  # fit-form caveats: no_cross_term, no_residual_dof
    resid_dof: float = float("nan")  # the WLS fit's residual degrees of freedom (points - coefficients)
    code_version: str = field(default_factory=code_version)

    @property
    def ok(self) -> bool:
        return self.positive_definite and self.inside_sampled

    @property
    def flags(self) -> list[str]:
        out = []
        if not self.positive_definite:
            out.append("hessian_not_positive_definite")
        if not self.inside_sampled:
            out.append("optimum_outside_sampled_region")
        return out

    def optimum_natural(self) -> dict[str, float]:
        """The optimum in natural units; inf where a flagged optimum lies too far out for exp (a loss flat
        along a coordinate puts it thousands of log units away)."""
        with np.errstate(over="ignore"):
            return {c: float(np.exp(v) if lg else v) for c, v, lg in zip(self.coords, self.optimum, self.log_coords)}

    def predict(self, points: Any) -> np.ndarray:
        """The fitted loss at `points` in natural units (not logged): an (n, d) array, one point of d
        values, or, on a 1-D surface, a flat list of n points."""
        d = len(self.coords)
        try:
            p = np.asarray(points, dtype=float)
        except (TypeError, ValueError):
            raise FitInputError(f"points must be numbers, got {points!r}") from None
        if p.ndim <= 1:
            p = p.reshape(-1, 1) if d == 1 else p.reshape(1, -1)
        if p.ndim != 2 or p.shape[1] != d:
            raise FitInputError(f"points must be an (n, {d}) array of {', '.join(self.coords)} values"
                                f"{' (or a flat list on this 1-D surface)' if d == 1 else ''}; got shape {p.shape}")
        if not np.all(np.isfinite(p)):
            raise FitInputError("points must be finite numbers")
        for j, (c, lg) in enumerate(zip(self.coords, self.log_coords)):
            if lg and (p[:, j] <= 0).any():
                raise FitInputError(f"{c} is fitted on a log scale, so each point's {c} must be > 0; got "
                                    f"{p[:, j].min():g}")
        x = _to_fit_space(p, self.log_coords) - self.center
        return design(x) @ self.coef

    def conf_int(self, level: float | None = None) -> dict[str, tuple[float, float]]:
        """The optimum's interval per coordinate at `level` (default 0.95), in fitted coordinates (log
        where log_coords): the delta-method standard error times Student's t at the fit's residual degrees
        of freedom (a 3×3 grid has 3: ±1.96·SE covered 87% there, ±t·SE 95%); NaN without residuals."""
        z = student_quantile(level, self.resid_dof)
        return {c: (float(v - z * se), float(v + z * se)) for c, v, se in zip(self.coords, self.optimum, self.optimum_se)}

    def summary(self) -> str:
        optimum = ", ".join(f"{c}* = {v:.4g}" for c, v in self.optimum_natural().items())
        return (f"surface of {len(self.coords)} coordinate(s) over {self.n_points} points {self.key or ''}: {optimum}; "
                f"{', '.join(self.flags + self.notes) or 'ok'} (code {self.code_version})")

    def to_dict(self) -> dict[str, Any]:
        return jsonable({
            **self.key, "coords": self.coords, "log_coords": self.log_coords, "optimum": self.optimum_natural(),
            "optimum_fit_space": self.optimum, "optimum_se_fit_space": self.optimum_se,
            "predicted_min": self.predicted_min, "flags": self.flags, "notes": self.notes, "n_points": self.n_points,
            "best_observed": self.best_observed, "weight_scale": self.weight_scale, "rows_used": self.rows_used,
            "code_version": self.code_version,
        })


def _to_fit_space(points: np.ndarray, log_coords: list[bool]) -> np.ndarray:
    out = np.array(points, dtype=float)
    for j, lg in enumerate(log_coords):
        if lg:
            out[:, j] = np.log(out[:, j])
    return out


def fit_surface(df: pd.DataFrame, coords: list[str], y: str, *, log_coords: list[bool] | None = None,
                weight_scale_rel: float = WEIGHT_SCALE_REL, id_column: str | None = "run_id",
                key: dict[str, Any] | None = None) -> SurfaceResult:
    """Weighted quadratic fit of `y` over `coords` (1 or 2 of them) and its analytic optimum.
    `weight_scale_rel` (> 0) scales the weights by the best loss (module docstring), so a loss whose
    best is 0 cannot be weighted and is refused."""
    if isinstance(weight_scale_rel, bool) or not isinstance(weight_scale_rel, (int, float, np.number)) \
            or not np.isfinite(weight_scale_rel) or weight_scale_rel <= 0:
        raise FitInputError(f"weight_scale_rel must be a finite number > 0 (the default {WEIGHT_SCALE_REL} weighs a "
                            f"run 1% worse than the best by e^-1), got {weight_scale_rel!r}")
    coords = [coords] if isinstance(coords, str) else list(coords)  # one column, not its letters
    log_coords = [True] * len(coords) if log_coords is None else list(log_coords)
    d = len(coords)
    if d not in (1, 2) or len(log_coords) != d:
        raise FitInputError(f"a surface takes 1 or 2 coordinates, got {coords}")
    require_columns(df, [*coords, y])
    raw = np.column_stack([numeric_column(df, c, positive=lg) for c, lg in zip(coords, log_coords)])
    loss = numeric_column(df, y)
    n_params = 1 + d + d * (d + 1) // 2
    where = f" (slice {key})" if key else ""
    for j, c in enumerate(coords):
        if n_distinct(raw[:, j]) < 3:
            raise FlatSurfaceError(f"needs at least 3 distinct values to see curvature, got "
                                   f"{n_distinct(raw[:, j])}{where}", column=c)
    y_min = float(loss.min())
    if np.ptp(loss) <= 1e-12 * max(abs(y_min), 1.0):
        raise FlatSurfaceError(f"the loss does not vary across the slice (all {y_min:g}){where}; there is no optimum "
                               "to locate", column=y)
    x = _to_fit_space(raw, log_coords)
    center = x[np.argmin(loss)]
    X = design(x - center)
    notes = []
    keep = np.arange(n_params)
    if d == 2 and _is_cross(x):
        # A cross (axis-aligned) layout cannot see the u·v term: fit the separable quadratic and say so.
        keep = np.array([0, 1, 2, 3, 5])
        notes.append("no_cross_term")
    if len(loss) < len(keep):
        raise FitInputError(f"a {d}-D quadratic surface has {len(keep)} coefficients and needs at least that many "
                            f"points; got {len(loss)}{where}", column=y)
    if np.linalg.matrix_rank(X[:, keep]) < len(keep):
        raise FlatSurfaceError(f"the sampled points do not determine a quadratic (rank-deficient design){where}",
                               column=",".join(coords))
    # The weights measure "near the best" relative to the loss itself (1% of it): a best loss of 0
    # (a difference from the best, say) has no such scale, and weighting by anything else would be a
    # different fit from the documented one.
    if y_min == 0:
        raise FitInputError(f"the best loss is 0{where}, and the weights are relative to it (scale = "
                            "weight_scale_rel · |best loss|); fit the loss itself, not one shifted so that its best "
                            "is 0", column=y)
    scale = weight_scale_rel * abs(y_min)
    w = np.exp(-(loss - y_min) / scale)
    coef, cov = np.zeros(n_params), np.zeros((n_params, n_params))
    if len(loss) == len(keep):  # exactly determined: an optimum, but no residual to measure its uncertainty
        coef[keep] = np.linalg.solve(X[:, keep], loss)
        cov[np.ix_(keep, keep)] = np.nan
        notes.append("no_residual_dof")
    else:
        # weights that vanish on all but a few runs (a best loss near 0 makes the scale tiny) leave
        # the weighted design singular: statsmodels would fail or return a meaningless optimum
        if np.linalg.matrix_rank(np.sqrt(w)[:, None] * X[:, keep]) < len(keep):
            raise FlatSurfaceError(f"the loss weights (scale {scale:.3g} = weight_scale_rel {weight_scale_rel:g} · "
                                   f"|best loss| {abs(y_min):.3g}) leave too few runs weighted to determine the "
                                   f"quadratic{where}; raise weight_scale_rel, or fit a loss whose best is not near 0",
                                   column=y)
        model = sm.WLS(loss, X[:, keep], weights=w).fit()
        coef[keep], cov[np.ix_(keep, keep)] = np.asarray(model.params), np.asarray(model.cov_params())
    g, H = gradient_hessian(coef, d)
    pd_ok = bool(np.all(np.linalg.eigvalsh(H) > 0))
    opt_c = optimum_of(coef, d) if abs(np.linalg.det(H)) > 1e-300 else np.full(d, np.nan)
    se = _optimum_se(coef, cov, d) if np.all(np.isfinite(opt_c)) and "no_residual_dof" not in notes \
        else np.full(d, np.nan)
    optimum = opt_c + center
    inside = _inside(x, optimum)
    best = int(np.argmin(loss))
    return SurfaceResult(
        coords=list(coords), log_coords=log_coords, center=center, coef=coef, cov=cov, optimum=optimum,
        optimum_se=se, predicted_min=float(design(opt_c[None, :])[0] @ coef) if np.all(np.isfinite(opt_c)) else float("nan"),
        positive_definite=pd_ok, inside_sampled=inside, n_points=len(loss),
        best_observed={**{c: float(raw[best, j]) for j, c in enumerate(coords)}, y: float(loss[best])},
        rows_used=df[id_column].tolist() if id_column and id_column in df.columns else df.index.tolist(),
        weight_scale=scale, key=dict(key or {}), samples=np.column_stack([x, loss]), notes=notes,
        resid_dof=float(len(loss) - len(keep)),
    )


def _optimum_se(coef: np.ndarray, cov: np.ndarray, d: int) -> np.ndarray:
    """The delta method: a numerical Jacobian of the optimum with respect to the coefficients. NaN where
    a step of the Jacobian makes the Hessian singular (a loss with next to no curvature: the surface is
    flagged all the same), not numpy's LinAlgError."""
    J = np.zeros((d, len(coef)))
    try:
        for i in range(len(coef)):
            h = 1e-6 * max(abs(coef[i]), 1e-3)
            up, dn = coef.copy(), coef.copy()
            up[i] += h
            dn[i] -= h
            J[:, i] = (optimum_of(up, d) - optimum_of(dn, d)) / (2 * h)
    except np.linalg.LinAlgError:
        return np.full(d, np.nan)
    with np.errstate(invalid="ignore"):
        return np.sqrt(np.clip(np.diag(J @ np.nan_to_num(cov, nan=0.0) @ J.T), 0, None))


def _is_cross(x: np.ndarray) -> bool:
    """Every point on one of two axis lines through a common centre (the sweeps' `cross` layout)."""
    def mode(col: np.ndarray) -> float:
        values, counts = np.unique(np.round(col, 9), return_counts=True)
        return float(values[np.argmax(counts)])

    u0, v0 = mode(x[:, 0]), mode(x[:, 1])
    on_axis = np.isclose(x[:, 0], u0, atol=1e-9) | np.isclose(x[:, 1], v0, atol=1e-9)
    return bool(on_axis.all())


def _inside(x: np.ndarray, point: np.ndarray) -> bool:
    if not np.all(np.isfinite(point)):
        return False
    if x.shape[1] == 1:
        return bool(x[:, 0].min() <= point[0] <= x[:, 0].max())
    try:
        return bool(Delaunay(np.unique(x, axis=0)).find_simplex(point[None, :])[0] >= 0)
    except Exception:  # collinear points: no hull, fall back to the bounding box
        return bool(np.all((x.min(axis=0) <= point) & (point <= x.max(axis=0))))
