"""EG against the same rung with runs paired on their seed (fits.eg_same_rung, `pair`): the estimate and its
noise computed by hand in float64, coverage on ladders whose seeds share an initialisation effect across arms,
the width it saves there against the unpaired reading of the same runs, and its refusals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fits.eg_same_rung import NO_PAIRS_NOTE, same_rung_gains
from fits.eg_scaling import eg_by_domain
from fits.errors import FitInputError

COMPUTE = np.geomspace(1e12, 4e13, 5)
A, ALPHA = 25.0, 0.08


def ladder(arms: dict, *, seeds=(0, 1), init_sd=0.0, stream_sd=0.003, rng=None) -> pd.DataFrame:
    """BPB = A·(factor·C)^−α · exp(u[rung, seed] + e): u the seed's initialisation effect, shared by every arm
    at that rung and seed (sd `init_sd`), e each run's own (sd `stream_sd`)."""
    rng = rng or np.random.default_rng(0)
    init = {(i, s): init_sd * rng.standard_normal() for i in range(len(COMPUTE)) for s in seeds}
    rows = []
    for name, factor in arms.items():
        for i, C in enumerate(COMPUTE):
            for s in seeds:
                y = A * (factor * C) ** -ALPHA * math.exp(init[i, s] + stream_sd * rng.standard_normal())
                rows.append({"arm": name, "rung": i + 2, "seed": s, "train_flops": C, "bpb": y})
    return pd.DataFrame(rows)


def test_the_paired_estimate_and_its_noise_are_the_formula_computed_by_hand():
    """Δ: the mean paired difference in float64; the noise: the residual of statsmodels' OLS of log BPB on arm and
    seed (a randomized block design) at each rung, pooled over the rungs; one rung unbalanced (a run missing)."""
    import statsmodels.formula.api as smf

    df = ladder({"baseline": 1.0, "b": 1.3, "c": 0.8}, seeds=(0, 1, 2), init_sd=0.01, rng=np.random.default_rng(2))
    df = df[~((df.arm == "c") & (df.rung == 4) & (df.seed == 2))].reset_index(drop=True)
    out = same_rung_gains(df, baseline="baseline", bootstrap=50, pair="seed", seed_noise="pooled")
    ssr, dof = 0.0, 0
    for _, runs in df.assign(log_bpb=np.log(df["bpb"])).groupby("rung"):
        fit = smf.ols("log_bpb ~ C(arm) + C(seed)", data=runs).fit()
        ssr, dof = ssr + float(fit.ssr), dof + int(fit.df_resid)
    assert dof == 19 and out["seed_noise"]["dof"] == 19 and out["seed_noise"]["paired_on"] == "seed"
    var_run = ssr / dof
    assert out["seed_noise"]["log_sd"] == pytest.approx(math.sqrt(var_run), rel=1e-9)
    base = df[df.arm == "baseline"].set_index(["rung", "seed"])["bpb"]
    t = stats.t.ppf(0.975, dof)
    for name in ("b", "c"):
        for row in out["arms"][name]:
            g = df[(df.arm == name) & (df.rung == row["rung"])]
            d = np.array([math.log(base[row["rung"], s]) - math.log(y) for s, y in zip(g["seed"], g["bpb"])])
            s = row["local_slope"]
            assert row["eg_flops"] == pytest.approx(math.exp(d.mean() / s), rel=1e-12)
            assert row["runs"] == [len(d), len(d)]
            lo, hi = row["eg_flops_interval"]
            se = math.log(hi / lo) / (2 * t)
            seed_part = row["eg_flops_interval_shares"]["seed_noise"] * se**2
            assert seed_part == pytest.approx(2 * var_run / len(d) / s**2, rel=1e-9)


def law_fitted_once_per_ladder(monkeypatch) -> None:
    """Makes `same_rung_gains` fit the baseline's law once for the paired and the unpaired reading of one ladder:
    the same baseline runs and fit options give the same law (the fit is deterministic), fitted twice otherwise."""
    import fits.eg_same_rung as eg

    fit, last = eg.baseline_law, {}

    def fitted_once(base: pd.DataFrame, x: str, y: str, **options):
        key = (base[x].to_numpy().tobytes(), base[y].to_numpy().tobytes(), repr(sorted(options.items())))
        if last.get("key") != key:
            last.update(key=key, law=fit(base, x, y, **options))
        return last["law"]

    monkeypatch.setattr(eg, "baseline_law", fitted_once)


@pytest.mark.slow
def test_paired_intervals_cover_at_their_level_and_are_narrower_where_the_seed_sets_the_weights(monkeypatch):
    law_fitted_once_per_ladder(monkeypatch)
    rng = np.random.default_rng(7)
    cover = total = 0
    ratios = []
    for _ in range(100):
        df = ladder({"baseline": 1.0, "same": 1.0, "b": 1.2}, init_sd=0.006, stream_sd=0.003, rng=rng)
        boot_seed = int(rng.integers(1 << 30))
        paired = same_rung_gains(df, baseline="baseline", bootstrap=30, seed=boot_seed, pair="seed", seed_noise="pooled")
        plain = same_rung_gains(df, baseline="baseline", bootstrap=30, seed=boot_seed, seed_noise="pooled")
        for name, truth in (("same", 1.0), ("b", 1.2)):
            for p, u in zip(paired["arms"][name], plain["arms"][name]):
                lo, hi = p["eg_flops_interval"]
                cover += lo <= truth <= hi
                total += 1
                ratios.append(math.log(hi / lo) / math.log(u["eg_flops_interval"][1] / u["eg_flops_interval"][0]))
    assert total == 1000
    assert 0.92 <= cover / total <= 0.98  # nominal 0.95; measured 0.937
    # Seed parts σ_e·√2 against √(σ_u² + σ_e²)·√2 (0.45), times t(10)/t(15) for the fewer degrees of freedom
    assert float(np.median(ratios)) < 0.6  # measured 0.446


def test_the_noise_interval_covers_at_its_level_though_every_arm_shares_the_baselines_runs():
    """The data-curation layout (a baseline and five arms, three rungs, seeds 0 and 1, a shared initialisation
    effect twice the runs' own noise): the per-run noise's χ² interval covers the true σ at its level. Pooling each
    arm's own pair differences counted the baseline's runs once per arm, claimed 15 degrees of freedom for about
    7.5, and covered 86%."""
    from fits.eg_same_rung import paired_variance, seed_sd_interval

    rng = np.random.default_rng(3)
    sigma, cover, trials = 0.005, 0, 2000
    arms = [f"a{i}" for i in range(5)]
    for _ in range(trials):
        blocks = []
        for _rung in range(3):
            init = 0.01 * rng.standard_normal(2)
            rows = [{"arm": a, "seed": s, "bpb": math.exp(init[s] + sigma * rng.standard_normal())}
                    for a in ["baseline", *arms] for s in (0, 1)]
            blocks.append(pd.DataFrame(rows))
        var, dof = paired_variance(blocks, arm="arm", pair="seed", y="bpb")
        assert dof == 15
        lo, hi = seed_sd_interval(math.sqrt(var), dof)
        cover += lo <= sigma <= hi
    assert 0.935 <= cover / trials <= 0.965


@pytest.mark.slow
def test_without_an_initialisation_effect_pairing_changes_the_width_by_its_degrees_of_freedom_only(monkeypatch):
    law_fitted_once_per_ladder(monkeypatch)
    rng = np.random.default_rng(9)
    ratios = []
    for _ in range(30):
        df = ladder({"baseline": 1.0, "same": 1.0, "b": 1.2}, init_sd=0.0, stream_sd=0.005, rng=rng)
        paired = same_rung_gains(df, baseline="baseline", bootstrap=30, pair="seed", seed_noise="pooled")
        plain = same_rung_gains(df, baseline="baseline", bootstrap=30, seed_noise="pooled")
        for p, u in zip(paired["arms"]["same"], plain["arms"]["same"]):
            ratios.append(math.log(p["eg_flops_interval"][1] / p["eg_flops_interval"][0])
                          / math.log(u["eg_flops_interval"][1] / u["eg_flops_interval"][0]))
    assert 0.85 < float(np.median(ratios)) < 1.3  # the same noise; t(10) against t(15)


def test_only_paired_runs_count_and_a_rung_without_a_pair_gives_no_eg():
    df = ladder({"baseline": 1.0, "b": 1.0}, seeds=(0, 1, 2), init_sd=0.005, rng=np.random.default_rng(4))
    df = df[~((df.arm == "baseline") & (df.seed == 2))]            # seed 2 of the arm pairs with nothing
    df.loc[(df.arm == "b") & (df.rung == 6), "seed"] += 10          # no pair at L6
    out = same_rung_gains(df, baseline="baseline", bootstrap=50, pair="seed")
    assert [r["rung"] for r in out["arms"]["b"]] == [2, 3, 4, 5]
    assert all(r["runs"] == [2, 2] for r in out["arms"]["b"])
    assert out["seed_noise"]["dof"] == 4


def test_no_cell_with_two_pairs_gives_no_interval_and_says_why():
    df = ladder({"baseline": 1.0, "b": 1.0}, seeds=(0,), rng=np.random.default_rng(1))
    out = same_rung_gains(df, baseline="baseline", bootstrap=50, pair="seed")
    assert all(r["eg_flops_interval"] is None and r["eg_flops_interval_note"] == NO_PAIRS_NOTE
               for r in out["arms"]["b"])


def test_a_missing_or_empty_pair_column_and_pairing_against_the_law_are_refused():
    df = ladder({"baseline": 1.0, "b": 1.0}, rng=np.random.default_rng(1))
    with pytest.raises(FitInputError, match="no column 'init'"):
        same_rung_gains(df, baseline="baseline", bootstrap=50, pair="init")
    holed = df.astype({"seed": float})
    holed.loc[3, "seed"] = np.nan
    with pytest.raises(FitInputError, match="1 run\\(s\\) have no 'seed'"):
        same_rung_gains(holed, baseline="baseline", bootstrap=50, pair="seed")
    with pytest.raises(FitInputError, match="1 run\\(s\\) have no 'seed'"):  # said once, not as every law failing
        eg_by_domain(holed, baseline="baseline", bootstrap=50, against="rung", pair="seed")
    twice = pd.concat([df, df[(df.arm == "b") & (df.rung == 2) & (df.seed == 0)]])
    with pytest.raises(FitInputError, match="arm 'b' has 2 runs at rung 2 with seed 0"):
        same_rung_gains(twice, baseline="baseline", bootstrap=50, pair="seed")
    apart = df.assign(seed=np.where(df.arm == "baseline", df.seed, df.seed + 10))
    with pytest.raises(FitInputError, match="no run of any arm shares a 'seed'"):
        same_rung_gains(apart, baseline="baseline", bootstrap=50, pair="seed")
    with pytest.raises(FitInputError, match="against the same rung only"):
        eg_by_domain(df, baseline="baseline", bootstrap=50, pair="seed")
