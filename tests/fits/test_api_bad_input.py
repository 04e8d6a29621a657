"""The fits' Python API (what notebooks call) on bad but plausible input: a FitInputError saying what is
wrong, never a silently wrong number, a zero-width interval called available, or a numpy traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fits import fit_chinchilla, fit_power_law, fit_power_laws, holdout_backtest, progressive_backtest
from fits.efficiency import efficiency_gains
from fits.eg_scaling import domain_columns
from fits.errors import FitInputError

FIXTURES = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures"


def ladder(rungs: int = 7, seeds: int = 1, noise: float = 0.004, seed: int = 1) -> pd.DataFrame:
    """BPB = 1.5 + 2e3·C^−0.25 with log-normal noise, `seeds` runs a rung."""
    rng = np.random.default_rng(seed)
    x = np.repeat(np.geomspace(1e15, 1e19, rungs), seeds)
    return pd.DataFrame({"train_flops": x, "bpb": (1.5 + 2e3 * x ** -0.25) * np.exp(rng.normal(0, noise, len(x))),
                         "seed": np.tile(np.arange(seeds), rungs)})


def chinchilla_grid() -> pd.DataFrame:
    rows = [{"params": n, "tokens": n * tpp, "loss": 1.69 + 406.4 / n ** 0.34 + 410.7 / (n * tpp) ** 0.28}
            for n in np.geomspace(1e7, 1e9, 5) for tpp in (5, 10, 20, 40, 80)]
    return pd.DataFrame(rows)


# --- a cluster bootstrap of one cluster -------------------------------------------------------------------------

@pytest.mark.parametrize("clusters", [[1] * 12, [np.nan] * 12, [None] + ["a"] * 11])
def test_a_cluster_bootstrap_needs_two_clusters_and_every_row_in_one(clusters):
    # One cluster: every resample is the table, a zero-width interval that was reported as available.
    with pytest.raises(FitInputError, match="column 'c'"):
        fit_power_law(ladder(6, 2, 0.005).assign(c=clusters), bootstrap=50, floor="auto", cluster="c")


def test_mixed_cluster_labels_are_clusters():
    df = ladder(6, 2, 0.005).assign(c=[1, "a"] * 6)  # an int and a str label: two clusters, not a TypeError
    fit = fit_power_law(df, bootstrap=50, floor="auto", cluster="c")
    assert fit.bootstrap_params is not None and len(fit.bootstrap_params) > 0


# --- held-out rungs' values are checked as the fitted ones are ---------------------------------------------

@pytest.mark.parametrize("bad", [np.nan, -1.0, "x"])
@pytest.mark.parametrize("backtest", [holdout_backtest, progressive_backtest])
def test_a_backtest_refuses_a_bad_value_on_a_held_out_rung(backtest, bad):
    df = ladder(7, 2, 0.004, 2)
    bpb = df["bpb"].astype(object)
    bpb.iloc[13] = bad  # the top rung's second run: held out, averaged, counted
    with pytest.raises(FitInputError, match="column 'bpb'"):
        backtest(df.assign(bpb=bpb), bootstrap=50)


def test_a_backtest_reads_numbers_written_as_text():
    df = ladder(7, 2, 0.004, 2)
    as_text = holdout_backtest(df.astype({"train_flops": str, "bpb": str}), bootstrap=50)
    assert as_text["predictions"] == holdout_backtest(df, bootstrap=50)["predictions"]


# --- interval levels -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [0, 1, 1.5, -0.5, True, float("nan")])
def test_an_interval_level_outside_0_1_is_refused(level):
    fit = fit_power_law(ladder(), bootstrap=50)
    for call in (lambda: fit.new_run_interval(1e20, level=level), lambda: fit.conf_int(level),
                 lambda: fit.predict_interval([1e20], level)):
        with pytest.raises(FitInputError, match="between 0 and 1"):
            call()


def test_the_default_level_is_the_fits_own():
    fit = fit_power_law(ladder(), bootstrap=50, ci_level=0.8)
    assert fit.new_run_interval(1e20)["level"] == 0.8 and fit.conf_int() == fit.conf_int(0.8)


@pytest.mark.parametrize("ci_level", [0, 1.5, -0.1])
def test_a_fit_refuses_a_ci_level_outside_0_1_with_or_without_a_bootstrap(ci_level):
    for bootstrap in (0, 50):
        with pytest.raises(FitInputError, match="ci_level"):
            fit_power_law(ladder(), bootstrap=bootstrap, ci_level=ci_level)
        with pytest.raises(FitInputError, match="ci_level"):
            fit_chinchilla(chinchilla_grid(), bootstrap=bootstrap, ci_level=ci_level, n_starts=4)


# --- bootstrap counts ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 5, 9, -3, 2.5, True])
def test_a_bootstrap_count_that_cannot_give_an_interval_is_refused(n):
    # 1..9 always failed with "only 5 of 5 resamples had ≥ 3 distinct x values" (none had failed);
    # a negative count was taken as 0, a fraction was a TypeError.
    with pytest.raises(FitInputError, match="bootstrap must be 0"):
        fit_power_law(ladder(8), bootstrap=n)
    with pytest.raises(FitInputError, match="bootstrap must be 0"):
        fit_power_laws(ladder(8), group=None, bootstrap=n)


# --- EG_time's interval is judged by the rungs ------------------------------------------------------------------

def test_eg_time_has_no_interval_where_eg_flops_has_none_for_too_few_rungs():
    runs = pd.read_csv(FIXTURES / "agc_ablation_runs.csv").dropna(subset=["bpb"])
    base = runs[runs.arm == "agc_off"]
    assert base.train_flops.nunique() < 5 < base.wall_seconds.nunique()  # seeds' wall clocks differ
    out = efficiency_gains(runs, arm="arm", baseline="agc_off", bootstrap=100, floor="auto")
    for row in out["arms"]["agc_on"]:
        assert row["eg_flops_interval"] is None and row["eg_time_interval"] is None
        assert "rungs" in row["eg_time_interval_note"]


def test_efficiency_reads_numbers_written_as_text():
    runs = pd.read_csv(FIXTURES / "agc_ablation_runs.csv").dropna(subset=["bpb"])
    as_text = efficiency_gains(runs.astype({"bpb": str}), arm="arm", baseline="agc_off", bootstrap=50, floor="auto")
    plain = efficiency_gains(runs, arm="arm", baseline="agc_off", bootstrap=50, floor="auto")
    assert as_text["arms"] == plain["arms"]


# --- domain and group names ------------------------------------------------------------------------------------

def test_a_domain_starting_with_se_is_a_domain():
    table = pd.DataFrame({"bpb_security": [1.0], "bpb_se_security": [0.01], "bpb_se": [1.1], "bpb": [1.0]})
    assert domain_columns(table) == {"security": "bpb_security", "se": "bpb_se", "all": "bpb"}


def _two_domains() -> pd.DataFrame:
    x = np.geomspace(1e15, 1e19, 7)
    return pd.DataFrame([{"domain": d, "train_flops": xi, "bpb": e + 2e3 * xi ** -0.25}
                         for d, e in (("web", 1.5), ("code", 0.8)) for xi in x])


def test_a_row_without_its_group_is_refused_not_dropped():
    df = _two_domains()
    df.loc[df.index[:3], "domain"] = np.nan  # three web runs would silently leave the web law
    with pytest.raises(FitInputError, match="column 'domain': has 3 missing"):
        fit_power_laws(df, floor="auto")


def test_two_group_values_with_one_name_are_refused():
    df = _two_domains().assign(domain=lambda d: [1 if v == "web" else "1" for v in d.domain])
    with pytest.raises(FitInputError, match="name the same group"):
        fit_power_laws(df, floor="auto")


# --- L(N, D) options --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("delta", ["auto", 0, -1, float("inf"), None])
def test_chinchilla_refuses_a_huber_delta_it_cannot_use(delta):
    with pytest.raises(FitInputError, match="delta must be a positive finite number"):
        fit_chinchilla(chinchilla_grid(), delta=delta, n_starts=4)


def test_chinchilla_refuses_an_unknown_start_rule():
    with pytest.raises(FitInputError, match="starts must be"):
        fit_chinchilla(chinchilla_grid(), starts="foo")


# --- notebook data ----------------------------------------------------------------------------------------------

def test_load_runs_names_the_shipped_fixtures_for_a_missing_one(monkeypatch):
    from ladder.analysis.notebook_data import load_runs
    from ladder.errors import LadderInputError

    monkeypatch.setenv("LADDER_NOTEBOOK_SOURCE", "fixture")
    with pytest.raises(LadderInputError, match="demo_runs.csv"):
        load_runs("nothing", "no_such_fixture.csv")
