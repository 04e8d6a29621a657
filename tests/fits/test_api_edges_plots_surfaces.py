"""Edges of the surface, hyperparameter-law and figure APIs: bad input is refused with FitInputError in
one line, and every result the fits return by design (a 1-D surface, a dropout-only sweep, an arm below
the baseline's floor, a law without runs) is drawn rather than crashing the figure."""

import numpy as np
import pandas as pd
import pytest
from matplotlib.contour import ContourSet

from fits.efficiency import efficiency_gains
from fits.errors import FitInputError, FlatSurfaceError
from fits.hparam_laws import fit_hparam_laws
from fits.plots import plot_efficiency, plot_hparams, plot_power_laws, plot_surface
from fits.power_law import fit_power_law
from fits.surfaces import fit_surface
from tests.fits.hparam_synth import sweep

PNG = b"\x89PNG\r\n\x1a\n"


def bowl(shift: float = 0.0) -> pd.DataFrame:
    """A 5×5 grid around LR 3e-3, LR·WD 3e-4 whose best loss is 1 − shift."""
    rows = [{"lr": np.exp(np.log(3e-3) + du), "lr_wd": np.exp(np.log(3e-4) + dv),
             "bpb": 1 - shift + 0.02 * du**2 + 0.015 * dv**2 + 0.01 * du * dv}
            for du in np.linspace(-1, 1, 5) for dv in np.linspace(-1, 1, 5)]
    return pd.DataFrame(rows)


def dropout_profile() -> pd.DataFrame:
    return pd.DataFrame({"dropout": [0.0, 0.05, 0.1, 0.15, 0.2, 0.3],
                         "bpb": [1.05, 1.02, 1.01, 1.012, 1.02, 1.05]})


@pytest.fixture(scope="module")
def one_tpp_sweep() -> pd.DataFrame:
    return sweep(seed=3, sizes=(1e7, 1e8, 1e9, 1e10), tpps=(20.0,))


@pytest.fixture(scope="module")
def one_tpp_fit(one_tpp_sweep):
    return fit_hparam_laws(one_tpp_sweep)


# ---------------------------------------------------------------- 1: slice_cols


def test_hparam_laws_slice_by_size_alone_when_each_slice_has_one_tpp(one_tpp_sweep, one_tpp_fit):
    for slice_cols in (("params_active",), "params_active", ["params_active"]):
        fit = fit_hparam_laws(one_tpp_sweep, slice_cols=slice_cols)
        assert fit.options["slice_cols"] == ["params_active"]
        assert [s.key["tpp"] for s in fit.slices] == [20.0] * 4
        np.testing.assert_allclose([s.optimum for s in fit.slices], [s.optimum for s in one_tpp_fit.slices])
        assert fit.lr_wd.params == pytest.approx(one_tpp_fit.lr_wd.params)
    # a further, non-numeric slice column splits each slice and keeps its name in the slice's key
    two = pd.concat([one_tpp_sweep.assign(opt="adamw"), one_tpp_sweep.assign(opt="muon", bpb=one_tpp_sweep.bpb + 0.01)])
    fit = fit_hparam_laws(two, slice_cols=("params_active", "opt"))
    assert sorted({s.key["opt"] for s in fit.slices}) == ["adamw", "muon"] and len(fit.slices) == 8
    with pytest.raises(FitInputError, match="missing value"):
        fit_hparam_laws(two.assign(opt=two.opt.where(np.arange(len(two)) != 3)), slice_cols=("params_active", "opt"))


def test_hparam_laws_refuse_slices_that_mix_tpps_or_sizes_naming_what_is_needed():
    df = sweep(seed=5, sizes=(1e7, 1e8), tpps=(5.0, 20.0))
    with pytest.raises(FitInputError, match="several 'tpp' values.*add 'tpp' to slice_cols"):
        fit_hparam_laws(df, slice_cols=("params_active",))
    with pytest.raises(FitInputError, match="several 'params_active' values"):
        fit_hparam_laws(df, slice_cols="tpp")  # a plain string is one column, not its letters
    with pytest.raises(FitInputError, match="missing column"):
        fit_hparam_laws(df, slice_cols=("params_active", "batch"))
    with pytest.raises(FitInputError, match="slice_cols"):
        fit_hparam_laws(df, slice_cols=())


# ---------------------------------------------------------------- 2: surface weights


@pytest.mark.parametrize("scale", [0.0, -0.01, float("nan"), float("inf")])
def test_surface_refuses_a_weight_scale_that_is_not_a_positive_number(scale):
    with pytest.raises(FitInputError, match="weight_scale_rel must be a finite number > 0"):
        fit_surface(bowl(), ["lr", "lr_wd"], "bpb", weight_scale_rel=scale)


def test_surface_refuses_a_best_loss_of_zero_or_weights_that_collapse_on_one_run():
    with pytest.raises(FitInputError, match="best loss is 0"):
        fit_surface(bowl(shift=1.0), ["lr", "lr_wd"], "bpb")
    # a best loss of 1e-6: weights relative to it leave the best run alone (it was a LinAlgError)
    with pytest.raises(FlatSurfaceError, match="too few runs"):
        fit_surface(bowl(shift=1.0 - 1e-6), ["lr", "lr_wd"], "bpb")
    # a negative loss is weighted by its magnitude, as before
    s = fit_surface(bowl(shift=1.2), ["lr", "lr_wd"], "bpb")
    assert s.optimum_natural() == pytest.approx({"lr": 3e-3, "lr_wd": 3e-4}, rel=1e-6)


# ---------------------------------------------------------------- 3: 1-D surfaces


def test_one_dimensional_surface_predicts_a_flat_list_of_points_and_plots_a_curve(tmp_path):
    s = fit_surface(dropout_profile(), ["dropout"], "bpb", log_coords=[False])
    flat = s.predict([0.1, 0.2])
    np.testing.assert_allclose(flat, s.predict([[0.1], [0.2]]))
    assert flat.shape == (2,) and s.predict(0.1).shape == (1,)
    with pytest.raises(FitInputError, match=r"\(n, 1\)"):
        s.predict([[0.1, 0.2]])
    fig = plot_surface(s, path=tmp_path / "s1.png")
    assert (tmp_path / "s1.png").read_bytes()[:8] == PNG
    curve = [line for line in fig.axes[0].get_lines() if len(line.get_xdata()) > 10]
    assert len(curve) == 1 and np.all(np.isfinite(curve[0].get_ydata()))
    assert fig.axes[0].get_xlabel() == "dropout"
    by_name = fit_surface(dropout_profile(), "dropout", "bpb", log_coords=[False])  # one column named as a string
    assert by_name.coords == ["dropout"] and by_name.optimum_natural() == s.optimum_natural()


def test_two_dimensional_surface_predict_refuses_points_of_the_wrong_width_or_sign():
    s = fit_surface(bowl(), ["lr", "lr_wd"], "bpb")
    assert s.predict([3e-3, 3e-4]) == pytest.approx([1.0])  # one point, as before
    with pytest.raises(FitInputError, match=r"\(n, 2\)"):
        s.predict([3e-3, 3e-4, 1e-3])
    with pytest.raises(FitInputError, match="> 0"):
        s.predict([[0.0, 3e-4]])


# ---------------------------------------------------------------- 4: mixed log coordinates


def test_mixed_log_surface_plot_maps_each_coordinate_by_its_own_flag(tmp_path):
    rng = np.random.default_rng(0)
    mix = pd.DataFrame([{"lr": np.exp(np.log(3e-3) + du), "dropout": p,
                         "bpb": 1 + 0.02 * du**2 + 0.5 * (p - 0.1) ** 2 + rng.normal(0, 1e-4)}
                        for du in np.linspace(-1, 1, 5) for p in np.linspace(0, 0.3, 5)])
    s = fit_surface(mix, ["lr", "dropout"], "bpb", log_coords=[True, False])
    fig = plot_surface(s, path=tmp_path / "mixed.png")
    assert (tmp_path / "mixed.png").exists()
    ax = fig.axes[0]
    contours = [c for c in ax.collections if isinstance(c, ContourSet)]
    assert contours and sum(len(seg) for seg in contours[0].allsegs) > 0  # it drew nothing before
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("log lr", "dropout")


# ---------------------------------------------------------------- 5: efficiency below the floor


def test_efficiency_plot_marks_rungs_below_the_baselines_floor_at_the_top(tmp_path):
    x = np.array([1e15, 1e16, 1e17, 1e18, 1e19, 3e19])
    base = pd.DataFrame({"arm": "b", "rung": range(6), "train_flops": x, "wall_seconds": x / 1e12,
                         "bpb": 1.5 + 2e3 * x**-0.25})
    eg = efficiency_gains(pd.concat([base, base.assign(arm="c", bpb=base.bpb * 0.9)]), arm="arm", baseline="b",
                          bootstrap=20)
    assert any(r["eg_flops"] is None for r in eg["arms"]["c"])
    fig = plot_efficiency(eg, tmp_path / "eg.png")
    assert (tmp_path / "eg.png").read_bytes()[:8] == PNG
    lines = fig.axes[0].get_lines()
    marks = [line for line in lines if line.get_marker() == "^"]
    assert marks and all("below the baseline's floor" in m.get_label() for m in marks)
    measured = [line for line in lines if line.get_marker() == "o"]
    assert measured and all(np.all(np.isfinite(np.asarray(m.get_ydata(), float))) for m in measured)


# ---------------------------------------------------------------- 6: dropout-only hparam figure


def test_plot_hparams_draws_the_dropout_law_of_a_dropout_only_sweep(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for n in (1e7, 3e7, 1e8, 3e8, 1e9):
        p_star = 0.3 / (1 + np.exp(-1.5 * (np.log(n) - np.log(1e8))))
        for p in np.linspace(0, 0.4, 6):
            rows.append({"run_id": f"r{len(rows)}", "lr": 1e-3, "wd": 0.1, "steps": 1000, "tpp": 20.0,
                         "params_active": n, "dropout": p, "bpb": 1 + 0.5 * (p - p_star) ** 2 + rng.normal(0, 1e-5)})
    fit = fit_hparam_laws(pd.DataFrame(rows))
    assert fit.log_lr is None and fit.dropout is not None
    paths = plot_hparams(fit, tmp_path / "hp")
    assert [p.name for p in paths] == ["hp_dropout.png"]
    assert paths[0].read_bytes()[:8] == PNG


# ---------------------------------------------------------------- 7: regression-law levels


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, True])
def test_regression_law_conf_int_refuses_a_level_outside_0_1(one_tpp_fit, level):
    with pytest.raises(FitInputError, match="strictly between 0 and 1"):
        one_tpp_fit.lr_wd.conf_int(level)
    with pytest.raises(FitInputError, match="strictly between 0 and 1"):
        one_tpp_fit.conf_int(level)


def test_regression_law_conf_int_narrows_with_the_level(one_tpp_fit):
    wide, narrow = one_tpp_fit.lr_wd.conf_int(0.95), one_tpp_fit.lr_wd.conf_int(0.5)
    assert all(wide[k] == pytest.approx(one_tpp_fit.lr_wd.ci[k]) for k in wide)
    assert all(narrow[k][1] - narrow[k][0] < wide[k][1] - wide[k][0] for k in wide)


def test_hparam_predict_refuses_non_positive_steps_tpp_or_size(one_tpp_fit):
    assert one_tpp_fit.predict(steps=1000, tpp=20, params_active=1e8)["lr"] > 0
    with pytest.raises(FitInputError, match="steps"):
        one_tpp_fit.predict(steps=0, tpp=20, params_active=1e8)
    with pytest.raises(FitInputError, match="params_active"):
        one_tpp_fit.predict(steps=1000, tpp=20, params_active=float("nan"))


# ---------------------------------------------------------------- 8: power-law panels


def test_power_law_plot_refuses_no_laws_and_draws_a_law_without_runs_as_its_curve(tmp_path):
    x = np.geomspace(1e15, 1e19, 7)
    y = (1.5 + 2e3 * x**-0.25) * np.exp(np.random.default_rng(1).normal(0, 0.004, len(x)))
    df = pd.DataFrame({"train_flops": x, "bpb": y, "domain": "code"})
    fit = fit_power_law(df)
    with pytest.raises(FitInputError, match="no laws"):
        plot_power_laws({}, df)
    fig = plot_power_laws({"code": fit, "math": fit, "web": None}, df, path=tmp_path / "pl.png")
    assert (tmp_path / "pl.png").read_bytes()[:8] == PNG
    ax = fig.axes[1]
    assert "no runs" in ax.get_title()
    curve = ax.get_lines()[0]
    assert len(curve.get_xdata()) > 10 and np.all(np.isfinite(curve.get_ydata()))
    assert curve.get_xdata().min() == pytest.approx(1e15)  # the law's own fitted range
    assert "no runs" in fig.axes[2].get_title()
