"""EG against the baseline's own runs at the same rung (fits.eg_same_rung): the formula computed by hand in
float64, its intervals' coverage on ladders drawn from a known law, and a misfit of the law at one rung (shared
by every arm) that moves the law-read EG and cancels in the same-rung one."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fits.eg_same_rung import local_slope, same_rung_gains, seed_sd_interval, seed_variance, seeds_for_half_width
from fits.eg_scaling import eg_by_domain
from fits.errors import FitInputError

COMPUTE = np.geomspace(1e12, 4e13, 5)
E, A, ALPHA = 0.0, 25.0, 0.08  # the nested law the demo ladder fits (floor auto)


def ladder(arms: dict, *, seeds=(0, 1), noise=0.005, rng=None, bump: dict | None = None) -> pd.DataFrame:
    """One row per (arm, rung, seed): BPB = law(arms[name] · C) · (1 + bump[rung]) · exp(noise · N(0, 1))."""
    rng = rng or np.random.default_rng(0)
    rows = []
    for name, factor in arms.items():
        for i, C in enumerate(COMPUTE):
            for seed in seeds:
                y = (E + A * (factor * C) ** -ALPHA) * (1 + (bump or {}).get(i + 2, 0.0))
                rows.append({"arm": name, "rung": i + 2, "seed": seed, "train_flops": C,
                             "bpb": y * math.exp(noise * rng.standard_normal())})
    return pd.DataFrame(rows)


def test_the_estimate_is_the_formula_computed_by_hand():
    df = ladder({"baseline": 1.0, "b": 1.3}, rng=np.random.default_rng(3))
    out = same_rung_gains(df, baseline="baseline", bootstrap=50)
    p = out["baseline_law_flops"]
    var, dof = 0.0, 0
    for _, g in df.groupby(["arm", "rung"]):
        logs = np.log(g["bpb"].to_numpy(np.float64))
        var += float(((logs - logs.mean()) ** 2).sum())
        dof += len(logs) - 1
    assert dof == 10 and out["seed_noise"]["dof"] == 10
    assert out["seed_noise"]["log_sd"] == pytest.approx(math.sqrt(var / dof), rel=1e-12)
    for row in out["arms"]["b"]:
        base = df[(df.arm == "baseline") & (df.rung == row["rung"])]
        arm = df[(df.arm == "b") & (df.rung == row["rung"])]
        C = float(base["train_flops"].mean())
        power = p["A"] * C ** -p["alpha"]
        s = p["alpha"] * power / (p["E"] + power)
        delta = float(np.log(base["bpb"]).mean() - np.log(arm["bpb"]).mean())
        assert row["eg_flops"] == pytest.approx(math.exp(delta / s), rel=1e-12)
        assert row["local_slope"] == pytest.approx(s, rel=1e-12)
        lo, hi = row["eg_flops_interval"]
        assert lo < row["eg_flops"] < hi
    # the fitted law is close to the true one, so the arm's 1.3 is recovered within its intervals
    assert all(r["eg_flops_interval"][0] < 1.3 < r["eg_flops_interval"][1] for r in out["arms"]["b"])


def test_intervals_cover_the_true_gain_at_their_level():
    rng = np.random.default_rng(11)
    cover = total = 0
    for _ in range(120):
        out = same_rung_gains(ladder({"baseline": 1.0, "same": 1.0, "b": 1.2}, rng=rng), baseline="baseline",
                              bootstrap=30, seed=int(rng.integers(1 << 30)))
        for name, truth in (("same", 1.0), ("b", 1.2)):
            for r in out["arms"][name]:
                lo, hi = r["eg_flops_interval"]
                cover += lo <= truth <= hi
                total += 1
    assert total == 1200
    assert 0.92 <= cover / total <= 0.98  # nominal 0.95; 1200 correlated cells


def test_a_misfit_of_the_law_at_one_rung_cancels_against_the_same_rung():
    df = ladder({"baseline": 1.0, "replica": 1.0}, noise=0.002, bump={3: 0.02}, rng=np.random.default_rng(5))
    by_law = eg_by_domain(df, baseline="baseline", bootstrap=100, floor="auto")
    by_rung = eg_by_domain(df, baseline="baseline", bootstrap=100, floor="auto", against="rung")
    law_l3 = next(r for r in by_law["arms"]["replica"]["all"]["rungs"] if r["rung"] == 3)
    rung_l3 = next(r for r in by_rung["arms"]["replica"]["all"]["rungs"] if r["rung"] == 3)
    assert law_l3["eg"] < 0.85  # the law passes below the bumped rung: every arm there reads as a loss
    assert rung_l3["interval"][0] <= 1 <= rung_l3["interval"][1] and abs(rung_l3["eg"] - 1) < 0.1
    assert by_rung["against"] == "rung" and by_rung["seed_noise"]["all"]["dof"] == 10


def test_without_repeated_seeds_there_is_no_interval_and_the_reason_is_given():
    df = ladder({"baseline": 1.0, "b": 1.3}, seeds=(0,))
    assert seed_variance(df, arm="arm", rung="rung", y="bpb") == (None, 0)
    rows = same_rung_gains(df, baseline="baseline", bootstrap=30)["arms"]["b"]
    assert all(r["eg_flops_interval"] is None and "repeated seeds" in r["eg_flops_interval_note"] for r in rows)


@pytest.mark.parametrize("rungs, bootstrap", [(4, 50), (5, 0)], ids=["four rungs", "no bootstrap"])
def test_where_the_baseline_law_has_no_interval_neither_has_the_eg_and_the_laws_note_says_why(rungs, bootstrap):
    """The one interval rule (docs/fits.md): against the same rung as against the law, an EG has an interval only
    where the baseline's law has one. It printed one with the slope's part set to zero."""
    from fits.efficiency import baseline_law

    df = ladder({"baseline": 1.0, "b": 1.3})
    df = df[df["rung"] < 2 + rungs]
    law = baseline_law(df[df["arm"] == "baseline"], "train_flops", "bpb", bootstrap=bootstrap, floor="auto")
    assert law.interval_note  # what the rule reads
    out = same_rung_gains(df, baseline="baseline", bootstrap=bootstrap, floor="auto")
    rows = out["arms"]["b"]
    assert len(rows) == rungs
    assert all(r["eg_flops_interval"] is None and r["eg_flops_interval_note"] == law.interval_note for r in rows)
    assert all(r["eg_flops"] == pytest.approx(1.3, rel=0.2) for r in rows)  # the estimate stays
    by_rung = eg_by_domain(df, baseline="baseline", bootstrap=bootstrap, floor="auto", against="rung")
    by_law = eg_by_domain(df, baseline="baseline", bootstrap=bootstrap, floor="auto")
    for out in (by_rung, by_law):
        cell = out["arms"]["b"]["all"]
        assert all(r["interval"] is None and r["verdict"] == "no interval" and r["interval_note"] == law.interval_note
                   for r in cell["rungs"])
        assert cell["trend"]["method"] == "ols"  # no rung interval to weight by, as against the law


def test_local_slope_is_the_log_derivative():
    C = 3e12

    def law(c: float) -> float:
        return 0.5 + 20.0 * c ** -0.1

    numeric = -(math.log(law(C * 1.0001)) - math.log(law(C / 1.0001))) / (2 * math.log(1.0001))
    assert local_slope(0.5, 20.0, 0.1, C) == pytest.approx(numeric, rel=1e-6)


def test_an_unknown_comparison_is_refused():
    with pytest.raises(FitInputError, match="against"):
        eg_by_domain(ladder({"baseline": 1.0, "b": 1.1}), baseline="baseline", against="median")


def test_seeds_for_a_width_is_the_interval_formula_solved_for_n():
    from scipy import stats

    sd, slope, groups = 0.0047, 0.077, 28  # the demo curation experiment's pooled noise, local slope, groups
    n = seeds_for_half_width(sd, slope, 0.10, groups=groups)

    def half(k: int) -> float:  # the seed-noise part of a k-a-side interval, t with the groups' dof at k seeds
        return math.expm1(stats.t.ppf(0.975, groups * (k - 1)) * sd * math.sqrt(2 / k) / slope)

    assert n == 4 and half(n) <= 0.10 < half(n - 1)
    narrow = seeds_for_half_width(sd, slope, 0.005, groups=groups)  # far past the start: found, not searched for
    assert narrow > 1000 and math.expm1(stats.t.ppf(0.975, groups * (narrow - 1)) * sd * math.sqrt(2 / narrow) / slope) \
        <= 0.005 < math.expm1(stats.t.ppf(0.975, groups * (narrow - 2)) * sd * math.sqrt(2 / (narrow - 1)) / slope)
    assert seeds_for_half_width(0.0, slope, 0.10, groups=groups) == 2  # no noise at all
    assert seeds_for_half_width(sd, slope, 0.20, groups=groups) == 2  # never fewer than two: one measures no noise
    assert seeds_for_half_width(sd, slope, 0.05, groups=groups) > n
    assert seeds_for_half_width(2 * sd, slope, 0.10, groups=groups) > n
    assert seeds_for_half_width(sd, 2 * slope, 0.10, groups=groups) < n
    assert seeds_for_half_width(sd, slope, 1e-6, groups=groups, most=100) is None
    for bad in ((-0.1, slope, 0.1), (sd, 0.0, 0.1), (sd, slope, 0.0)):
        with pytest.raises(ValueError):
            seeds_for_half_width(*bad, groups=groups)


def test_the_seeds_it_names_give_intervals_that_wide_on_ladders_drawn_with_that_noise():
    # Ladders from a known law and noise: the seeds a side the formula names for ±10% give intervals that
    # wide (the median over 12 ladders), one seed fewer does not. The width is the seed-noise part the formula
    # solves for, exp(t·σ·√(1/n_base + 1/n_arm)/s) − 1 from the measured noise and each cell's slope and runs
    # (without a bootstrap the law has no interval, so the EG prints none: the one interval rule)
    from scipy import stats

    noise, target = 0.005, 0.10
    n = seeds_for_half_width(noise, ALPHA, target, groups=10)  # E = 0: the local slope is α everywhere
    rng = np.random.default_rng(21)

    def median_half_width(k: int) -> float:
        widths = []
        for _ in range(12):
            out = same_rung_gains(ladder({"baseline": 1.0, "replica": 1.0}, seeds=range(k), noise=noise, rng=rng),
                                  baseline="baseline", bootstrap=0, seed_noise="pooled")
            sd, dof = out["seed_noise"]["log_sd"], out["seed_noise"]["dof"]
            t = stats.t.ppf(0.975, dof)
            assert all(r["eg_flops_interval"] is None for r in out["arms"]["replica"])
            widths += [math.exp(t * sd * math.sqrt(1 / r["runs"][0] + 1 / r["runs"][1]) / r["local_slope"]) - 1
                       for r in out["arms"]["replica"]]
        return float(np.median(widths))

    assert n == 4 and median_half_width(n) <= target < median_half_width(n - 1)
    # each cell names it from the measured noise, its rung's slope and the ladder's (arm, rung) groups (the
    # noise pooled over the rungs; each rung's own: tests/fits/test_rung_noise.py)
    out = same_rung_gains(ladder({"baseline": 1.0, "replica": 1.0, "b": 1.2}, noise=noise, rng=rng),
                          baseline="baseline", bootstrap=0, target_half_width=0.15, seed_noise="pooled")
    assert out["target_half_width"] == 0.15
    for r in out["arms"]["replica"] + out["arms"]["b"]:
        assert r["seeds_for_target"] == seeds_for_half_width(out["seed_noise"]["log_sd"], r["local_slope"], 0.15,
                                                             groups=15)
        ends = [seeds_for_half_width(sd, r["local_slope"], 0.15, groups=15)
                for sd in out["seed_noise"]["log_sd_interval"]]
        assert r["seeds_for_target_range"] == ends and ends[0] <= r["seeds_for_target"] <= ends[1]


def test_the_seed_noise_interval_is_chi_square_and_covers_at_its_level():
    from scipy import stats

    lo, hi = seed_sd_interval(0.005, 18)
    assert lo == pytest.approx(0.005 * math.sqrt(18 / stats.chi2.ppf(0.975, 18)), rel=1e-12)
    assert hi == pytest.approx(0.005 * math.sqrt(18 / stats.chi2.ppf(0.025, 18)), rel=1e-12)
    assert lo / 0.005 == pytest.approx(0.756, abs=1e-3) and hi / 0.005 == pytest.approx(1.479, abs=1e-3)
    # pooled sds of 9 groups of 3 draws (18 dof) from noise of sd 0.005: the interval holds 0.005 ~95% of the time
    rng = np.random.default_rng(4)
    draws = rng.normal(0.0, 0.005, size=(4000, 9, 3))
    sds = np.sqrt(((draws - draws.mean(axis=2, keepdims=True)) ** 2).sum(axis=(1, 2)) / 18)
    cover = np.mean([a <= 0.005 <= b for a, b in (seed_sd_interval(float(sd), 18) for sd in sds)])
    assert 0.94 <= cover <= 0.96
