"""Held-out backtest of L(N, D): fit without the `holdout_top` largest model sizes, predict their
runs. The interval is a prediction interval for a new run: bootstrap draws of the law fitted below
plus a resampled log residual of that fit (observation noise), as `fits.backtest` does for BPB(C)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from fits.chinchilla import MIN_POINTS, fit_chinchilla
from fits.errors import FitInputError
from fits.validate import check_bootstrap, check_level, numeric_column, require_columns


MIN_HOLDOUT_DRAWS = 50


def chinchilla_holdout(df: pd.DataFrame, n: str = "params", d: str = "tokens", y: str = "loss", *, holdout_top: int = 1,
                       bootstrap: int = 200, ci_level: float = 0.95, seed: int = 0, **fit_kwargs) -> dict[str, Any]:
    check_bootstrap(bootstrap)
    if bootstrap < MIN_HOLDOUT_DRAWS:  # 0 ran 50 unasked (and 10 ran 50): the interval is the draws' percentiles
        raise FitInputError(f"a held-out backtest's intervals are its bootstrap draws' percentiles: bootstrap must be "
                            f"≥ {MIN_HOLDOUT_DRAWS}, got {bootstrap}")
    check_level(ci_level)
    require_columns(df, [n, d, y])
    N = numeric_column(df, n, positive=True)
    # every row checked, the held-out sizes' too (their loss is compared, not fitted)
    df = df.assign(**{n: N, d: numeric_column(df, d, positive=True), y: numeric_column(df, y, positive=True)})
    sizes = np.unique(N)
    if holdout_top < 1:
        raise FitInputError(f"holdout_top must be ≥ 1, got {holdout_top}", column=n)
    if len(sizes) - holdout_top < 2:
        left, most = len(sizes) - holdout_top, len(sizes) - 2
        raise FitInputError(f"cannot hold out {holdout_top} model size(s) of {len(sizes)}: "
                            + (f"that leaves {left} and " if left >= 0 else "")
                            + "the exponent on N needs at least 2 below the held-out ones, so "
                            + (f"at most {most} can be held out" if most > 0 else "none can be held out"), column=n)
    cut = sizes[-holdout_top]
    train, test = df[N < cut], df[N >= cut]
    if len(train) < MIN_POINTS:
        raise FitInputError(f"holding out {holdout_top} model size(s) leaves {len(train)} runs; the law needs "
                            f"{MIN_POINTS}", column=n)
    fit = fit_chinchilla(train, n=n, d=d, y=y, bootstrap=bootstrap, ci_level=ci_level, seed=seed,
                         id_column=None, **fit_kwargs)
    Nt, Dt = test[n].to_numpy(float), test[d].to_numpy(float)
    actual = test[y].to_numpy(float)
    pred = fit.predict(Nt, Dt)
    E, A, B, alpha, beta = (fit.bootstrap_params[:, k][:, None] for k in range(5))
    draws = E + A / Nt[None, :] ** alpha + B / Dt[None, :] ** beta
    rng = np.random.default_rng(seed)
    draws = draws * np.exp(rng.choice(np.asarray(fit.residuals), size=draws.shape))
    q = 50.0 * (1.0 - ci_level)
    lo, hi = np.percentile(draws, q, axis=0), np.percentile(draws, 100 - q, axis=0)
    rows = [{"N": float(nv), "D": float(dv), "actual": float(a), "predicted": float(p), "lo": float(lv), "hi": float(hv),
             "rel_error": float((p - a) / a), "inside": bool(lv <= a <= hv)}
            for nv, dv, a, p, lv, hv in zip(Nt, Dt, actual, pred, lo, hi)]
    rows.sort(key=lambda r: (r["N"], r["D"]))
    return {"kind": "holdout", "holdout_top": holdout_top, "n_train": len(train), "ci_level": ci_level,
            "params_without_holdout": fit.params, "predictions": rows,
            "max_abs_rel_error": max(abs(r["rel_error"]) for r in rows), "all_inside": all(r["inside"] for r in rows),
            "share_inside": float(np.mean([r["inside"] for r in rows]))}
