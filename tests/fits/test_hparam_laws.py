"""Sweeps → slice optima → the report's hyperparameter laws, and the dropout law."""

import numpy as np
import pandas as pd
import pytest

from fits.dropout import fit_dropout_law, sigmoid
from fits.errors import FitInputError
from fits.hparam_laws import fit_hparam_laws
from tests.fits.hparam_synth import REPORT, sweep, true_optimum


def test_synthetic_sweep_recovers_the_report_laws_within_their_intervals():
    fit = fit_hparam_laws(sweep(seed=1))
    out = fit.to_dict()
    assert len(out["slices"]) == 15 and out["excluded_slices"] == []
    prod, lr = out["lr_wd_product"], out["log_lr"]
    lo, hi = prod["ci95"]["steps_exponent"]
    assert lo <= REPORT["k"] <= hi and prod["steps_exponent"] == pytest.approx(-1.0, abs=0.05)
    assert prod["coef"] == pytest.approx(REPORT["coef"], rel=0.25)
    for name, truth in (("const", REPORT["a"]), ("log_tpp", REPORT["b"]), ("log_steps", REPORT["c"])):
        lo, hi = lr["ci95"][name]
        assert lo <= truth <= hi, (name, lo, hi)
    assert lr["log_tpp"] == pytest.approx(0.175, abs=0.05) and lr["log_steps"] == pytest.approx(-0.573, abs=0.05)
    # model selection picks forms that contain the true regressors
    assert "log_steps" in out["selected"]["lr_wd_product"]["terms"]
    assert {"log_tpp", "log_steps"} <= set(out["selected"]["log_lr"]["terms"]) or \
        out["selected"]["log_lr"]["aic"] <= min(c["aic"] for c in out["candidates"]["log_lr"])
    # prediction at a new scale lands on the true optimum
    n, tpp = 3e9, 40.0
    steps = int(np.ceil(tpp * n / (0.58 * (tpp * n) ** 0.571)))  # the sweep's batch rule
    pred = fit.predict(steps=steps, tpp=tpp, params_active=n)
    u, v = true_optimum(steps, tpp)
    assert pred["lr"] == pytest.approx(np.exp(u), rel=0.1)
    assert pred["lr_interval"][0] < np.exp(u) < pred["lr_interval"][1]
    assert pred["wd"] == pytest.approx(np.exp(v - u), rel=0.15)


def test_constant_tpp_leaves_the_tpp_term_unidentified_not_invented():
    fit = fit_hparam_laws(sweep(seed=2, tpps=(20.0,)))
    out = fit.to_dict()
    assert out["log_lr"]["log_tpp"] is None and out["log_lr"]["log_steps"] is not None
    assert all("log_tpp" not in c["terms"] for c in out["candidates"]["log_lr"])


def test_diverged_runs_are_dropped_and_counted():
    df = sweep(seed=3, sizes=(1e7, 1e8, 1e9), tpps=(5.0, 80.0))
    df.loc[df.index[:4], "bpb"] = np.nan
    fit = fit_hparam_laws(df)
    assert fit.options["diverged_rows_dropped"] == 4


def test_missing_columns_and_too_few_slices_are_typed_errors():
    df = sweep(seed=0, sizes=(1e7, 1e8), tpps=(5.0,))
    with pytest.raises(FitInputError, match="missing column"):
        fit_hparam_laws(df.drop(columns="wd"))
    with pytest.raises(FitInputError, match="identifiable"):
        fit_hparam_laws(df[df.params_active == 1e7])


def test_two_slices_give_an_exactly_determined_law_without_intervals():
    """The demo's two-rung sweep: the steps law through two optima, honestly without an interval."""
    fit = fit_hparam_laws(sweep(seed=0, sizes=(1e7, 1e8), tpps=(5.0,)))
    out = fit.to_dict()
    sel = out["selected"]["lr_wd_product"]
    assert sel["exactly_determined"] and sel["terms"] == ["log_steps"] and sel["ci95"]["log_steps"] == [None, None]
    assert out["lr_wd_product"]["steps_exponent"] == pytest.approx(-1.0, abs=0.05)
    mean, lo, hi = fit.lr_wd.predict({"log_steps": np.log(5000.0)})
    assert np.isfinite(mean) and np.isnan(lo) and np.isnan(hi)


def test_dropout_law_recovers_a_sigmoid_in_log_size():
    def truth(n):
        return 0.2 / (1 + np.exp(-1.0 * (np.log(n) - np.log(1e8))))
    sizes = (1e6, 1e7, 3e7, 1e8, 3e8, 1e9, 1e10)
    df = sweep(seed=4, sizes=sizes, tpps=(20.0,), dropout_law=truth)
    law = fit_dropout_law(df)
    for s in law.surfaces:
        assert s.optimum[0] == pytest.approx(truth(s.key["params_active"]), abs=0.01)
    assert law.params["p_max"] == pytest.approx(0.2, abs=0.03)
    assert law.params["k"] == pytest.approx(1.0, rel=0.3)
    pred = law.predict([3e9])
    assert pred["interval"][0][0] <= truth(3e9) <= pred["interval"][1][0]
    # …and the hparams pipeline carries it along when the sweep varies dropout
    full = fit_hparam_laws(df).to_dict()
    assert full["dropout"]["params"]["p_max"] == pytest.approx(law.params["p_max"])
    assert sigmoid(np.log(1e8), 0.2, 1.0, np.log(1e8)) == pytest.approx(0.1)


def test_dropout_law_slices_by_a_text_column_and_refuses_a_missing_slice_value():
    """A slice column of names (a tokenizer, an arm) keys its surfaces by name: it was cast to float and
    failed; a row without its slice value would fall out of every slice unsaid."""
    def truth(n):
        return 0.2 / (1 + np.exp(-1.0 * (np.log(n) - np.log(1e8))))
    df = sweep(seed=4, sizes=(1e6, 1e7, 3e7, 1e8, 3e8, 1e9, 1e10), tpps=(20.0,), dropout_law=truth)
    df["tokenizer"] = "bpe"
    law = fit_dropout_law(df, slice_cols=("params_active", "tokenizer"))
    assert {s.key["tokenizer"] for s in law.surfaces} == {"bpe"}
    assert law.params["p_max"] == pytest.approx(fit_dropout_law(df).params["p_max"])
    df.loc[df.index[0], "tokenizer"] = None
    with pytest.raises(FitInputError, match="missing value"):
        fit_dropout_law(df, slice_cols=("params_active", "tokenizer"))


def test_dropout_law_needs_enough_sizes():
    df = sweep(seed=5, sizes=(1e7, 1e8), tpps=(20.0, 80.0), dropout_law=lambda n: 0.1)
    with pytest.raises(FitInputError, match="≥ 3 model sizes"):
        fit_dropout_law(df)


def test_a_dropout_only_sweep_gives_the_dropout_law_and_no_lr_laws():
    """Like sweeps/dropout.yaml: LR/WD at the law's values, dropout × size × TPP."""
    def truth(n):
        return 0.2 / (1 + np.exp(-1.0 * (np.log(n) - np.log(1e8))))
    df = sweep(seed=6, sizes=(1e7, 1e8, 1e9), tpps=(5.0, 20.0), dropout_law=truth)
    first = df.groupby(["params_active", "tpp"])["lr"].transform("first")
    df = df[np.isclose(df["lr"], first)]  # one LR/WD point per slice
    out = fit_hparam_laws(df).to_dict()
    assert out["selected"] is None and out["lr_wd_product"]["coef"] is None
    assert len(out["dropout"]["optima"]) == 6 and {o["tpp"] for o in out["dropout"]["optima"]} == {5.0, 20.0}
    for o in out["dropout"]["optima"]:
        assert o["dropout"] == pytest.approx(truth(o["params_active"]), abs=0.01)
    with pytest.raises(FitInputError, match="did not vary LR/WD"):
        fit_hparam_laws(df).predict(steps=1000, tpp=5, params_active=1e8)


def test_a_slice_without_a_dropout_sweep_is_left_out_of_the_dropout_law_and_said(tmp_path, capsys):
    """A ladder rung run at one dropout next to a dropout sweep: its slice has no dropout curve, so it is left
    out of the dropout law with its reason (as `slice_optima` leaves out LR/WD slices); it killed the whole fit,
    LR/WD laws included, with FlatSurfaceError. Its LR/WD sweep still counts, at the one dropout it ran."""
    def truth(n):
        return 0.2 / (1 + np.exp(-1.0 * (np.log(n) - np.log(1e8))))
    swept = sweep(seed=4, sizes=(1e6, 1e7, 3e7, 1e8, 3e8, 1e9, 1e10), tpps=(20.0,), dropout_law=truth)
    rung = sweep(seed=7, sizes=(3e10,), tpps=(20.0,))  # no dropout_law: every run at dropout 0
    assert rung["dropout"].nunique() == 1
    df = pd.concat([swept, rung], ignore_index=True)
    alone = fit_dropout_law(swept)
    law = fit_dropout_law(df)
    assert law.params == pytest.approx(alone.params, rel=1e-12)  # the same optima, the same sigmoid
    assert [s.key["params_active"] for s in law.surfaces] == [s.key["params_active"] for s in alone.surfaces]
    (left_out,) = law.excluded
    assert left_out["params_active"] == 3e10 and left_out["tpp"] == 20.0
    assert "column 'dropout'" in left_out["reason"] and "at least 3 distinct values" in left_out["reason"]
    assert law.summary().startswith(f"dropout law p*(N) = {law.params['p_max']:.3g}")
    assert f"from {len(alone.surfaces)} optima, 1 excluded" in law.summary()
    fit = fit_hparam_laws(df)
    out = fit.to_dict()
    assert out["dropout"]["excluded"] == law.excluded and out["dropout"]["params"] == pytest.approx(alone.params)
    assert 3e10 in {s.key["params_active"] for s in fit.slices}  # its LR/WD optimum, at dropout 0
    assert fit.lr_wd is not None and fit.log_lr is not None
    from ladder.cli import main

    df.to_csv(tmp_path / "sweep.csv", index=False)
    assert main(["fit", "hparams", "--csv", str(tmp_path / "sweep.csv")]) == 0
    err = capsys.readouterr().err
    assert "dropout law: slice params_active=3e+10, tpp=20 left out (column 'dropout': needs at least 3" in err


def _grid_beside_a_dropout_sweep(seed=0):
    """sweeps/lr_wd.yaml read with sweeps/dropout.yaml: a 3×3 LR/WD grid at dropout 0, and dropouts 0.05–0.2 at
    the grid's centre; the best dropout (~0.03–0.13) is not the grid's."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (1e7, 1e8, 1e9):
        for tpp in (5.0, 20.0):
            steps = int(np.ceil(tpp * n / (0.58 * (tpp * n) ** 0.571)))
            u0, v0 = true_optimum(steps, tpp)
            p_star = 0.1 / (1 + np.exp(-(np.log(n) - np.log(1e8)))) + 0.03

            def add(du, dv, p):
                y = 1.0 + 0.02 * du**2 + 0.015 * dv**2 + 0.01 * du * dv + 0.5 * (p - p_star) ** 2
                rows.append({"run_id": f"r{len(rows)}", "lr": np.exp(u0 + du), "wd": np.exp(v0 + dv - u0 - du),
                             "dropout": p, "bpb": y + rng.normal(0, 2e-4), "steps": steps, "tpp": tpp,
                             "params_active": n})
            for du in (-0.5, 0.0, 0.5):
                for dv in (-0.7, 0.0, 0.7):
                    add(du, dv, 0.0)
            for p in (0.05, 0.1, 0.2):
                add(0.0, 0.0, p)
    return pd.DataFrame(rows)


def test_an_lr_wd_grid_beside_a_dropout_sweep_keeps_its_lr_wd_laws(tmp_path, capsys):
    """Each slice was cut to the runs at its best dropout: one run, so "LR/WD were not swept" with exit 0 and no
    laws. Now each slice's surface is fitted at the dropout with the most LR/WD points: the grid's."""
    df = _grid_beside_a_dropout_sweep()
    fit = fit_hparam_laws(df)
    alone = fit_hparam_laws(df[df["dropout"] == 0].drop(columns="dropout"))
    assert fit.dropout is not None and fit.options["lr_wd_swept"]
    assert fit.lr_wd.params == pytest.approx(alone.lr_wd.params, rel=1e-12)
    assert fit.log_lr.params == pytest.approx(alone.log_lr.params, rel=1e-12)
    assert {(u["dropout"], u["lr_wd_points"]) for u in fit.options["lr_wd_dropout"]} == {(0.0, 9)}
    from ladder.cli import main

    df.to_csv(tmp_path / "sweep.csv", index=False)
    assert main(["fit", "hparams", "--csv", str(tmp_path / "sweep.csv")]) == 0
    out = capsys.readouterr().out
    assert "LR*·WD* = " in out and "not swept" not in out


def test_a_grid_crossed_with_dropout_fits_each_surface_at_the_best_dropout():
    def truth(n):
        return 0.2 / (1 + np.exp(-1.0 * (np.log(n) - np.log(1e8))))
    df = sweep(seed=3, sizes=(1e7, 1e8, 1e9), tpps=(20.0,), dropout_law=truth)
    fit = fit_hparam_laws(df)
    for used in fit.options["lr_wd_dropout"]:
        rows = df[df["params_active"] == used["params_active"]]
        assert used["dropout"] == rows.loc[rows["bpb"].idxmin(), "dropout"] and used["lr_wd_points"] == 25


def test_dropout_that_varies_unswept_leaves_the_lr_wd_laws_and_says_why(tmp_path, capsys):
    """One rung at the recipe's dropout 0.1, nothing swept: the dropout law's refusal took the 15 LR/WD surfaces
    down with it (exit 2)."""
    df = sweep(seed=1, noise=2e-3)
    df.loc[df["params_active"] == 1e9, "dropout"] = 0.1
    fit = fit_hparam_laws(df)
    assert fit.dropout is None and "≥ 3 model sizes" in fit.options["dropout_error"]
    assert fit.lr_wd.params == pytest.approx(fit_hparam_laws(df.drop(columns="dropout")).lr_wd.params, rel=1e-12)
    from ladder.cli import main

    df.to_csv(tmp_path / "sweep.csv", index=False)
    assert main(["fit", "hparams", "--csv", str(tmp_path / "sweep.csv")]) == 0
    assert "dropout law not fitted: column 'params_active'" in capsys.readouterr().err
    df.loc[0, "dropout"] = 1.5  # a bad value is still refused, not taken for a missing law
    with pytest.raises(FitInputError, match=r"dropout must lie in \[0, 1\)"):
        fit_hparam_laws(df)


def test_an_iso_token_design_prints_the_selected_laws(tmp_path, capsys):
    """Equal N·TPP in every slice: equal steps, so the report's form (a law in steps) is not identifiable; the
    human output formatted its None coefficients and died with TypeError."""
    df = pd.concat([sweep(seed=i, sizes=(n,), tpps=(8e8 / n,)) for i, n in enumerate((2e7, 4e7, 8e7, 1.6e8))],
                   ignore_index=True)
    assert df["steps"].nunique() == 1
    from ladder.cli import main

    df.to_csv(tmp_path / "iso.csv", index=False)
    assert main(["fit", "hparams", "--csv", str(tmp_path / "iso.csv")]) == 0
    out = capsys.readouterr().out
    assert "not identifiable" in out and "log_lr = " in out and "log_tpp" in out


def test_a_slice_flat_along_lr_wd_shows_no_optimum_in_the_table(tmp_path, capsys):
    """Its optimum lies thousands of log units out (flagged, left out of the laws); exp overflowed to inf, the
    JSON's null, and the table divided None by a float."""
    df = sweep(seed=1)
    m = (df["params_active"] == 1e7) & (df["tpp"] == 5.0)
    u, v = np.log(df.lr[m]), np.log(df.lr[m] * df.wd[m])
    df.loc[m, "bpb"] = 1.0 + 0.02 * (u - u.mean()) ** 2 - 1e-3 * (v - v.mean()) + 1e-7 * (v - v.mean()) ** 2
    fit = fit_hparam_laws(df)
    (flat,) = [s for s in fit.slices if s.key["params_active"] == 1e7 and s.key["tpp"] == 5.0]
    assert "optimum_outside_sampled_region" in flat.flags and fit.lr_wd is not None
    from ladder.cli import main

    df.to_csv(tmp_path / "sweep.csv", index=False)
    assert main(["fit", "hparams", "--csv", str(tmp_path / "sweep.csv")]) == 0
    assert "optimum_outside_sampled_region" in capsys.readouterr().out


def test_a_dropout_profile_with_no_curvature_is_left_out_not_a_linalg_error():
    """Best losses exactly linear in dropout (3.00, 3.10, 3.20): a zero Hessian; the delta method's steps solved
    it and numpy's LinAlgError ended the fit."""
    rows = []
    for i, n in enumerate((1e7, 3e7, 1e8, 3e8, 1e9)):
        for p, y in zip((0.0, 0.1, 0.2), (3.05, 3.02, 3.04) if i else (3.00, 3.10, 3.20)):
            rows.append({"run_id": f"r{len(rows)}", "lr": 0.01, "wd": 0.1, "steps": 1000 * (i + 1), "tpp": 20,
                         "params_active": n, "dropout": p, "bpb": y - 0.1 * i})
    law = fit_dropout_law(pd.DataFrame(rows))
    (left_out,) = [e for e in law.excluded if e["params_active"] == 1e7]
    assert "hessian_not_positive_definite" in left_out["reason"]


def test_a_metric_cell_that_is_no_number_is_refused_not_counted_as_diverged():
    df = sweep(seed=1)
    df["bpb"] = df["bpb"].astype(object)
    df.loc[3, "bpb"] = "1.0O2"
    with pytest.raises(FitInputError, match=r"1 value\(s\) that are not numbers \('1.0O2' at row 3\)"):
        fit_hparam_laws(df)
    df.loc[3, "bpb"] = "nan"  # a diverged run, written as text
    assert fit_hparam_laws(df).options["diverged_rows_dropped"] == 1
    df["bpb"] = np.nan
    with pytest.raises(FitInputError, match="no run has a finite value"):
        fit_hparam_laws(df)


def test_the_dropout_interval_covers_the_true_optimum_at_its_level():
    """Weighted by each optimum's own 1-dof standard error, the card's 95% interval covered the truth in 73–80% of
    sweeps; unweighted with Student's t it covers ~95% (95 of 100 here, seeded)."""
    from fits.extrapolate import dropout_from_law

    def truth(n):
        return 0.25 / (1 + np.exp(-1.0 * (np.log(n) - np.log(1e8))))
    rng = np.random.default_rng(2)
    covered = 0
    for _ in range(100):
        rows = [{"params_active": s, "tpp": t, "dropout": p, "bpb": 3.0 + 0.5 * (p - truth(s)) ** 2 + rng.normal(0, 5e-4)}
                for s in (1e7, 3e7, 1e8, 3e8, 1e9) for t in (5.0, 20.0) for p in (0.0, 0.05, 0.1, 0.2, 0.3)]
        law = fit_dropout_law(pd.DataFrame(rows))
        lo, hi = dropout_from_law(law.to_dict(), 1e9)["interval95"]
        covered += lo <= truth(1e9) <= hi
    assert covered >= 90, covered


def test_a_surface_optimum_interval_is_student_t_at_its_residual_dof():
    from scipy import stats

    from fits.surfaces import fit_surface

    df = sweep(seed=1, sizes=(1e8,), tpps=(20.0,))
    s = fit_surface(df.assign(lr_wd=df["lr"] * df["wd"]), ["lr", "lr_wd"], "bpb")
    assert s.resid_dof == 25 - 6
    lo, hi = s.conf_int(0.9)["lr"]
    assert (hi - lo) / 2 == pytest.approx(stats.t.ppf(0.95, 19) * s.optimum_se[0], rel=1e-12)
