"""Backtests of a compute law: would the ladder have predicted its own top rung?

- held-out-rung backtest: fit without the top `holdout_top` rungs (distinct x values), predict
  them, report the relative error and whether the measured value falls inside the interval;
- progressive backtest: add rungs one at a time (Porian et al.'s `predict_and_estimate_cost`
  loop), predicting the next rung from those below it, so the error can be watched shrinking.

The interval is a prediction interval for a new run (or the mean of the held-out rung's runs): the law's
parameter uncertainty and the run's seed noise, Student-t with the residual dof plus the noise model's
(`fits.prediction`; each source's share is in `interval.shares`). The held-out set's sampling error is
shared by every rung (all are scored on the same documents), so it cancels in a prediction from the
rungs below and is left out; its size is reported as `heldout_sampling_common` (± at the interval's level).
Resampling the fit's own residuals, as it once did, kept 2 residual dof of 5 rungs and understated the
noise: on a corpus the ladder was never tuned on two of five domains fell outside. It follows the one interval rule of the
fit below the top (`FitResult.interval_note`): where that fit has no interval (its rungs are too few
for a bootstrap to mean anything, `fits.bootstrap.MIN_DISTINCT_FOR_INTERVAL`, say), each prediction
says `interval_available: false` with the reason, and `lo`, `hi` and `inside` are null.

A backtest tests predictions, so rungs that show no loss floor still predict: the fit below the top
uses floor "auto" by default (E at zero where no floor shows: the nested law A·x^(−α),
`fits.floors`), and the result says so in `floor_at_zero`; floor "zero" may be asked
for. A main fit with the default floor "fit" keeps refusing such an E as a value to report.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fits.bootstrap import MIN_DISTINCT_FOR_INTERVAL
from fits.errors import FitError, FitInputError
from fits.power_law import MIN_DISTINCT_X, PowerLawResult, fit_power_law
from fits.prediction import HELDOUT_COMMON_NOTE
from fits.validate import check_bootstrap, check_level, numeric_column, require_columns


def prediction_interval(fit: PowerLawResult, x: np.ndarray, ci_level: float, *, eval_variance=0.0,
                        n_runs=1) -> dict[str, Any]:
    """The interval of a new run (the mean of `n_runs`) at x: parameter uncertainty and seed noise, t-based;
    the held-out set's common sampling error is reported beside it (`fits.prediction`)."""
    return fit.new_run_interval(x, ci_level, eval_variance=eval_variance, n_runs=n_runs)


def backtest_floor(floor: str) -> str:
    """The floor rule a backtest fits the rungs below the top with, given the main fit's: "zero" stays
    "zero" (E = 0 by assumption), otherwise "auto" (a backtest tests the prediction, not E)."""
    return "zero" if floor == "zero" else "auto"


def _heldout_noise(test: pd.DataFrame, x: str, y: str, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Per held-out x: how many runs its measured value averages, and their mean (se/y)² where the
    table has the standard-error column `<y>_se` (0 otherwise): reported, not in the interval."""
    n_runs = test.groupby(x)[y].size().reindex(xs).to_numpy(dtype=float)
    se_col = f"{y}_se"
    if se_col not in test.columns or not np.all(np.isfinite(pd.to_numeric(test[se_col], errors="coerce"))):
        return np.zeros_like(xs), n_runs, False
    rel = (pd.to_numeric(test[se_col]) / test[y]) ** 2
    return rel.groupby(test[x]).mean().reindex(xs).to_numpy(dtype=float), n_runs, True


def _predict_rows(fit: PowerLawResult, test: pd.DataFrame, x: str, y: str, ci_level: float) -> list[dict[str, Any]]:
    actual = test.groupby(x)[y].mean()
    xs = actual.index.to_numpy(dtype=float)
    pred = fit.predict(xs)
    note = fit.interval_note  # the one interval rule: no interval, no lo/hi to misread as one
    if note is None and fit.prediction_model is None:
        note = "the law carries no prediction model"
    if note is not None:
        return [{"x": float(xv), "actual": float(a), "predicted": float(p), "lo": None, "hi": None,
                 "rel_error": float((p - a) / a), "inside": None, "interval_available": False, "interval_reason": note}
                for xv, a, p in zip(xs, actual.to_numpy(), pred)]
    eval_var, n_runs, measured = _heldout_noise(test, x, y, xs)
    iv = prediction_interval(fit, xs, ci_level, eval_variance=eval_var, n_runs=n_runs)
    model = fit.prediction_model
    rows = []
    for k, (xv, a, p) in enumerate(zip(xs, actual.to_numpy(), pred)):
        low, high = float(iv["lo"][k]), float(iv["hi"][k])
        rows.append({"x": float(xv), "actual": float(a), "predicted": float(p), "lo": low, "hi": high,
                     "rel_error": float((p - a) / a), "inside": bool(low <= a <= high), "interval_available": True,
                     "half_width_rel": float(np.expm1(iv["half_width_log"][k])), "n_runs": int(n_runs[k]),
                     "interval": {"method": "delta method + noise model, Student-t", "dof": iv["dof"], "t": iv["t"],
                                  "shares": {s: float(v[k]) for s, v in iv["shares"].items()},
                                  "sd_log": {s: float(v[k]) for s, v in iv["sd_log"].items()},
                                  "heldout_se_measured": measured,
                                  "heldout_sampling_common": float(iv["heldout_sampling_common"][k]) if measured else None,
                                  "heldout_sampling_note": HELDOUT_COMMON_NOTE, "noise_scale": model.scale,
                                  "residual_scale": model.residual_scale, "noise_source": model.noise_source}})
    return rows


def _all_inside(rows: list[dict[str, Any]]) -> bool | None:
    """Every held-out rung inside its interval; None where any has no interval to be inside of."""
    return None if any(r["inside"] is None for r in rows) else all(r["inside"] for r in rows)


def _checked(df: pd.DataFrame, x: str, y: str, bootstrap: int, ci_level: float) -> tuple[pd.DataFrame, np.ndarray]:
    """The table with x and y as checked floats (every row: a held-out rung's runs are averaged and counted
    too, so a missing, non-positive or text BPB there is refused as in the fitted rows), and x."""
    check_bootstrap(bootstrap)
    check_level(ci_level)
    require_columns(df, [x, y])
    xs = numeric_column(df, x, positive=True)
    return df.assign(**{x: xs, y: numeric_column(df, y, positive=True)}), xs


def holdout_backtest(df: pd.DataFrame, x: str = "train_flops", y: str = "bpb", *, holdout_top: int = 1,
                     bootstrap: int = 400, ci_level: float = 0.95, seed: int = 0, floor: str = "auto",
                     **fit_kwargs) -> dict[str, Any]:
    """Fit without the `holdout_top` largest x values and predict them."""
    df, xs = _checked(df, x, y, bootstrap, ci_level)
    levels = np.unique(xs)
    if holdout_top < 1:
        raise FitInputError(f"holdout_top must be ≥ 1, got {holdout_top}", column=x)
    if len(levels) - holdout_top < MIN_DISTINCT_X:
        left, most = len(levels) - holdout_top, len(levels) - MIN_DISTINCT_X
        raise FitInputError(f"cannot hold out {holdout_top} rung(s) of {len(levels)} (distinct values): "
                            + (f"that leaves {left} distinct values and " if left >= 0 else "")
                            + f"the power law needs {MIN_DISTINCT_X} below the held-out ones to fit, so "
                            + (f"at most {most} can be held out" if most > 0 else "none can be held out"), column=x)
    cut = levels[-holdout_top]
    train, test = df[xs < cut], df[xs >= cut]
    fit = fit_power_law(train, x, y, bootstrap=bootstrap, ci_level=ci_level, seed=seed, floor=floor, **fit_kwargs)
    rows = _predict_rows(fit, test, x, y, ci_level)
    return {"kind": "holdout", "holdout_top": holdout_top, "n_train": len(train), "ci_level": ci_level,
            "params_without_holdout": fit.params, "floor_at_zero": fit.extra["floor_at_zero"],
            "delta": fit.options["delta"], "predictions": rows,
            "max_abs_rel_error": max(abs(r["rel_error"]) for r in rows), "all_inside": _all_inside(rows)}


def progressive_backtest(df: pd.DataFrame, x: str = "train_flops", y: str = "bpb", *, bootstrap: int = 200,
                         ci_level: float = 0.95, seed: int = 0, floor: str = "auto", **fit_kwargs) -> dict[str, Any]:
    """For k = 3 … n−1 rungs: fit the k smallest, predict rung k+1."""
    df, xs = _checked(df, x, y, bootstrap, ci_level)
    levels = np.unique(xs)
    if len(levels) <= MIN_DISTINCT_X:
        raise FitInputError(f"a progressive backtest needs more than {MIN_DISTINCT_X} distinct values, got "
                            f"{len(levels)}", column=x)
    steps = []
    for k in range(MIN_DISTINCT_X, len(levels)):
        # Below MIN_DISTINCT_FOR_INTERVAL rungs a step has no interval (the one rule) and a row bootstrap on 3
        # rungs cannot run (most resamples lose a rung): fitted without one, so the step keeps its prediction.
        boot = bootstrap if k >= MIN_DISTINCT_FOR_INTERVAL else 0
        try:
            fit = fit_power_law(df[xs < levels[k]], x, y, bootstrap=boot, ci_level=ci_level, seed=seed,
                                floor=floor, **fit_kwargs)
        except FitError as err:  # a few low rungs often cannot pin the floor: report the step, go on
            steps.append({"n_rungs_fitted": k, "x": float(levels[k]), "error": str(err)})
            continue
        row = _predict_rows(fit, df[xs == levels[k]], x, y, ci_level)[0]
        if boot != bootstrap:  # the reason is its rungs, not a bootstrap the caller did not turn off
            row["interval_reason"] = (f"{k} distinct x: below {MIN_DISTINCT_FOR_INTERVAL} a law has no interval (the "
                                      "one interval rule), so this step is fitted without a bootstrap")
        steps.append({"n_rungs_fitted": k, **row, "alpha": fit.params["alpha"], "floor_at_zero": fit.extra["floor_at_zero"]})
    return {"kind": "progressive", "ci_level": ci_level, "steps": steps}
