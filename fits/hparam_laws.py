"""From sweeps to hyperparameter laws (the report's method).

1. Per slice (model size, TPP): a weighted quadratic surface of the metric over the diagonal
   coordinates (log LR, log LR·WD) → the optimum (LR*, LR*·WD*) with its standard error
   (`fits.surfaces`). Slices whose surface is not a bowl, or whose optimum is outside the sampled
   region, are reported and left out of the laws.
2. Regress the optima on log steps, log TPP and log size with statsmodels OLS, over candidate
   forms, choosing by AIC (or BIC). The report's forms are always among the candidates and
   always reported, for comparison with its numbers:
       LR*·WD* = coef · steps^steps_exponent        (report: 17.04 · steps^−1)
       log LR* = intercept + b·log TPP + c·log steps (report: −1.51 + 0.175·log TPP − 0.573·log steps)
   A regressor that does not vary across slices (TPP held constant, say) is not identifiable:
   its coefficient is reported as null and the forms that need it are skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm

from fits.errors import FitError, FitInputError, FlatSurfaceError
from fits.results import jsonable
from fits.surfaces import WEIGHT_SCALE_REL, SurfaceResult, fit_surface
from fits.validate import check_level, n_distinct, numeric_column, require_columns, row_name, snap_close
from provenance import code_version

log = logging.getLogger(__name__)

REQUIRED = ("lr", "wd", "steps", "tpp", "params_active")
LR_WD_CANDIDATES = [("log_steps",), ("log_steps", "log_tpp"), ("log_steps", "log_params"), ("log_tpp",),
                    ("log_params",)]
LOG_LR_CANDIDATES = [("log_tpp", "log_steps"), ("log_steps",), ("log_tpp",), ("log_params",),
                     ("log_steps", "log_params"), ("log_tpp", "log_params"), ("log_tpp", "log_steps", "log_params")]
MAX_CONDITION = 30.0
# What the laws regress each slice's optimum on: a slice must hold one value of each.
SLICE_REGRESSORS = ("params_active", "tpp")
REPORT_FORMS = {"log_lr_wd": ("log_steps",), "log_lr": ("log_tpp", "log_steps")}


@dataclass(frozen=True)
class RegressionLaw:
    target: str
    terms: tuple[str, ...]
    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    aic: float
    bic: float
    r2: float
    n: int
    model: Any = field(repr=False)  # statsmodels results; None for an exactly determined law
    code_version: str = field(default_factory=code_version)

    @property
    def exact(self) -> bool:
        return self.model is None

    def conf_int(self, level: float | None = None) -> dict[str, tuple[float, float]]:
        """Each coefficient's interval at `level` (default 0.95, `ci` holds that one); NaN for an
        exactly determined law."""
        # at 0 the interval has no width; at 1 or beyond statsmodels gives NaN
        level = check_level(0.95 if level is None else level, "level")
        if self.exact:
            return {k: (float("nan"), float("nan")) for k in self.params}
        ci = self.model.conf_int(1.0 - level)
        return {k: (float(ci.loc[k, 0]), float(ci.loc[k, 1])) for k in self.params}

    def summary(self) -> str:
        terms = " + ".join([f"{self.params['const']:.4g}"] + [f"{self.params[t]:.4g}·{t}" for t in self.terms])
        return f"{self.target} = {terms}  (n {self.n}, R² {self.r2:.3f}{', exact' if self.exact else ''})"

    def predict(self, values: dict[str, float], alpha: float = 0.05) -> tuple[float, float, float]:
        """Mean prediction and its (1−alpha) observation interval, in the target's (log) units
        (NaN bounds for an exactly determined law: there is no residual to size them)."""
        if self.exact:
            mean = self.params["const"] + sum(self.params[t] * values[t] for t in self.terms)
            return float(mean), float("nan"), float("nan")
        row = pd.DataFrame([{"const": 1.0, **{t: values[t] for t in self.terms}}])[["const", *self.terms]]
        frame = self.model.get_prediction(row).summary_frame(alpha=alpha)
        return float(frame["mean"].iloc[0]), float(frame["obs_ci_lower"].iloc[0]), float(frame["obs_ci_upper"].iloc[0])

    def to_dict(self) -> dict[str, Any]:
        return jsonable({"target": self.target, "terms": list(self.terms), "params": self.params,
                         "ci95": {k: list(v) for k, v in self.ci.items()}, "aic": self.aic, "bic": self.bic,
                         "r2": self.r2, "n": self.n, "exactly_determined": self.exact,
                         "cov": np.asarray(self.model.cov_params()).tolist() if self.model is not None else None,
                         "scale": float(self.model.scale) if self.model is not None else None,
                         "df_resid": float(self.model.df_resid) if self.model is not None else 0.0,
                         "code_version": self.code_version})


def _positive(name: str, value: object) -> float:
    """A value that enters a law under a logarithm: a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value) \
            or value <= 0:
        raise FitInputError(f"{name} must be a finite number > 0 (the laws take its logarithm), got {value!r}")
    return float(value)


def fit_regression(table: pd.DataFrame, target: str, terms: tuple[str, ...], *,
                   allow_exact: bool = False) -> RegressionLaw | None:
    """OLS of `target` on `terms` + constant; None when not identifiable (constant regressor,
    rank deficiency, or no residual degree of freedom unless `allow_exact`)."""
    X = sm.add_constant(table[list(terms)], has_constant="add")
    if len(table) < X.shape[1] or (len(table) == X.shape[1] and not allow_exact):
        return None
    if np.linalg.matrix_rank(X.to_numpy()) < X.shape[1]:
        return None
    if any(np.ptp(table[t].to_numpy()) <= 1e-12 for t in terms):
        return None
    # Near-collinear regressors (steps is nearly a function of TPP and size once the batch rule is
    # fixed) give coefficients that cancel and explode off the sampled line: not identifiable.
    Z = table[list(terms)].to_numpy()
    Z = (Z - Z.mean(axis=0)) / Z.std(axis=0)
    if len(terms) > 1 and np.linalg.cond(Z) > MAX_CONDITION:
        return None
    if len(table) == X.shape[1]:  # exactly determined: coefficients, no intervals, no AIC
        beta = np.linalg.solve(X.to_numpy(), table[target].to_numpy())
        nan = float("nan")
        return RegressionLaw(target=target, terms=terms, params=dict(zip(X.columns, map(float, beta))),
                             ci={k: (nan, nan) for k in X.columns}, aic=nan, bic=nan, r2=1.0, n=len(table), model=None)
    model = sm.OLS(table[target], X).fit()
    ci = model.conf_int(0.05)
    return RegressionLaw(target=target, terms=terms, params={k: float(v) for k, v in model.params.items()},
                         ci={k: (float(ci.loc[k, 0]), float(ci.loc[k, 1])) for k in model.params.index},
                         aic=float(model.aic), bic=float(model.bic), r2=float(model.rsquared), n=len(table), model=model)


def select_law(table: pd.DataFrame, target: str, candidates: list[tuple[str, ...]], criterion: str) -> tuple[RegressionLaw, list[RegressionLaw]]:
    fitted = [law for terms in candidates if (law := fit_regression(table, target, terms)) is not None]
    if not fitted:  # too few slices for any residual: exactly determined one-regressor laws, flagged as such
        fitted = [law for terms in candidates if len(terms) == 1
                  and (law := fit_regression(table, target, terms, allow_exact=True)) is not None][:1]
        if fitted:
            log.warning("%s: only %d slice optima; the law is exactly determined (no interval)", target, len(table))
    if not fitted:
        raise FitInputError(f"no candidate law for {target} is identifiable from {len(table)} slice optima; add "
                            "slices (model sizes, TPPs) so the regressors vary", column=target)
    best = min(fitted, key=lambda law: getattr(law, criterion) if not law.exact else np.inf)
    return best, fitted


@dataclass(frozen=True)
class HparamLawsResult:
    slices: list[SurfaceResult]
    excluded: list[dict[str, Any]]
    lr_wd: RegressionLaw | None  # None for a dropout-only sweep
    log_lr: RegressionLaw | None
    lr_wd_candidates: list[RegressionLaw]
    log_lr_candidates: list[RegressionLaw]
    report_lr_wd: RegressionLaw | None
    report_log_lr: RegressionLaw | None
    options: dict[str, Any]
    dropout: Any = None  # fits.dropout.DropoutLawResult when the sweep varied dropout
    code_version: str = field(default_factory=code_version)

    def conf_int(self, level: float | None = None) -> dict[str, dict[str, tuple[float, float]]]:
        """The selected laws' coefficient intervals (and the dropout law's) at `level`."""
        out = {name: law.conf_int(level) for name, law in (("lr_wd_product", self.lr_wd), ("log_lr", self.log_lr))
               if law is not None}
        return out | ({"dropout": self.dropout.conf_int(level)} if self.dropout is not None else {})

    def summary(self) -> str:
        lines = [f"hyperparameter laws from {len(self.slices)} slices, {len(self.excluded)} excluded "
                 f"(code {self.code_version})"]
        lines += [law.summary() for law in (self.lr_wd, self.log_lr) if law is not None]
        return "\n".join(lines + ([self.dropout.summary()] if self.dropout is not None else []))

    def predict(self, steps: float, tpp: float, params_active: float) -> dict[str, Any]:
        """LR*, WD* (and the product) from the selected laws, with 95% observation intervals."""
        if self.log_lr is None or self.lr_wd is None:
            raise FitInputError("this sweep did not vary LR/WD, so there are no LR*/WD* laws to predict with")
        v = {"log_steps": np.log(_positive("steps", steps)), "log_tpp": np.log(_positive("tpp", tpp)),
             "log_params": np.log(_positive("params_active", params_active))}
        lr, lr_lo, lr_hi = self.log_lr.predict(v)
        prod, p_lo, p_hi = self.lr_wd.predict(v)
        return {"lr": float(np.exp(lr)), "lr_interval": [float(np.exp(lr_lo)), float(np.exp(lr_hi))],
                "lr_wd_product": float(np.exp(prod)), "lr_wd_product_interval": [float(np.exp(p_lo)), float(np.exp(p_hi))],
                "wd": float(np.exp(prod - lr)), "laws": {"lr": list(self.log_lr.terms), "lr_wd": list(self.lr_wd.terms)}}

    def to_dict(self) -> dict[str, Any]:
        rep_p, rep_l = self.report_lr_wd, self.report_log_lr
        return jsonable({
            "lr_wd_product": {
                "coef": float(np.exp(rep_p.params["const"])) if rep_p else None,
                "steps_exponent": rep_p.params["log_steps"] if rep_p else None,
                "ci95": {"log_coef": list(rep_p.ci["const"]), "steps_exponent": list(rep_p.ci["log_steps"])} if rep_p else None,
                "r2": rep_p.r2 if rep_p else None,
            },
            "log_lr": {
                "intercept": rep_l.params["const"] if rep_l else None,
                "log_tpp": rep_l.params.get("log_tpp") if rep_l else None,
                "log_steps": rep_l.params.get("log_steps") if rep_l else None,
                "ci95": {k: list(v) for k, v in rep_l.ci.items()} if rep_l else None,
                "r2": rep_l.r2 if rep_l else None,
            },
            "selected": {"lr_wd_product": self.lr_wd.to_dict(), "log_lr": self.log_lr.to_dict()} if self.log_lr else None,
            "candidates": {"lr_wd_product": [c.to_dict() for c in self.lr_wd_candidates],
                           "log_lr": [c.to_dict() for c in self.log_lr_candidates]},
            "slices": [s.to_dict() for s in self.slices],
            "excluded_slices": self.excluded,
            "dropout": self.dropout.to_dict() if self.dropout is not None else None,
            "options": self.options,
            "code_version": self.code_version,
        })


def slice_optima(df: pd.DataFrame, y: str, slice_cols: tuple[str, ...], *, weight_scale_rel: float,
                 id_column: str | None) -> tuple[list[SurfaceResult], list[dict[str, Any]]]:
    surfaces, excluded = [], []
    for key_vals, group in df.groupby(list(slice_cols), sort=True):
        values = key_vals if isinstance(key_vals, tuple) else (key_vals,)  # mixed types stay as they are
        key = {c: v.item() if isinstance(v, np.generic) else v for c, v in zip(slice_cols, values)}
        for c in SLICE_REGRESSORS:  # one value per slice (`check_slices`), named whatever the slicing
            key.setdefault(c, float(group[c].iloc[0]))
        key["steps"] = float(group["steps"].median())
        try:
            s = fit_surface(group, ["lr", "lr_wd"], y, weight_scale_rel=weight_scale_rel, id_column=id_column, key=key)
        except FlatSurfaceError as err:
            excluded.append({**key, "reason": str(err)})
            continue
        surfaces.append(s)
        if not s.ok:
            excluded.append({**key, "reason": ", ".join(s.flags)})
    return surfaces, excluded


def slice_columns(slice_cols: object) -> tuple[str, ...]:
    """`slice_cols` as a tuple of column names; a plain string is one column (not its letters)."""
    cols = (slice_cols,) if isinstance(slice_cols, str) else slice_cols
    if not isinstance(cols, (tuple, list)) or not cols or not all(isinstance(c, str) for c in cols) \
            or len(set(cols)) != len(cols):
        raise FitInputError(f"slice_cols must name one or more distinct columns (default {SLICE_REGRESSORS}), "
                            f"got {slice_cols!r}")
    return tuple(cols)


def check_slices(df: pd.DataFrame, slice_cols: tuple[str, ...]) -> None:
    """Each slice must hold one model size and one TPP: the laws regress its optimum on them, and a
    surface over runs of several sizes or TPPs would blur their optima into one."""
    for c in slice_cols:
        missing = df[c].isna().to_numpy()
        if missing.any():
            first = row_name(df, int(np.argmax(missing)))
            raise FitInputError(f"has {int(missing.sum())} missing value(s) (first at {first}); every run needs its "
                                "slice", column=c)
    if df.empty:
        return
    counts = df.groupby(list(slice_cols), sort=True)[list(SLICE_REGRESSORS)].nunique()
    for c in SLICE_REGRESSORS:
        if counts[c].max() > 1:
            key = counts[c].idxmax()
            key = key if isinstance(key, tuple) else (key,)
            where = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in zip(slice_cols, key))
            in_slice = np.logical_and.reduce([(df[k] == v).to_numpy() for k, v in zip(slice_cols, key)])
            values = sorted(df.loc[in_slice, c].unique())
            raise FitInputError(f"slice_cols {list(slice_cols)} leaves slices holding several {c!r} values "
                                f"({', '.join(f'{v:g}' for v in values[:5])} at {where}); each slice needs one model "
                                f"size and one TPP, so add {c!r} to slice_cols", column=c)


def finite_or_diverged(df: pd.DataFrame, column: str) -> np.ndarray:
    """The metric as float64: a diverged run's empty, NaN or infinite cell is NaN/inf (left out and counted),
    a cell that is text and no number (a typo, `1.0O2`) is refused naming its row, not taken for a diverged run."""
    raw = df[column]
    metric = pd.to_numeric(raw, errors="coerce")
    text = raw.astype(str).str.strip().str.lower()
    unparsed = (metric.isna() & raw.notna() & ~text.isin(["", "nan", "none", "null"])).to_numpy()
    if unparsed.any():
        first = int(np.argmax(unparsed))
        raise FitInputError(f"has {int(unparsed.sum())} value(s) that are not numbers ({raw.iloc[first]!r} at "
                            f"{row_name(df, first)}); a diverged run's value is empty, NaN or inf", column=column)
    return metric.to_numpy(dtype=np.float64)


def rows_at_lr_wd_dropout(df: pd.DataFrame, y: str, slice_cols: tuple[str, ...],
                          dropout_column: str) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Each slice's runs at one dropout value: the one with the most distinct (LR, WD) points, the best
    loss among equals. A grid run at dropout 0 beside a dropout sweep at the grid's centre keeps the grid
    (the best dropout alone would leave the centre's one run, and no surface); a grid crossed with every
    dropout keeps the best dropout's grid. Returns the rows and, per slice, the dropout used."""
    keep = np.zeros(len(df), dtype=bool)
    used = []
    for key_vals, positions in df.groupby(list(slice_cols), sort=True).indices.items():
        group = df.iloc[positions]
        p_values = group[dropout_column].to_numpy(dtype=float)
        points = {p: len(set(zip(group["lr"][p_values == p], group["wd"][p_values == p]))) for p in set(p_values)}
        best_loss = {p: float(group[y][p_values == p].min()) for p in points}
        chosen = min(points, key=lambda p: (-points[p], best_loss[p], p))
        keep[positions[p_values == chosen]] = True
        key = key_vals if isinstance(key_vals, tuple) else (key_vals,)
        used.append({**dict(zip(slice_cols, key)), dropout_column: float(chosen), "lr_wd_points": points[chosen]})
    return df[keep], used


def fit_hparam_laws(df: pd.DataFrame, y: str = "bpb", *, criterion: str = "aic",
                    slice_cols: tuple[str, ...] | str = SLICE_REGRESSORS, weight_scale_rel: float = WEIGHT_SCALE_REL,
                    id_column: str | None = "run_id", dropout_column: str = "dropout") -> HparamLawsResult:
    """Surfaces per slice → optima → laws. Rows whose metric is not finite (diverged runs) are
    dropped and counted; everything else must be clean. `slice_cols` (a column or several) may be any
    slicing whose every slice holds one `params_active` and one `tpp` (the laws' regressors): by
    default both, or `params_active` alone for a sweep at one TPP; more columns split further."""
    if criterion not in ("aic", "bic"):
        raise FitInputError(f"criterion must be 'aic' or 'bic', got {criterion!r}")
    slice_cols = slice_columns(slice_cols)
    require_columns(df, [*REQUIRED, y, *slice_cols])
    df = df.copy()
    metric = finite_or_diverged(df, y)
    diverged = int((~np.isfinite(metric)).sum())
    df = df[np.isfinite(metric)]
    if df.empty:
        raise FitInputError(f"no run has a finite value (all {diverged} are empty, NaN or infinite)", column=y)
    for c in REQUIRED:
        df[c] = numeric_column(df, c, positive=True)
    for c in dict.fromkeys((*slice_cols, *SLICE_REGRESSORS, "lr", "wd")):  # float noise in the last bits: one value
        values = pd.to_numeric(df[c], errors="coerce")
        if values.notna().all():  # a non-numeric slice column (a name, say) groups as it is
            df[c] = snap_close(values.to_numpy(dtype=float))
    check_slices(df, slice_cols)
    df["lr_wd"] = snap_close((df["lr"] * df["wd"]).to_numpy())
    has_dropout = dropout_column in df.columns and n_distinct(pd.to_numeric(df[dropout_column], errors="coerce")) > 1
    dropout_law = None
    options = {"y": y, "criterion": criterion, "slice_cols": list(slice_cols), "weight_scale_rel": weight_scale_rel,
               "diverged_rows_dropped": diverged, "n_rows": len(df)}
    if has_dropout:
        from fits.dropout import dropout_values, fit_dropout_law

        df[dropout_column] = dropout_values(df, dropout_column)  # bad values refused, not a missing law
        try:
            dropout_law = fit_dropout_law(df, y=y, dropout=dropout_column, id_column=id_column, slice_cols=slice_cols)
        except FitError as err:  # no dropout law (too few sizes sweep it): the LR/WD laws are still fitted
            options["dropout_error"] = str(err)
        # the LR/WD surfaces use one dropout per slice, so dropout does not blur them
        df, options["lr_wd_dropout"] = rows_at_lr_wd_dropout(df, y, slice_cols, dropout_column)
    if df.groupby(list(slice_cols))["lr"].nunique().max() < 3:
        if dropout_law is not None:  # a dropout sweep: the dropout law alone, LR/WD laws left empty
            return HparamLawsResult(slices=[], excluded=[], lr_wd=None, log_lr=None, lr_wd_candidates=[],
                                    log_lr_candidates=[], report_lr_wd=None, report_log_lr=None,
                                    options={**options, "lr_wd_swept": False}, dropout=dropout_law)
        because = f"; and no dropout law: {options['dropout_error']}" if "dropout_error" in options else ""
        raise FitInputError("no slice sweeps the learning rate (a surface needs ≥ 3 distinct LR values per "
                            f"{'/'.join(slice_cols)} slice){because}", column="lr")
    surfaces, excluded = slice_optima(df, y, slice_cols, weight_scale_rel=weight_scale_rel, id_column=id_column)
    good = [s for s in surfaces if s.ok]
    if not good:
        raise FitInputError(f"no slice gave a usable LR/WD optimum ({len(excluded)} excluded: "
                            f"{[e['reason'] for e in excluded][:3]})", column=y)
    table = pd.DataFrame({
        "log_lr": [s.optimum[0] for s in good], "log_lr_wd": [s.optimum[1] for s in good],
        "log_steps": [np.log(s.key["steps"]) for s in good], "log_tpp": [np.log(s.key["tpp"]) for s in good],
        "log_params": [np.log(s.key["params_active"]) for s in good],
    })
    lr_wd, lr_wd_all = select_law(table, "log_lr_wd", LR_WD_CANDIDATES, criterion)
    log_lr, log_lr_all = select_law(table, "log_lr", LOG_LR_CANDIDATES, criterion)
    report_lr_wd = next((c for c in lr_wd_all if c.terms == REPORT_FORMS["log_lr_wd"]), None)
    report_log_lr = next((c for c in log_lr_all if c.terms == REPORT_FORMS["log_lr"]), None)
    if report_log_lr is None:  # TPP constant: the report's form reduces to its steps term
        report_log_lr = next((c for c in log_lr_all if c.terms == ("log_steps",)), None)
    return HparamLawsResult(
        slices=surfaces, excluded=excluded, lr_wd=lr_wd, log_lr=log_lr, lr_wd_candidates=lr_wd_all,
        log_lr_candidates=log_lr_all, report_lr_wd=report_lr_wd, report_log_lr=report_log_lr,
        options={**options, "lr_wd_swept": True}, dropout=dropout_law,
    )
