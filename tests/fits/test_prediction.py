"""The prediction interval of a new run (fits.prediction): its parts against independent references."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from fits.backtest import holdout_backtest
from fits.noise import SeedNoise, model_seed_noise, replicate_variance, seed_noise
from fits.power_law import fit_arrays, fit_power_law
from fits.prediction import log_law_jacobian, prediction_model

X = np.geomspace(1.77e11, 1.33e13, 6)


def test_nested_law_without_a_prior_is_the_textbook_ols_prediction_interval():
    """E = 0: log y = a − α·z is linear, so with the prior's weight at zero the interval must be the OLS
    observation interval (statsmodels, t with n − 2 dof)."""
    rng = np.random.default_rng(3)
    x = X[:5]
    log_y = np.log(40.0 * x ** -0.1) + 0.01 * rng.standard_normal(5)
    raw = fit_arrays(x, np.exp(log_y), delta=10.0, floor="zero")  # δ far above the noise: least squares
    model = prediction_model(raw.theta, raw.log_x0, x, np.exp(log_y), nested=True,
                             noise=SeedNoise(variance=1e-4, dof=1e-9, source="test"))
    iv = model.interval([X[5]], 0.9)
    ols = sm.OLS(log_y, sm.add_constant(np.log(x))).fit()
    ref = ols.get_prediction(np.array([[1.0, np.log(X[5])]])).summary_frame(alpha=0.1)
    half_ref = (ref["obs_ci_upper"].iloc[0] - ref["obs_ci_lower"].iloc[0]) / 2
    assert iv["half_width_log"][0] == pytest.approx(half_ref, rel=1e-3)  # the residuals differ by the solver's tolerance
    assert np.log(iv["predicted"][0]) == pytest.approx(ref["mean"].iloc[0], abs=1e-4)
    assert iv["dof"] == pytest.approx(3.0)


def test_jacobian_of_the_full_law_matches_finite_differences():
    theta = np.array([0.9, 0.3, 0.4])
    z = np.linspace(-2.0, 2.0, 7)

    def f(t):
        return np.logaddexp(t[0] - t[1] * z, t[2])

    numeric = np.column_stack([(f(theta + h) - f(theta - h)) / 2e-6 for h in np.eye(3) * 1e-6])
    np.testing.assert_allclose(log_law_jacobian(theta, z, nested=False), numeric, atol=1e-8)


def test_the_prior_holds_the_noise_where_the_residuals_are_too_few_to():
    """Five rungs, 3 parameters: 2 residual dof. Residuals that happen to be tiny must not shrink the
    interval to nothing: the noise model's dof keep the seed noise near its measured size."""
    x = X[:5]
    y = 0.8 + 60.0 * x ** -0.15  # exactly on the law: zero residuals
    raw = fit_arrays(x, y, delta=1e-3)
    model = prediction_model(raw.theta, raw.log_x0, x, y, nested=False, noise=model_seed_noise())
    iv = model.interval([X[5]], 0.95)
    assert model.residual_scale < 1e-6
    assert model.scale == pytest.approx(6.0 / 8.0)  # (6·1 + 2·0) / (6 + 2)
    assert iv["half_width_log"][0] > 2.0 * np.sqrt(model.scale) * 0.0087
    assert sum(v[0] for v in iv["shares"].values()) == pytest.approx(1.0)


def test_repeated_seeds_are_pooled_with_the_model_by_their_dof():
    x = np.repeat([1.0, 2.0, 4.0], 3)
    log_y = np.array([0.0, 0.02, -0.02, 1.0, 1.01, 0.99, 2.0, 2.0, 2.03])
    var, dof = replicate_variance(x, log_y)
    assert dof == 6
    assert var == pytest.approx(sum(np.var(log_y[k:k + 3], ddof=1) * 2 for k in (0, 3, 6)) / 6)
    noise = seed_noise(x, log_y)
    assert noise.dof == pytest.approx(12.0)
    assert noise.variance == pytest.approx((6 * 0.0087**2 + 6 * var) / 12)
    assert replicate_variance(np.arange(4.0), np.zeros(4)) [1] == 0


def test_the_heldout_standard_error_is_common_to_every_rung_and_reported_beside_the_interval():
    """Every rung is scored on the same held-out documents: a 3% standard error is a shift of the whole
    curve, not independent noise per run, so a ladder on a law up to small seed noise predicts its top
    rung as tightly with the se column as without it, and says how large the common error is."""
    rng = np.random.default_rng(0)
    y = np.exp(np.log(50.0 * X ** -0.11) + 0.004 * rng.standard_normal(6))
    df = pd.DataFrame({"train_flops": X, "bpb": y})
    plain = holdout_backtest(df, bootstrap=100)["predictions"][0]
    with_se = holdout_backtest(df.assign(bpb_se=0.03 * y), bootstrap=100)["predictions"][0]
    assert set(with_se["interval"]["shares"]) == {"parameters", "seed_noise"}
    assert not plain["interval"]["heldout_se_measured"] and plain["interval"]["heldout_sampling_common"] is None
    assert with_se["interval"]["heldout_se_measured"]
    assert with_se["interval"]["heldout_sampling_common"] == pytest.approx(np.expm1(1.959964 * 0.03), rel=1e-4)
    assert "shared by every rung" in with_se["interval"]["heldout_sampling_note"]
    assert with_se["half_width_rel"] <= plain["half_width_rel"] * 1.03
    assert with_se["half_width_rel"] < 0.5 * np.expm1(1.96 * 0.03)


def test_a_law_saved_to_json_predicts_the_same_interval():
    from fits.power_law import power_law_from_dict

    rng = np.random.default_rng(1)
    y = np.exp(np.log(50.0 * X ** -0.11) + 0.008 * rng.standard_normal(6))
    fit = fit_power_law(pd.DataFrame({"train_flops": X, "bpb": y}), bootstrap=100, floor="auto")
    back = power_law_from_dict(fit.to_dict(include_draws=True))
    a, b = fit.new_run_interval([1e15]), back.new_run_interval([1e15])
    assert a["lo"][0] == pytest.approx(b["lo"][0], rel=1e-12) and a["hi"][0] == pytest.approx(b["hi"][0], rel=1e-12)


def test_the_inverse_interval_is_the_prediction_interval_through_the_slope():
    rng = np.random.default_rng(2)
    y = np.exp(np.log(0.9 + 60.0 * X ** -0.2) + 0.008 * rng.standard_normal(6))
    fit = fit_power_law(pd.DataFrame({"train_flops": X, "bpb": y}), bootstrap=100, floor="auto")
    model = fit.prediction_model
    target = float(fit.predict([X[3]])[0])
    inv = model.inverse_interval([target], 0.95)
    assert inv["x"][0] == pytest.approx(X[3], rel=1e-6)
    fwd = model.interval([X[3]], 0.95)
    h = 1e-4  # |d log ŷ / d log x| by finite differences
    slope = abs(np.log(fit.predict([X[3] * np.exp(h)])[0] / fit.predict([X[3] * np.exp(-h)])[0]) / (2 * h))
    assert inv["half_width_log"][0] == pytest.approx(fwd["half_width_log"][0] / slope, rel=1e-5)


def test_the_card_shows_the_common_heldout_error_beside_an_interval_that_leaves_it_out():
    from fits.extrapolate import bpb_from_law

    rng = np.random.default_rng(3)
    y = np.exp(np.log(50.0 * X ** -0.11) + 0.006 * rng.standard_normal(6))
    df = pd.DataFrame({"train_flops": X, "bpb": y})
    plain = bpb_from_law(fit_power_law(df, bootstrap=100, floor="auto"), 1e15)
    with_se = bpb_from_law(fit_power_law(df.assign(bpb_se=0.03 * y), bootstrap=100, floor="auto"), 1e15)
    assert with_se["interval"] == pytest.approx(plain["interval"], rel=1e-9)
    assert "heldout_sampling_common" not in plain
    assert with_se["heldout_sampling_common"] == pytest.approx(np.expm1(1.959964 * 0.03), rel=1e-4)
