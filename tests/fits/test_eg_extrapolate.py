"""Each arm's EG carried to a target's compute along its trend (fits.eg_extrapolate), checked against a
constant-factor arm drawn from a known law, a growing EG computed by hand, and statsmodels' interval of
the mean of the same regression at the same point."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm

from fits.eg_extrapolate import arms_at, arms_warnings, eg_at
from fits.eg_scaling import eg_by_domain, eg_trend
from fits.extrapolate import FAR_EXTRAPOLATION
from tests.fits.test_eg_scaling import COMPUTE, runs_table


def cell_of(C, eg, intervals):
    """A cell as `eg_by_domain` writes it, from given rungs."""
    return {"rungs": [{"train_flops": c, "eg": e, "interval": iv} for c, e, iv in zip(C, eg, intervals)],
            "trend": eg_trend(np.log(C), np.asarray(eg), intervals), "train_flops_range": [min(C), max(C)]}


def test_a_constant_factor_arm_is_recovered_at_the_target_within_its_interval():
    k = 1.3
    out = eg_by_domain(runs_table({"baseline": lambda C: C, "dedup": lambda C: k * C}), domains=["code", "web"])
    target = COMPUTE[-1] * 10
    for domain in ("code", "web"):
        at = eg_at(out["arms"]["dedup"][domain], target)
        lo, hi = at["interval"]
        assert lo < k < hi and lo < at["eg"] < hi
        assert at["eg"] == pytest.approx(k, rel=0.2)
        assert at["extrapolation_factor"] == pytest.approx(10.0, rel=1e-12)
        assert at["dof"] == 3 and at["ci_level"] == 0.95


def test_a_growing_gain_is_carried_to_the_exact_value_computed_by_hand():
    k, b, C0 = 1.1, 0.07, 1e12
    C = np.geomspace(1e12, 1e14, 4)
    eg = k * (C / C0) ** b
    cell = cell_of(C, eg, [[e / 1.05, e * 1.05] for e in eg])
    target = 3.2e19
    by_hand = 1.1 * math.exp(0.07 * (math.log(3.2e19) - math.log(1e12)))  # float64, EG = k·(C/C0)^b
    at = eg_at(cell, target)
    assert at["eg"] == pytest.approx(by_hand, rel=1e-11)
    assert at["verdict"] == "gain" and at["interval"][0] < by_hand < at["interval"][1]
    assert at["trend_slope"] == pytest.approx(b, rel=1e-9)


def test_the_unweighted_interval_is_statsmodels_ols_interval_of_the_mean():
    rng = np.random.default_rng(3)
    C = np.geomspace(1e12, 1e14, 6)
    eg = 1.2 * (C / 1e12) ** 0.05 * np.exp(0.02 * rng.standard_normal(6))
    cell = cell_of(C, eg, [None] * 6)
    target = 5e16
    for level in (0.95, 0.8):
        at = eg_at(cell, target, level)
        X = sm.add_constant(np.log(C))
        pred = sm.OLS(np.log(eg), X).fit().get_prediction(np.array([[1.0, math.log(target)]]))
        lo, hi = pred.conf_int(alpha=1 - level)[0]
        assert cell["trend"]["method"] == "ols"
        assert at["eg"] == pytest.approx(math.exp(pred.predicted_mean[0]), rel=1e-10)
        assert at["interval"] == pytest.approx([math.exp(lo), math.exp(hi)], rel=1e-10)


def test_the_weighted_interval_is_statsmodels_wls_interval_of_the_mean():
    """Rungs scattered beyond their own intervals: the Birge ratio exceeds 1 and the covariance is WLS's
    with its estimated scale; within them it stays at 1, WLS's with the scale fixed at 1."""
    C = np.geomspace(1e12, 1e14, 5)
    target = 2e15
    z = 1.959963984540054
    for jitter, width, scale in (([0.0, 0.05, -0.04, 0.03, 0.0], 1.02, None), ([0.0, 0.001, -0.001, 0.0, 0.0], 1.1, 1.0)):
        eg = 1.1 * (C / 1e12) ** 0.04 * np.exp(jitter)
        intervals = [[e / width * (1 + 0.01 * i), e * width] for i, e in enumerate(eg)]
        cell = cell_of(C, eg, intervals)
        sigma = np.array([(math.log(hi) - math.log(lo)) / (2 * z) for lo, hi in intervals])
        model = sm.WLS(np.log(eg), sm.add_constant(np.log(C)), weights=1 / sigma**2)
        # Birge 1: the variance is the rungs' σ alone, known for these normal intervals, so the normal quantile
        res = model.fit() if scale is None else model.fit(cov_type="fixed scale", cov_kwds={"scale": scale}, use_t=False)
        lo, hi = res.get_prediction(np.array([[1.0, math.log(target)]])).conf_int(alpha=0.05)[0]
        at = eg_at(cell, target)
        assert (cell["trend"]["birge_ratio"] > 1) == (scale is None)
        assert at["interval"] == pytest.approx([math.exp(lo), math.exp(hi)], rel=1e-9)


def test_two_rungs_give_a_value_without_an_interval_and_no_trend_gives_neither():
    C = np.array([1e12, 1e13])
    two = eg_at(cell_of(C, [1.1, 1.2], [[1.0, 1.2], [1.1, 1.3]]), 1e15)
    assert two["eg"] == pytest.approx(1.1 * (1.2 / 1.1) ** 3, rel=1e-12)
    assert two["interval"] is None and two["verdict"] == "no interval" and "three rungs" in two["interval_note"]
    one = eg_at(cell_of(C[:1], [1.1], [[1.0, 1.2]]), 1e15)
    assert one["eg"] is None and one["interval"] is None and one["interval_note"]


def test_an_interval_holding_one_reads_no_measured_gain():
    C = np.geomspace(1e12, 1e14, 4)
    at = eg_at(cell_of(C, [1.0, 1.01, 0.99, 1.0], [[0.9, 1.1]] * 4), 1e15)
    assert at["interval"][0] < 1 < at["interval"][1] and at["verdict"] == "no measured gain"


def test_the_warning_appears_beyond_100x_the_arms_compute_and_not_inside():
    C = np.geomspace(1e12, 1e14, 4)
    eg = 1.1 * (C / 1e12) ** 0.03
    sections = {"base": {"arms": {"dedup": {"code": cell_of(C, eg, [[e / 1.05, e * 1.05] for e in eg])}}}}
    assert arms_warnings(arms_at(sections, 1e14 * FAR_EXTRAPOLATION * 0.5)) == []
    assert arms_warnings(arms_at(sections, 1e14 * FAR_EXTRAPOLATION)) == []  # at 100×, not beyond it
    (warning,) = arms_warnings(arms_at(sections, 1e14 * FAR_EXTRAPOLATION * 3))
    assert "dedup vs base ×300" in warning and f"{FAR_EXTRAPOLATION:g}×" in warning


@pytest.mark.parametrize("cell, says", [
    ({"rungs": [], "train_flops_range": [1.0, 2.0]}, "trend"),
    ({"rungs": [], "trend": [1], "train_flops_range": [1.0, 2.0]}, "trend"),
    ({"rungs": [], "trend": {"slope": "a", "intercept": 0.0}, "train_flops_range": [1.0, 2.0]}, "slope"),
    ({"rungs": [], "trend": {"slope": 0.1, "intercept": 0.0, "dof": 2, "cov": [[1.0]]},
      "train_flops_range": [1.0, 2.0]}, "cov"),
    ({"rungs": [], "trend": {"slope": 0.1, "intercept": 0.0}, "train_flops_range": [2.0, 1.0]}, "train_flops_range"),
])
def test_a_malformed_cell_is_refused_naming_the_part(cell, says):
    with pytest.raises((KeyError, TypeError, ValueError), match=says):
        eg_at(cell, 1e20)
