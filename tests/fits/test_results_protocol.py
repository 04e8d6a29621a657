"""Every law's result keeps one protocol (fits.results.LawResult): frozen, to_dict, summary,
code_version, and conf_int(level) whose interval at the fit's own level is the one it reports."""

import dataclasses

import numpy as np
import pytest

from fits.chinchilla import fit_chinchilla
from fits.dropout import fit_dropout_law
from fits.hparam_laws import fit_hparam_laws
from fits.results import LawResult
from provenance import code_version
from tests.fits.hparam_synth import sweep


def dropout_truth(n):
    return 0.2 / (1 + np.exp(-1.0 * (np.log(n) - np.log(1e8))))


def check_protocol(result) -> None:
    assert isinstance(result, LawResult) and result.code_version == code_version()
    assert result.to_dict()["code_version"] == code_version() and result.summary()
    field = dataclasses.fields(result)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(result, field, None)


def test_hyperparameter_laws_and_their_surfaces_keep_the_protocol():
    laws = fit_hparam_laws(sweep(seed=1))
    for result in (laws, laws.lr_wd, laws.log_lr, laws.slices[0]):
        check_protocol(result)
    assert laws.log_lr.conf_int() == laws.log_lr.ci  # 95%: what it reports
    lo99, hi99 = laws.log_lr.conf_int(0.99)["log_steps"]
    lo50, hi50 = laws.log_lr.conf_int(0.5)["log_steps"]
    assert lo99 < lo50 < laws.log_lr.params["log_steps"] < hi50 < hi99
    assert set(laws.conf_int()) == {"lr_wd_product", "log_lr"}
    surface = laws.slices[0]
    lo, hi = surface.conf_int(0.95)["lr"]
    t19 = 2.093024  # Student's t, 0.975, at the 5x5 grid's 25 - 6 residual degrees of freedom
    assert surface.resid_dof == 19
    assert lo < surface.optimum[0] < hi and hi - lo == pytest.approx(2 * t19 * surface.optimum_se[0], rel=1e-5)


def test_the_dropout_law_and_chinchilla_keep_the_protocol():
    dropout = fit_dropout_law(sweep(seed=4, sizes=(1e6, 1e7, 3e7, 1e8, 3e8, 1e9, 1e10), tpps=(20.0,),
                                    dropout_law=dropout_truth))
    check_protocol(dropout)
    lo, hi = dropout.conf_int(0.9)["p_max"]
    assert lo < dropout.params["p_max"] < hi
    rng = np.random.default_rng(0)
    N = np.repeat(np.geomspace(1e7, 1e9, 4), 3)
    D = N * np.tile([10.0, 20.0, 40.0], 4)
    import pandas as pd

    df = pd.DataFrame({"params": N, "tokens": D, "loss": (1.7 + 400 / N**0.34 + 410 / D**0.28)
                       * np.exp(rng.normal(0, 1e-3, len(N)))})
    fit = fit_chinchilla(df, bootstrap=100, id_column=None)
    check_protocol(fit)
    assert fit.conf_int() == fit.ci
