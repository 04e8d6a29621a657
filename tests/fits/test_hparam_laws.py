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
