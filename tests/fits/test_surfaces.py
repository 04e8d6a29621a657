"""Quadratic surfaces and their optimum: closed forms, flags, bad input, StepLaw's real sweeps."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from fits.errors import FitInputError, FlatSurfaceError
from fits.surfaces import WEIGHT_SCALE_REL, fit_surface


def grid_table(f, u_center=(0.0, 0.0), span=1.0, n=5):
    u = np.linspace(-span, span, n) + u_center[0]
    v = np.linspace(-span, span, n) + u_center[1]
    U, V = np.meshgrid(u, v)
    return pd.DataFrame({"lr": np.exp(U.ravel()), "lr_wd": np.exp(V.ravel()), "loss": f(U.ravel(), V.ravel())})


def test_exact_quadratic_gives_the_analytic_optimum():
    # y = 2 + (u−0.3)² + 0.5(v+0.2)² + 0.4(u−0.3)(v+0.2): minimum at (0.3, −0.2), value 2.
    def f(u, v):
        return 2 + (u - 0.3) ** 2 + 0.5 * (v + 0.2) ** 2 + 0.4 * (u - 0.3) * (v + 0.2)
    s = fit_surface(grid_table(f), ["lr", "lr_wd"], "loss")
    np.testing.assert_allclose(s.optimum, [0.3, -0.2], atol=1e-8)
    assert s.optimum_natural()["lr"] == pytest.approx(np.exp(0.3))
    assert s.predicted_min == pytest.approx(2.0, abs=1e-10) and s.ok and s.flags == []


def test_weights_follow_the_documented_form():
    rng = np.random.default_rng(0)
    def f(u, v):
        return 1 + 0.05 * u**2 + 0.05 * v**2 + 0.02 * u**4
    df = grid_table(f, span=2.0)
    df["loss"] += rng.normal(0, 1e-3, len(df))
    s = fit_surface(df, ["lr", "lr_wd"], "loss")
    y = df["loss"].to_numpy()
    w = np.exp(-(y - y.min()) / (WEIGHT_SCALE_REL * y.min()))
    x = np.log(df[["lr", "lr_wd"]].to_numpy()) - s.center
    X = np.column_stack([np.ones(len(x)), x[:, 0], x[:, 1], x[:, 0] ** 2, x[:, 0] * x[:, 1], x[:, 1] ** 2])
    np.testing.assert_allclose(s.coef, sm.WLS(y, X, weights=w).fit().params, rtol=1e-8, atol=1e-12)
    assert s.weight_scale == pytest.approx(WEIGHT_SCALE_REL * y.min())


def test_cross_layout_fits_the_separable_quadratic_and_says_so():
    """The demo sweep's 5-point cross cannot see the u·v term; 3 points per arm give the optimum."""
    def f(u, v):
        return 2 + (u - 0.2) ** 2 + 0.5 * (v + 0.1) ** 2
    pts = [(0, 0), (-0.7, 0), (0.7, 0), (0, -1.0), (0, 1.0)]
    df = pd.DataFrame({"lr": [np.exp(u) for u, _ in pts], "lr_wd": [np.exp(v) for _, v in pts],
                       "loss": [f(u, v) for u, v in pts]})
    s = fit_surface(df, ["lr", "lr_wd"], "loss")
    np.testing.assert_allclose(s.optimum, [0.2, -0.1], atol=1e-9)
    assert s.notes == ["no_cross_term", "no_residual_dof"] and np.all(np.isnan(s.optimum_se)) and s.ok
    # with a repeat at the centre there is a residual and a standard error
    df2 = pd.concat([df, df.iloc[[0]].assign(loss=df.loss.iloc[0] + 1e-3)])
    s2 = fit_surface(df2, ["lr", "lr_wd"], "loss")
    assert s2.notes == ["no_cross_term"] and np.all(np.isfinite(s2.optimum_se))


def test_optimum_outside_the_sampled_region_is_flagged():
    def f(u, v):
        return 1 + 0.1 * (u - 3.0) ** 2 + 0.1 * v**2  # optimum at u = 3, grid spans ±1
    s = fit_surface(grid_table(f), ["lr", "lr_wd"], "loss")
    assert "optimum_outside_sampled_region" in s.flags and not s.ok


def test_saddle_is_flagged_not_positive_definite():
    def f(u, v):
        return 1 + 0.1 * u**2 - 0.1 * v**2 + 0.001 * u
    s = fit_surface(grid_table(f), ["lr", "lr_wd"], "loss")
    assert "hessian_not_positive_definite" in s.flags


def test_flat_or_thin_input_is_a_typed_error():
    flat = grid_table(lambda u, v: np.ones_like(u))
    with pytest.raises(FlatSurfaceError, match="does not vary"):
        fit_surface(flat, ["lr", "lr_wd"], "loss")
    x_layout = [(-1, -1), (0, 0), (1, 1), (-1, 1), (1, -1)]  # 5 points, not a cross: 6 coefficients unknowable
    five = pd.DataFrame({"lr": [np.exp(u) for u, _ in x_layout], "lr_wd": [np.exp(v) for _, v in x_layout],
                         "loss": [1 + u**2 + v**2 for u, v in x_layout]})
    with pytest.raises(FitInputError, match="needs at least that many points"):
        fit_surface(five, ["lr", "lr_wd"], "loss")
    line = grid_table(lambda u, v: u**2 + v**2)
    line["lr_wd"] = 1.0
    with pytest.raises(FlatSurfaceError, match="3 distinct"):
        fit_surface(line, ["lr", "lr_wd"], "loss")
    neg = grid_table(lambda u, v: u**2 + v**2)
    neg.loc[0, "lr"] = 0.0
    with pytest.raises(FitInputError, match="non-positive"):
        fit_surface(neg, ["lr", "lr_wd"], "loss")


def test_steplaw_dense_sweeps_give_the_published_signs_and_sizes(steplaw_dense):
    """Per (N, D) group: a quadratic over (log lr, log bs); then OLS of the optima.
    Published: lr* ∝ N^−0.713·D^0.307, B* ∝ D^0.571, sd 0.030, 0.019, 0.019 over the authors' 1,000
    bootstrap fits. The released file does not hold every run behind those numbers: the N and B*
    exponents land within 2 sd, the D exponent of lr* (0.237 here) does not and is held to its sign
    and rough size."""
    rows = []
    for (n, d), g in steplaw_dense.groupby(["N", "D"]):
        s = fit_surface(g, ["lr", "bs"], "smooth loss", id_column="exp_name")
        assert s.ok, (n, d, s.flags)
        opt = s.optimum_natural()
        rows.append({"log_n": np.log(n), "log_d": np.log(d), "log_lr": np.log(opt["lr"]),
                     "log_bs_tokens": np.log(opt["bs"] * 2048)})
    t = pd.DataFrame(rows)
    assert len(t) == 17
    lr = sm.OLS(t.log_lr, sm.add_constant(t[["log_n", "log_d"]])).fit().params
    bs = sm.OLS(t.log_bs_tokens, sm.add_constant(t[["log_d"]])).fit().params
    assert lr["log_n"] == pytest.approx(-0.713, abs=2 * 0.030)
    assert 0.1 < lr["log_d"] < 0.45  # published +0.307 (sd 0.019)
    assert bs["log_d"] == pytest.approx(0.571, abs=2 * 0.019)
