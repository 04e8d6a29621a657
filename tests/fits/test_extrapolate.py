"""Recipe-card numbers from fitted laws and from the report's published laws."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from fits.extrapolate import hparams_from_report, predict_regression, recipe_card
from fits.hparam_laws import fit_hparam_laws
from fits.power_law import fit_power_law, power_law_from_dict
from tests.fits.hparam_synth import sweep

REPORT_LAWS = {"lr_wd_product_coef": 17.04, "lr_wd_product_steps_exponent": -1.0, "log_lr_intercept": -1.51,
               "log_lr_log_tpp": 0.175, "log_lr_log_steps": -0.573}


def test_report_laws_closed_form():
    hp = hparams_from_report(REPORT_LAWS, steps=10_000, tpp=625, source="report")
    assert hp["lr"]["value"] == pytest.approx(math.exp(-1.51 + 0.175 * math.log(625) - 0.573 * math.log(10_000)))
    assert hp["lr_wd_product"]["value"] == pytest.approx(17.04 / 10_000)
    assert hp["wd"]["value"] == pytest.approx(17.04 / 10_000 / hp["lr"]["value"])
    assert "NOT fitted" in hp["source"]


def test_regression_prediction_from_json_matches_statsmodels():
    fit = fit_hparam_laws(sweep(seed=7))
    d = json.loads(json.dumps(fit.to_dict()))
    v = {"log_steps": math.log(5000), "log_tpp": math.log(20), "log_params": math.log(3e8)}
    mean, lo, hi = predict_regression(d["selected"]["log_lr"], v)
    ref = fit.log_lr.predict(v)
    assert (mean, lo, hi) == pytest.approx(ref, rel=1e-9)


def test_card_from_laws_survives_a_json_round_trip():
    C = np.geomspace(1e18, 1e21, 5).repeat(2)
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"train_flops": C, "bpb": (0.6 + 30 * C**-0.08) * np.exp(rng.normal(0, 0.002, len(C)))})
    law = fit_power_law(df, bootstrap=200)
    law2 = power_law_from_dict(json.loads(json.dumps(law.to_dict(include_draws=True))))
    hp = json.loads(json.dumps(fit_hparam_laws(sweep(seed=8)).to_dict()))
    target = {"steps": 20000, "tpp": 20.0, "params_active": 1e10, "train_flops": 1e23}
    card = recipe_card(target, power_laws={"code": law2}, hparams=hp, recipe_dropout=0.0)
    b = card["predicted_bpb"]["code"]
    assert b["value"] == pytest.approx(float(law.predict([1e23])[0]))
    assert b["interval"][0] < b["value"] < b["interval"][1]
    assert b["extrapolation_factor"] == pytest.approx(100.0)
    assert card["hyperparameters"]["source"] == "fitted laws"
    lr = card["hyperparameters"]["lr"]
    assert lr["interval95"][0] < lr["value"] < lr["interval95"][1]
    assert card["hyperparameters"]["dropout"]["source"].startswith("the recipe's fixed dropout")


def test_card_with_only_a_dropout_law_keeps_the_report_lr_and_says_which_is_which():
    def truth(n):
        return 0.2 / (1 + np.exp(-1.0 * (np.log(n) - np.log(1e8))))
    df = sweep(seed=6, sizes=(1e7, 1e8, 1e9), tpps=(5.0, 20.0), dropout_law=truth)
    df = df[np.isclose(df["lr"], df.groupby(["params_active", "tpp"])["lr"].transform("first"))]
    hp = json.loads(json.dumps(fit_hparam_laws(df).to_dict()))
    card = recipe_card({"steps": 20000, "tpp": 20.0, "params_active": 1e9, "train_flops": 1e21}, hparams=hp,
                       report_laws=REPORT_LAWS, recipe_dropout=0.0)
    h = card["hyperparameters"]
    assert "NOT fitted" in h["source"] and h["dropout"]["source"] == "fitted dropout law"
    assert h["dropout"]["value"] == pytest.approx(truth(1e9), abs=0.02)
