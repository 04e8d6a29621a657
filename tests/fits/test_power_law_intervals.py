"""Intervals that mean something: a power law over too narrow a
compute span is refused, a bootstrap on too few rungs or one that piles α onto its bound reports no
interval, and the intervals that are reported cover what they claim on seeded synthetic ladders."""

import numpy as np
import pandas as pd
import pytest

from benchmarks.fits import interval_coverage
from fits.backtest import holdout_backtest
from fits.identify import NotIdentifiedError
from fits.power_law import fit_power_law


def law(C):
    return 0.6 + 40.0 * C**-0.08


def test_five_rungs_spanning_1_2x_in_compute_are_refused_with_what_would_help():
    C = np.geomspace(1e20, 1.2e20, 5)
    df = pd.DataFrame({"train_flops": C, "bpb": law(C) * np.exp(np.random.default_rng(0).normal(0, 0.003, 5))})
    with pytest.raises(NotIdentifiedError, match=r"train_flops spans 1\.2x.*needs ≥ 3x") as err:
        fit_power_law(df)
    assert err.value.column == "train_flops"


def test_a_four_point_bootstrap_reports_no_interval():
    """Most of a 4-point bootstrap's resamples are 3-point interpolations: its 95% interval was
    0.05% wide and missed the held-out point by 4.3%. Not reported as an interval."""
    C = np.geomspace(1e18, 1e21, 4)
    df = pd.DataFrame({"train_flops": C, "bpb": law(C) * np.exp(np.random.default_rng(1).normal(0, 0.005, 4))})
    fit = fit_power_law(df, bootstrap=200)
    assert fit.ci == {} and fit.se == {}
    assert fit.extra["interval"]["available"] is False and "4 distinct x" in fit.extra["interval"]["reason"]
    assert fit.to_dict()["interval"]["unreliable_ci"]["alpha"]
    C5 = np.geomspace(1e18, 1e21, 5)
    bt = holdout_backtest(pd.DataFrame({"train_flops": C5, "bpb": law(C5)}), bootstrap=100)
    assert bt["predictions"][0]["interval_available"] is False and bt["predictions"][0]["interval_reason"]


def bound_case():
    """A 6-rung ladder with a steep law (α ≈ 1.5): 7% of the resamples put α on its upper bound 4."""
    rng = np.random.default_rng(0)
    for _ in range(103):
        k = int(rng.integers(5, 8))
        C = np.geomspace(1e18, 10 ** rng.uniform(19, 21), k).repeat(int(rng.integers(1, 3)))
        al = rng.uniform(0.05, 1.5)
        y = (rng.uniform(0.3, 1) + rng.uniform(1, 50) * (C / 1e18) ** -al) * np.exp(rng.normal(0, rng.uniform(0.003, 0.03), len(C)))
    return pd.DataFrame({"train_flops": C, "bpb": y})


def test_an_interval_on_the_alpha_bound_is_not_reported():
    fit = fit_power_law(bound_case(), bootstrap=200, seed=102)
    assert fit.ci == {}
    assert "alpha on its bound" in fit.extra["interval"]["reason"]
    assert fit.extra["interval"]["unreliable_ci"]["alpha"][1] == pytest.approx(4.0)


@pytest.mark.slow
def test_reported_intervals_cover_on_seeded_six_rung_ladders():
    """Nominal 95% on 40 seeded 6-rung ladders with 0.5% noise: the held-out top rung and the true α
    are inside their intervals at least 80% of the time (deterministic seeds: the same every run).
    Over 100× in compute at this noise, E is often not identified and that fit is refused (counted
    apart): coverage is of the intervals that are reported."""
    cov = interval_coverage(6, 0.005, trials=40, bootstrap=200)
    assert cov["held_out_not_available"] == 0 and cov["alpha_not_available"] <= 20
    assert 0.8 <= cov["held_out_top_inside"] <= 1.0
    assert 0.8 <= cov["alpha_covered"] <= 1.0
