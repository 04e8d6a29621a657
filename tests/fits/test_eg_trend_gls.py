"""The trend of log EG across rungs with the rungs' covariance (fits.eg_scaling.eg_trend, generalised least
squares): every rung's EG read off one baseline law shares that law's parameter error (fits.efficiency.
eg_log_covariance), and against the same rung every rung shares the law's slope (fits.eg_same_rung.
log_eg_covariance). Checked against statsmodels' GLS, against the covariance worked out by hand, and for
calibration on ladders drawn from a known law."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats

from fits.efficiency import baseline_law, correlation, eg_log_covariance, efficiency_gains
from fits.eg_same_rung import local_slope, same_rung_gains
from fits.eg_scaling import eg_by_domain, eg_trend
from fits.errors import FitInputError
from fits.noise import SEED_NOISE_LOG_SD

COMPUTE = np.geomspace(1e12, 4e13, 5)  # five rungs over 40x, as tests/fits/test_eg_scaling.py
E, A, ALPHA = 0.8, 40.0, 0.12


def law(C):
    return E + A * np.asarray(C, dtype=float) ** (-ALPHA)


def runs(rng: np.random.Generator, arms: dict, *, noise: float, seeds: int = 2) -> pd.DataFrame:
    """One row per (arm, rung, seed); `arms[name]` multiplies the compute the baseline's law is read at."""
    rows = [{"arm": name, "rung": i + 2, "seed": s, "train_flops": C,
             "bpb": float(law(k * C)) * math.exp(noise * rng.standard_normal())}
            for name, k in arms.items() for i, C in enumerate(COMPUTE) for s in range(seeds)]
    return pd.DataFrame(rows)


def intervals_of(eg: np.ndarray, sigma: np.ndarray, dof: float) -> list[list[float]]:
    t = stats.t.ppf(0.975, dof)
    return [[v * math.exp(-t * s), v * math.exp(t * s)] for v, s in zip(eg, sigma)]


@pytest.mark.parametrize("scatter", [0.3, 3.0])  # inside the rungs' intervals (Birge 1), and beyond them
def test_the_trend_with_a_covariance_is_statsmodels_gls(scatter):
    rng = np.random.default_rng(5)
    x = np.log(COMPUTE)
    sigma = np.array([0.10, 0.12, 0.09, 0.15, 0.20])
    shared = rng.normal(size=(5, 2)) * 0.08  # a law-like part every rung shares
    cov = np.diag(sigma**2) + shared @ shared.T
    sd = np.sqrt(np.diag(cov))
    eg = np.exp(0.02 + 0.03 * (x - x.mean()) + scatter * sd * rng.standard_normal(5))
    trend = eg_trend(x, eg, intervals_of(eg, sd, 12.0), interval_dofs=[12.0] * 5, correlation=correlation(cov))

    fit = sm.GLS(np.log(eg), sm.add_constant(x), sigma=cov).fit()
    birge = max(1.0, math.sqrt(fit.scale))
    assert (birge == 1.0) == (scatter < 1)
    assert trend["method"] == "gls" and trend["dof"] == 3
    assert [trend["intercept"], trend["slope"]] == pytest.approx(fit.params.tolist(), rel=1e-9)
    assert trend["birge_ratio"] == pytest.approx(birge, rel=1e-9)
    assert np.allclose(trend["cov"], birge**2 * fit.normalized_cov_params, rtol=1e-9, atol=0)
    assert trend["se"] == pytest.approx(birge * math.sqrt(fit.normalized_cov_params[1, 1]), rel=1e-9)
    # The quantile's dof: the rungs' σ, on 12 dof each, taken as one shared estimate (a law's scale): the
    # Welch-Satterthwaite bound (Σ c)² / (Σ |c_i|/√12)², c_i = w_i·(V·w)_i, where the Birge ratio is 1; else the
    # residuals' n − 2 = 3 (the smaller of the two).
    w = (fit.normalized_cov_params @ sm.add_constant(x).T @ np.linalg.inv(cov))[1]
    c = w * (cov @ w)
    nu = min(c.sum() ** 2 / (np.abs(c).sum() / math.sqrt(12.0)) ** 2, 12.0 if birge == 1.0 else 3.0)
    assert trend["quantile_dof"] == pytest.approx(nu, rel=1e-9)
    assert trend["interval"][1] - trend["slope"] == pytest.approx(stats.t.ppf(0.975, nu) * trend["se"], rel=1e-9)
    assert trend["weights"] == pytest.approx((1 / sd**2).tolist(), rel=1e-9)  # each rung's own σ, as before
    # The identity correlation is the weighted fit the trend was before, and without intervals it stays ordinary
    wls = eg_trend(x, eg, intervals_of(eg, sd, 12.0), interval_dofs=[12.0] * 5)
    same = eg_trend(x, eg, intervals_of(eg, sd, 12.0), interval_dofs=[12.0] * 5, correlation=np.eye(5))
    assert wls["method"] == "wls" and same["slope"] == pytest.approx(wls["slope"], rel=1e-12)
    assert same["se"] == pytest.approx(wls["se"], rel=1e-12)
    ols = eg_trend(x, eg, [None] * 5, correlation=correlation(cov))
    assert ols["method"] == "ols" and ols["se"] == pytest.approx(sm.OLS(np.log(eg), sm.add_constant(x)).fit().bse[1],
                                                                rel=1e-9)
    with pytest.raises(FitInputError, match="5×5"):
        eg_trend(x, eg, intervals_of(eg, sd, 12.0), correlation=np.eye(4))


def test_the_law_covariance_is_the_delta_method_on_the_inverse_of_the_law():
    """Cov(log EG_i, log EG_j) = φ·g_i'·Cov_unit(θ̂)·g_j + δ_ij·φ·σ²_seed/(n·s_i²), g_i = ∂ log x(y_i)/∂θ, here by
    finite differences of the law's inverse; its diagonal is each rung's own interval's variance."""
    df = runs(np.random.default_rng(0), {"baseline": 1.0, "arm": 1.3}, noise=0.005)
    fitted = baseline_law(df[df["arm"] == "baseline"], "train_flops", "bpb", bootstrap=0, floor="fit")
    model = fitted.prediction_model
    assert not model.nested
    arm = df[df["arm"] == "arm"].groupby("rung")
    y, n_runs = arm["bpb"].mean().to_numpy(), arm.size().to_numpy()
    cov = eg_log_covariance(fitted, y, n_runs)

    def log_x(theta):  # log ŷ = logaddexp(a − α·z, e), z = log x − log x0, solved for z
        a, alpha, e = theta
        return model.log_x0 + (a - np.log(y - math.exp(e))) / alpha

    theta = np.array(model.theta)
    grad = np.column_stack([(log_x(theta + h) - log_x(theta - h)) / (2 * 1e-6) for h in np.eye(3) * 1e-6])
    log_slope = np.array([(math.log(law_at(model, lx + 1e-6)) - math.log(law_at(model, lx - 1e-6))) / 2e-6
                          for lx in log_x(theta)])
    by_hand = model.scale * grad @ np.array(model.cov_unit) @ grad.T + np.diag(
        model.scale * model.seed_variance / n_runs / log_slope**2)
    # finite differences of step 1e-6 are good to ~1e-10 absolute: an off-diagonal entry near 0 is held to that
    assert np.allclose(cov, by_hand, rtol=1e-5, atol=1e-7 * np.abs(by_hand).max())
    iv = model.inverse_interval(y, 0.95, n_runs=n_runs)
    assert np.sqrt(np.diag(cov)) == pytest.approx((iv["half_width_log"] / iv["t"]).tolist(), rel=1e-9)
    off = correlation(cov)[np.triu_indices(5, 1)]
    assert off.max() > 0.2  # one law under every rung: their errors are far from independent


def test_a_law_without_a_prediction_model_gives_its_bootstrap_draws_covariance():
    """A law saved before it had a prediction model reads its EG intervals off its bootstrap draws
    (`fits.efficiency._eg_interval`); the rungs' covariance comes from the same draws, jointly."""
    import dataclasses

    df = runs(np.random.default_rng(3), {"baseline": 1.0, "arm": 1.3}, noise=0.005)
    fitted = baseline_law(df[df["arm"] == "baseline"], "train_flops", "bpb", bootstrap=40, floor="auto")
    saved = dataclasses.replace(fitted, extra={k: v for k, v in fitted.extra.items() if k != "prediction"})
    assert saved.prediction_model is None
    y = df[df["arm"] == "arm"].groupby("rung")["bpb"].mean().to_numpy()
    draws = np.log(saved.inverse_draws(y))
    cov = eg_log_covariance(saved, y, np.full(5, 2))
    assert np.allclose(cov, np.cov(draws[np.all(np.isfinite(draws), axis=1)], rowvar=False), rtol=1e-12, atol=0)
    assert eg_log_covariance(saved, np.append(y, 1e-3), np.full(6, 2)) is None  # below every draw's floor


def law_at(model, log_x: float) -> float:
    a, alpha, e = model.theta
    return math.exp(np.logaddexp(a - alpha * (log_x - model.log_x0), e))


def test_the_trends_of_eg_by_domain_use_the_rungs_correlation_both_ways():
    """Against the law the correlation is the law's (`efficiency_gains`); against the same rung it is the law's
    slope shared by the rungs, Δ_i·Δ_j·Cov(s_i, s_j)/(s_i²·s_j²) off the diagonal (`same_rung_gains`): near 0
    for an arm that buys nothing, and not for one that loses compute."""
    df = runs(np.random.default_rng(1), {"baseline": 1.0, "again": 1.0, "quarter": 0.5}, noise=0.005)
    eg = efficiency_gains(df, y="bpb", wall=None, bootstrap=20, floor="auto")
    by_law = eg_by_domain(df, domains=["all"], bootstrap=20, floor="auto")
    for arm in ("again", "quarter"):
        trend = by_law["arms"][arm]["all"]["trend"]
        assert trend["method"] == "gls"
        assert np.allclose(trend["correlation"], eg["eg_flops_correlation"][arm], rtol=1e-9, atol=1e-12)

    same = same_rung_gains(df, y="bpb", bootstrap=20, floor="auto")
    base = df[df["arm"] == "baseline"]
    draws = baseline_law(base, "train_flops", "bpb", bootstrap=20, floor="auto")
    slopes = np.stack([local_slope(*(draws.bootstrap_column(k) for k in ("E", "A", "alpha")), c) for c in COMPUTE])
    for arm in ("again", "quarter"):
        rows = same["arms"][arm]
        se = np.array([(math.log(r["eg_flops_interval"][1]) - math.log(r["eg_flops_interval"][0]))
                       / (2 * stats.t.ppf(0.975, r["eg_flops_interval_dof"])) for r in rows])
        s = np.array([r["local_slope"] for r in rows])
        delta = s * (np.log([r["eg_flops"] for r in rows]) - np.log(COMPUTE / COMPUTE))  # equal compute a side
        by_hand = np.outer(delta / s**2, delta / s**2) * np.cov(slopes) / np.outer(se, se)
        corr = np.array(same["eg_flops_correlation"][arm])
        off = np.triu_indices(5, 1)
        assert corr[off] == pytest.approx(by_hand[off], rel=1e-6, abs=1e-12)
        assert np.diag(corr) == pytest.approx([1.0] * 5)
    assert np.abs(np.array(same["eg_flops_correlation"]["again"])[off]).max() < 0.05
    assert np.abs(np.array(same["eg_flops_correlation"]["quarter"])[off]).max() > 0.2
    rung = eg_by_domain(df, domains=["all"], bootstrap=20, floor="auto", against="rung")
    assert rung["arms"]["quarter"]["all"]["trend"]["method"] == "gls"


def test_the_slopes_standard_error_matches_its_spread_over_ladders_drawn_from_a_known_law():
    """An arm that is the baseline again, five rungs, two seeds a side, seed noise the noise model's own (so
    each rung's interval is calibrated), 300 ladders; the nested law A·C^−α (floor "zero") keeps it fast.
    Measured on these ladders: the slope's spread is 0.046; its standard error before the Birge widening, as
    the root mean square over ladders, is 0.82 of that when the rungs are taken as independent (weighted least
    squares, the trend before it had the rungs' covariance) and 0.95 with the law's covariance (generalised
    least squares). The 95% interval (Birge ratio never below 1; Student-t on the law's residual dof where the
    rungs scatter within their intervals, on n − 2 = 3 where they scatter more: fits.eg_scaling) covers 0 in
    95.3% of the ladders taken as independent and 98.0% with the covariance (Student-t on n − 2 always, as first
    made, 99.0% and 99.3%: t(3) is wide for a standard error the rungs' intervals mostly set)."""
    rng = np.random.default_rng(7)
    found = {"wls": [], "gls": []}
    for _ in range(300):
        df = runs(rng, {"baseline": 1.0, "again": 1.0}, noise=SEED_NOISE_LOG_SD)
        fitted = baseline_law(df[df["arm"] == "baseline"], "train_flops", "bpb", bootstrap=0, floor="zero")
        model = fitted.prediction_model
        arm = df[df["arm"] == "again"].groupby("rung")
        y, n_runs, used = arm["bpb"].mean().to_numpy(), arm.size().to_numpy(), arm["train_flops"].mean().to_numpy()
        iv = model.inverse_interval(y, 0.95, n_runs=n_runs)
        args = (np.log(used), iv["x"] / used, [[lo / u, hi / u] for lo, hi, u in zip(iv["lo"], iv["hi"], used)])
        dofs = [model.dof] * len(used)
        found["wls"].append(eg_trend(*args, interval_dofs=dofs))
        found["gls"].append(eg_trend(*args, interval_dofs=dofs,
                                     correlation=correlation(eg_log_covariance(fitted, y, n_runs))))
    ratio, covered = {}, {}
    for method, trends in found.items():
        slope = np.array([t["slope"] for t in trends])
        se_unwidened = np.array([t["se"] / t["birge_ratio"] for t in trends])
        ratio[method] = math.sqrt(np.mean(se_unwidened**2)) / slope.std()
        covered[method] = np.mean([t["interval"][0] < 0 < t["interval"][1] for t in trends])
        assert all(t["method"] == method for t in trends)
    assert 0.9 < ratio["gls"] < 1.1
    assert ratio["wls"] < 0.87  # independent rungs understate it
    assert covered["gls"] >= 0.95 and covered["wls"] >= 0.95
