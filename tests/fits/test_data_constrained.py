"""Muennighoff et al.'s data-constrained law on their 182-run fit set, base fixed at the published
unrounded values."""

import numpy as np
import pandas as pd
import pytest

from fits.data_constrained import MUENNIGHOFF_BASE, fit_data_constrained, objective, predict_loss
from fits.errors import FitBoundaryError, FitInputError


def test_formula_matches_the_published_check_values():
    # datablations README: scaling_law(6.34e9, 242e9, 25e9) and scaling_law(8.67e9, 178e9, 25e9).
    assert predict_loss(6.34e9, 242e9, 25e9, 15.387756, 5.309743) == pytest.approx(2.2256440889984477, rel=1e-12)
    assert predict_loss(8.67e9, 178e9, 25e9, 15.387756, 5.309743) == pytest.approx(2.2269634075087867, rel=1e-12)


def test_reproduces_published_decay_constants(muennighoff_182):
    fit = fit_data_constrained(muennighoff_182)
    assert fit.n_points == 182
    assert fit.params["R_star_D"] == pytest.approx(15.4, rel=0.01)
    assert fit.params["R_star_N"] == pytest.approx(5.3, rel=0.01)
    assert fit.extra["r2_linear"] == pytest.approx(0.7722, abs=5e-4)
    assert fit.objective == pytest.approx(0.0158259, rel=1e-4)
    assert fit.rows_used[0] == muennighoff_182["run_name"].iloc[0]


def test_analytic_gradient_matches_finite_differences(muennighoff_182):
    df = muennighoff_182
    args = (df.N_params.to_numpy(float), df.D_tokens.to_numpy(float), df.U_unique_tokens.to_numpy(float),
            np.log(df.val_loss.to_numpy()), MUENNIGHOFF_BASE, 1e-3)
    x = np.array([12.0, 4.0])
    _, g = objective(x, *args)
    eps = 1e-6
    fd = [(objective(x + eps * e, *args)[0] - objective(x - eps * e, *args)[0]) / (2 * eps) for e in np.eye(2)]
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-10)


def test_no_repetition_means_no_decay_constant():
    df = pd.DataFrame({"N_params": [1e8, 2e8, 4e8, 8e8], "D_tokens": [1e9, 2e9, 4e9, 8e9],
                       "U_unique_tokens": [1e10] * 4, "val_loss": [3.5, 3.3, 3.1, 2.9]})
    with pytest.raises(FitBoundaryError, match="repeats"):
        fit_data_constrained(df)
    with pytest.raises(FitInputError, match="missing"):
        fit_data_constrained(df.drop(columns="U_unique_tokens"))


def test_no_run_with_excess_parameters_means_no_parameter_decay_constant(muennighoff_182):
    """The 16 published runs with N ≤ U_N: R_N is 0 in every one, the objective flat in R*_N, and the fit reported
    its start (20/3) as fitted."""
    from fits.data_constrained import unique_params

    d = muennighoff_182
    U_N = unique_params(d["N_params"].to_numpy(float), d["U_unique_tokens"].to_numpy(float), MUENNIGHOFF_BASE)
    within = d[d["N_params"].to_numpy(float) <= U_N]
    assert len(within) >= 3 and (within["D_tokens"] > within["U_unique_tokens"]).any()
    with pytest.raises(FitBoundaryError, match="R\\*_N is not identified") as err:
        fit_data_constrained(within)
    assert err.value.parameter == "R_star_N"


def test_an_optimum_past_the_bound_is_refused_at_the_bound_it_names_without_overflow(muennighoff_182):
    """Losses drawn with R*_D = 1e6 (repeated data as good as fresh): the optimum lies past the bound 1000. The
    polish stays inside the bounds, so the refusal names the bound's value, not one the simplex wandered to
    (it said R_star_D = 2.78e+08 on the 296 published runs, with overflow warnings from exp(−R/R*))."""
    import warnings

    d = muennighoff_182.copy()
    d["val_loss"] = predict_loss(d.N_params.to_numpy(float), d.D_tokens.to_numpy(float),
                                 d.U_unique_tokens.to_numpy(float), 1e6, 5.3, MUENNIGHOFF_BASE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(FitBoundaryError, match="R_star_D = 1000 ended on its upper bound 1000") as err:
            fit_data_constrained(d)
    assert err.value.parameter == "R_star_D" and err.value.value <= 1000
