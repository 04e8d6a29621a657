"""EG per arm, domain and rung, and its trend with scale (fits.eg_scaling), on run tables drawn from
known laws: an arm that is the baseline again, one shifted by a constant compute factor, one whose
shift grows with compute."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fits.eg_scaling import domain_columns, eg_by_domain, eg_trend, eg_verdict
from fits.errors import FitInputError

COMPUTE = np.geomspace(1e12, 4e13, 5)  # five rungs over 40x: the baseline law has intervals from five
DOMAINS = {"code": (0.8, 40.0, 0.12), "web": (1.0, 30.0, 0.10)}  # E, A, alpha


def law(domain: str, C):
    E, A, alpha = DOMAINS[domain]
    return E + A * np.asarray(C, dtype=float) ** (-alpha)


def runs_table(arms: dict, *, seeds=(0, 1), noise=0.003, rng_seed=0) -> pd.DataFrame:
    """One row per (arm, rung, seed): `arms[name](C)` is the compute at which the baseline's law gives
    the arm's loss (the identity for the baseline), so the arm's true EG at C is arms[name](C) / C."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for name, effective in arms.items():
        for i, C in enumerate(COMPUTE):
            for seed in seeds:
                row = {"arm": name, "rung": i + 2, "seed": seed, "train_flops": C}
                for domain in DOMAINS:
                    row[f"bpb_{domain}"] = float(law(domain, effective(C))) * (1 + noise * rng.standard_normal())
                    row[f"bpb_se_{domain}"] = 0.001
                row["bpb"] = np.mean([row[f"bpb_{d}"] for d in DOMAINS])
                rows.append(row)
    return pd.DataFrame(rows)


def test_domains_are_the_bpb_columns_and_not_their_standard_errors():
    df = runs_table({"baseline": lambda C: C}, seeds=(0,))
    assert domain_columns(df) == {"code": "bpb_code", "web": "bpb_web", "all": "bpb"}


def test_an_arm_equal_to_the_baseline_has_no_measured_gain():
    out = eg_by_domain(runs_table({"baseline": lambda C: C, "again": lambda C: C}), domains=["code", "web"])
    for domain in ("code", "web"):
        cell = out["arms"]["again"][domain]
        for r in cell["rungs"]:
            lo, hi = r["interval"]
            assert lo < 1 < hi and r["verdict"] == "no measured gain"
        lo, hi = cell["trend"]["interval"]
        assert lo < 0 < hi and cell["trend"]["verdict"] == "no measured trend"


def test_a_constant_compute_factor_is_recovered_with_a_flat_trend():
    k = 1.3
    out = eg_by_domain(runs_table({"baseline": lambda C: C, "dedup": lambda C: k * C}), domains=["code", "web"])
    for domain in ("code", "web"):
        cell = out["arms"]["dedup"][domain]
        for r in cell["rungs"]:
            lo, hi = r["interval"]
            assert lo < k < hi
            assert r["eg"] == pytest.approx(k, rel=0.2)
        trend = cell["trend"]
        assert trend["interval"][0] < 0 < trend["interval"][1]
        assert abs(trend["slope"]) < 0.1


def test_a_gain_growing_with_compute_has_its_slope_recovered():
    b, C0 = 0.15, COMPUTE[0]
    out = eg_by_domain(runs_table({"baseline": lambda C: C, "diverse": lambda C: C * (C / C0) ** b}, noise=0.001),
                       domains=["code"])
    trend = out["arms"]["diverse"]["code"]["trend"]
    lo, hi = trend["interval"]
    assert lo < b < hi and lo > 0
    assert trend["verdict"] == "grows with scale"
    assert trend["slope"] == pytest.approx(b, abs=0.05)
    assert trend["method"] == "gls" and trend["dof"] == 3


def test_the_trend_of_exact_points_is_their_slope_and_two_rungs_give_no_interval():
    x = np.log([1e12, 1e13, 1e14, 1e15])
    eg = np.exp(0.05 + 0.1 * x)
    intervals = [[v / 1.1, v * 1.1] for v in eg]
    t = eg_trend(x, eg, intervals)
    assert t["slope"] == pytest.approx(0.1, rel=1e-9)
    assert t["birge_ratio"] == 1.0  # exact points: the rungs' own intervals set the width, never less
    # The half-width: z · σ / sqrt(Σ w (x - x̄)²), σ = log(1.1²) / (2 z): with the Birge ratio at 1 the variance
    # is the rungs' σ alone, known for normal intervals, so the quantile is the normal one (quantile_dof None).
    from scipy import stats

    sigma = 2 * math.log(1.1) / (2 * stats.norm.ppf(0.975))
    se = sigma / math.sqrt(np.sum((x - x.mean()) ** 2))
    assert t["quantile_dof"] is None and t["dof"] == 2
    assert t["interval"][1] - t["slope"] == pytest.approx(stats.norm.ppf(0.975) * se, rel=1e-9)
    # three rungs: one residual dof cannot check the line, so the quantile stays Student-t on n − 2 = 1
    three = eg_trend(x[:3], eg[:3], intervals[:3])
    se3 = sigma / math.sqrt(np.sum((x[:3] - x[:3].mean()) ** 2))
    assert three["quantile_dof"] == 1 and three["interval"][1] - three["slope"] == pytest.approx(
        stats.t.ppf(0.975, 1) * se3, rel=1e-9)
    two = eg_trend(x[:2], eg[:2], intervals[:2])
    assert two["slope"] == pytest.approx(0.1, rel=1e-9) and two["interval"] is None
    unweighted = eg_trend(x[:3], eg[:3] * np.array([1.0, 1.02, 1.0]), [None, None, None])
    assert unweighted["method"] == "ols" and unweighted["interval"][0] < unweighted["slope"] < unweighted["interval"][1]


def test_verdicts_of_an_interval():
    assert eg_verdict([1.01, 1.2]) == "gain"
    assert eg_verdict([0.8, 0.99]) == "loss"
    assert eg_verdict([0.9, 1.1]) == "no measured gain"
    assert eg_verdict(None) == "no interval"


def test_bad_inputs_are_named():
    df = runs_table({"baseline": lambda C: C, "x": lambda C: C}, seeds=(0,))
    with pytest.raises(FitInputError, match="unknown domains"):
        eg_by_domain(df, domains=["maths"])
    with pytest.raises(FitInputError, match="baseline"):
        eg_by_domain(df, baseline="none", domains=["code"])
    with pytest.raises(FitInputError, match="bpb_<domain>"):
        eg_by_domain(df[["arm", "rung", "train_flops"]])


def test_a_domain_without_baseline_runs_is_an_error_of_that_domain_and_the_others_are_fitted():
    """The docstring's promise: a domain whose baseline law cannot be fitted is said, the others go on.
    Here the baseline has no code BPB at all (it re-raised "no rows with arm == 'baseline'" for every domain)."""
    df = runs_table({"baseline": lambda C: C, "dedup": lambda C: 1.3 * C})
    df.loc[df["arm"] == "baseline", "bpb_code"] = np.nan
    out = eg_by_domain(df, bootstrap=50)
    assert out["domains"] == ["web", "all"] and list(out["errors"]) == ["code"]
    assert "bpb_code" in out["errors"]["code"] and "empty in every 'baseline' run" in out["errors"]["code"]
    assert sorted(out["arms"]["dedup"]) == ["all", "web"]
    assert all(r["interval"][0] < 1.3 < r["interval"][1] for r in out["arms"]["dedup"]["web"]["rungs"])
    # against the same rung the same; a domain alone fails as before, naming the domain's column
    assert list(eg_by_domain(df, bootstrap=50, against="rung")["errors"]) == ["code"]
    with pytest.raises(FitInputError, match="bpb_code"):
        eg_by_domain(df, bootstrap=50, domains=["code"])
    # what every domain shares still refuses the table, once
    with pytest.raises(FitInputError, match="missing"):
        eg_by_domain(df.drop(columns="rung"), bootstrap=50)


def test_the_trend_weights_each_rung_by_its_own_student_t_interval():
    """σ_i = (log hi − log lo) / (2·t), t the quantile of the rung's interval (the module docstring): a t(ν)
    interval read with the normal z overstated σ by t/z and, with the Birge ratio floored at 1, the slope's
    standard error with it. Checked against a weighted least-squares fit computed here from the intervals."""
    from scipy import stats

    x = np.log([1e12, 3e12, 1e13, 3e13, 1e14])
    eg = np.exp(0.02 + 0.01 * x)  # on a line: χ² is 0, so the Birge ratio is 1 and the weights set the width
    half = np.array([0.10, 0.15, 0.12, 0.20, 0.25])  # each rung's half-width in log EG
    dofs = [15.0, 4.0, 15.0, None, 9.0]  # None: a normal (bootstrap percentile) interval
    intervals = [[v * math.exp(-h), v * math.exp(h)] for v, h in zip(eg, half)]
    trend = eg_trend(x, eg, intervals, interval_dofs=dofs)
    q = [stats.norm.ppf(0.975) if d is None else stats.t.ppf(0.975, d) for d in dofs]
    w = 1 / (half / np.array(q)) ** 2
    design = np.column_stack([np.ones_like(x), x])
    cov = np.linalg.inv(design.T @ (w[:, None] * design))
    assert trend["weights"] == pytest.approx(w.tolist(), rel=1e-12)
    assert trend["birge_ratio"] == 1.0 and trend["slope"] == pytest.approx(0.01, rel=1e-9)
    assert trend["se"] == pytest.approx(math.sqrt(cov[1, 1]), rel=1e-9)
    assert np.allclose(trend["cov"], cov, rtol=1e-9, atol=0)
    # The quantile's dof: Welch-Satterthwaite over the rungs' shares c_i = w_i²σ_i² of the slope's variance, the
    # rungs' σ taken as possibly sharing one estimate (no noise_groups): (Σ c)² / (Σ c_i/√ν_i)², the normal
    # rung adding nothing; with each rung's σ its own (distinct groups), the usual (Σ c)² / Σ c_i²/ν_i.
    slope_w = (cov @ design.T * w)[1]
    c = slope_w**2 / w
    nu = np.array([math.inf if d is None else d for d in dofs])
    shared, own = c.sum() ** 2 / np.sum(c / np.sqrt(nu)) ** 2, c.sum() ** 2 / np.sum(c**2 / nu)
    assert trend["quantile_dof"] == pytest.approx(shared, rel=1e-9) and 4 < shared < own
    assert trend["interval"][1] - trend["slope"] == pytest.approx(stats.t.ppf(0.975, shared) * math.sqrt(cov[1, 1]),
                                                                  rel=1e-9)
    apart = eg_trend(x, eg, intervals, interval_dofs=dofs, noise_groups=list(range(5)))
    assert apart["quantile_dof"] == pytest.approx(own, rel=1e-9) and apart["se"] == trend["se"]
    with pytest.raises(FitInputError, match="one per rung"):
        eg_trend(x, eg, intervals, interval_dofs=dofs[:2])


def test_eg_by_domain_gives_the_trend_each_rungs_interval_dof():
    """Against the law each rung's EG interval is Student-t at the baseline law's prediction model's dof
    (`efficiency_gains`), against the same rung at its rung's seed noise's (or the pooled noise's, with
    seed_noise="pooled"): the trend reads each rung's σ with that t, not with z."""
    from scipy import stats

    from fits.efficiency import baseline_law, efficiency_gains

    df = runs_table({"baseline": lambda C: C, "dedup": lambda C: 1.3 * C})
    law_dof = baseline_law(df[df["arm"] == "baseline"], "train_flops", "bpb_code", bootstrap=50).prediction_model.dof
    # (arm, rung) pairs of two seeds, one dof each: 2 arms at a rung, 2 arms × 5 rungs pooled
    for against, dof, extra in (("law", law_dof, {}), ("rung", 2, {}), ("rung", 10, {"seed_noise": "pooled"})):
        cell = eg_by_domain(df, domains=["code"], bootstrap=50, against=against, **extra)["arms"]["dedup"]["code"]
        t = stats.t.ppf(0.975, dof)
        sigma = [(math.log(r["interval"][1]) - math.log(r["interval"][0])) / (2 * t) for r in cell["rungs"]]
        assert cell["trend"]["weights"] == pytest.approx([1 / s**2 for s in sigma], rel=1e-9), against
    rows = efficiency_gains(df, y="bpb_code", wall=None, bootstrap=50)["arms"]["dedup"]
    assert [r["eg_flops_interval_dof"] for r in rows] == [law_dof] * len(rows)  # what the trend is given
