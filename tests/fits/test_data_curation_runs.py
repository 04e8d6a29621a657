"""The shipped data-curation experiment's real runs (notebooks/fixtures/data_curation_runs.csv, 46 runs of
sweeps/data_curation.yaml) read through `ladder fit arms`: the method's two checks on real data. An arm with the
baseline's data and other seeds must hold EG = 1 at every rung and domain, and an arm with a quarter of the
unique tokens (four times the repetition) must lose compute outside its interval. Its calibration on four seeds
a side (notebooks/fixtures/data_curation_calibration_runs.csv, 24 runs of sweeps/data_curation_calibration.yaml,
12 of them the experiment's own) checks what the two-seed runs said about more seeds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ladder.cli import main

FIXTURE = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures" / "data_curation_runs.csv"
CALIBRATION = FIXTURE.with_name("data_curation_calibration_runs.csv")


def fit_arms(*extra: str, csv: Path = FIXTURE) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["fit", "arms", "--csv", str(csv), "--baseline", "baseline", "--floor", "auto", "--json",
                     *extra]) == 0
    return json.loads(out.getvalue())


def seed_noise_interval(result: dict, domain: str, cell: dict) -> list[float]:
    """A cell's EG interval from the seed noise alone, EG·exp(±t·σ·√(1/n_base + 1/n_arm)/s) (fits.eg_same_rung),
    from the JSON. Against the same rung on the calibrations' three rungs (L2-L4) the baseline's law has no
    interval (the one interval rule, docs/fits.md), so neither has the EG and the fit prints none; this is the
    part of the interval the seeds measure, the slope's part (zero for an arm whose EG is 1) left out."""

    from scipy import stats

    t = float(stats.t.ppf(0.5 + result["ci_level"] / 2, cell["seed_noise_dof"]))  # the cell's own: its rung's or pooled
    n_base, n_arm = cell["runs"]
    half = t * cell["seed_noise_log_sd"] * math.sqrt(1 / n_base + 1 / n_arm) / cell["local_slope"]
    return [cell["eg"] * math.exp(-half), cell["eg"] * math.exp(half)]


def no_interval_on_three_rungs(result: dict) -> None:
    """Every cell of a three-rung ladder against the same rung: no interval, and the law's note says why."""
    cells = [r for per in result["arms"].values() for cell in per.values() for r in cell["rungs"]]
    assert cells and all(r["interval"] is None and "3 distinct x" in r["interval_note"] for r in cells)


@pytest.fixture(scope="module")
def result():
    return fit_arms()


@pytest.fixture(scope="module")
def same_rung():
    """Against the same rung with the seed noise pooled over the rungs (`--seed-noise pooled`): the reading the
    calibrations below were first made with; each rung's own noise, the default, is tested further down."""
    return fit_arms("--against", "rung", "--seed-noise", "pooled")


def test_the_replica_holds_one_at_every_rung_and_domain(result):
    cells = [r for cell in result["arms"]["replica"].values() for r in cell["rungs"]]
    assert len(cells) == 7 * 3  # six domains and their mean, L2-L4
    assert all(r["interval"][0] <= 1 <= r["interval"][1] for r in cells)


def test_a_quarter_of_the_data_loses_compute_outside_its_interval(result):
    mean = {str(r["rung"]): r for r in result["arms"]["quarter"]["all"]["rungs"]}
    assert all(mean[L]["interval"][1] < 1 and mean[L]["verdict"] == "loss" for L in ("3", "4", "5", "6"))
    assert mean["2"]["eg"] < 1  # at L2 below 1, its interval reaching just above
    code = result["arms"]["quarter"]["code"]["rungs"]  # the source it repeats most (2.6 → 10 epochs)
    assert all(r["verdict"] == "loss" for r in code)


def test_the_curation_steps_measure_no_gain_in_the_mean_over_domains(result):
    for arm in ("dedup", "quality", "diverse"):
        cell = result["arms"][arm]["all"]
        assert [r["verdict"] for r in cell["rungs"]] == ["no measured gain"] * 5, arm
        assert cell["trend"]["verdict"] == "no measured trend", arm


def test_against_the_same_rung_the_checks_hold_with_narrower_intervals(result, same_rung):
    replica = [r for cell in same_rung["arms"]["replica"].values() for r in cell["rungs"]]
    assert all(r["interval"][0] <= 1 <= r["interval"][1] for r in replica)
    mean = same_rung["arms"]["replica"]["all"]["rungs"]
    law = result["arms"]["replica"]["all"]["rungs"]
    assert all((s["interval"][1] - s["interval"][0]) < (w["interval"][1] - w["interval"][0]) for s, w in zip(mean, law))
    assert all((r["interval"][1] - r["interval"][0]) / 2 < 0.15 for r in mean)  # seed noise alone: about ±13%
    quarter = same_rung["arms"]["quarter"]["all"]["rungs"]
    assert [r["verdict"] for r in quarter] == ["loss"] * 5
    assert same_rung["seed_noise"]["all"]["dof"] == 18  # 18 (arm, rung) pairs of two seeds at L2-L4, one dof each


def test_the_seeds_a_side_for_a_ten_percent_interval_are_four_on_this_ladder(same_rung):
    # ±10% with 2 seeds a side is below this ladder's seed noise (0.47% of log BPB, slope 0.077: ±12-13% in the mean over domains);
    # what the noise says it takes, in the mean over domains at every rung, with the range its own 18 dof allow
    cells = same_rung["arms"]["replica"]["all"]["rungs"]
    assert {(r["seeds_for_target"], tuple(r["seeds_for_target_range"])) for r in cells} == {(4, (2, 7))}
    assert same_rung["target_half_width"] == 0.10


def test_four_seeds_a_side_hold_one_and_measure_the_noise_the_two_seed_runs_allowed(same_rung):
    four = fit_arms("--against", "rung", "--seed-noise", "pooled", csv=CALIBRATION)
    assert sorted(four["arms"]) == ["replica"] and four["seed_noise"]["all"]["dof"] == 18  # 6 groups of 4 seeds
    no_interval_on_three_rungs(four)  # L2-L4: the baseline's law has no interval, so the EG has none
    cells = [seed_noise_interval(four, d, r) for d, cell in four["arms"]["replica"].items() for r in cell["rungs"]]
    assert len(cells) == 7 * 3 and all(lo <= 1 <= hi for lo, hi in cells)
    mean = [seed_noise_interval(four, "all", r) for r in four["arms"]["replica"]["all"]["rungs"]]
    two = same_rung["arms"]["replica"]["all"]["rungs"]
    # narrower than on two seeds, but not under ±10%: eight seeds a rung measure more noise (0.60%) than the
    # 18 pairs of the experiment did (0.47%), inside that estimate's 95% interval, and so name 6 seeds a side,
    # inside the 2-7 the two-seed runs allowed
    assert all(f[1] / f[0] < t["interval"][1] / t["interval"][0] for f, t in zip(mean, two))
    assert all(0.10 < (hi / lo) ** 0.5 - 1 < 0.13 for lo, hi in mean)
    mean = four["arms"]["replica"]["all"]["rungs"]
    lo, hi = same_rung["seed_noise"]["all"]["log_sd_interval"]
    assert lo < four["seed_noise"]["all"]["log_sd"] < hi
    assert all(f["seeds_for_target"] == 6 and t["seeds_for_target_range"][0] <= 6 <= t["seeds_for_target_range"][1]
               for f, t in zip(mean, two))


BATCH4 = FIXTURE.with_name("data_curation_calibration_batch4_runs.csv")  # four times the batch, same tokens


def test_four_times_the_batch_quiets_the_seeds_but_flattens_the_law_and_the_calibration_stays_wide(same_rung):
    """sweeps/data_curation_calibration_batch4.yaml: the 2-seed calibration at L2-L4 with four times the batch
    and a quarter of the steps. One seed's scatter falls (0.47% → 0.30%), the baseline's slope falls with it
    (0.077 → 0.052, the larger rungs trained worse), so noise over slope is about the same and the replica's
    intervals are no narrower (±15% on 6 dof)."""

    wide = fit_arms("--against", "rung", "--seed-noise", "pooled", csv=BATCH4)
    noise, base_noise = wide["seed_noise"]["all"], same_rung["seed_noise"]["all"]
    assert noise["dof"] == 6 and noise["log_sd"] == pytest.approx(0.00302, abs=1e-5)
    assert noise["log_sd"] < base_noise["log_sd"] == pytest.approx(0.0047, abs=1e-4)
    alpha, base_alpha = wide["baseline_laws"]["all"]["alpha"], same_rung["baseline_laws"]["all"]["alpha"]
    assert alpha == pytest.approx(0.0525, abs=5e-4) and base_alpha == pytest.approx(0.077, abs=1e-3)
    assert noise["log_sd"] / alpha == pytest.approx(base_noise["log_sd"] / base_alpha, rel=0.1)
    no_interval_on_three_rungs(wide)  # L2-L4: the seed-noise part of the intervals, below
    mean = [seed_noise_interval(wide, "all", r) for r in wide["arms"]["replica"]["all"]["rungs"]]
    assert all(lo <= 1 <= hi for lo, hi in mean)
    assert all(math.exp(math.log(hi / lo) / 2) - 1 == pytest.approx(0.151, abs=0.002) for lo, hi in mean)
    cells = [(d, r["rung"]) for d, cell in wide["arms"]["replica"].items() for r in cell["rungs"]
             if not seed_noise_interval(wide, d, r)[0] <= 1 <= seed_noise_interval(wide, d, r)[1]]
    assert cells == [("qa", 2)]  # one of 21 cells outside its 95% interval: what 95% allows


PAIRED = FIXTURE.with_name("data_curation_paired_runs.csv")  # the experiment + sweeps/data_curation_paired_calibration.yaml


def test_pairing_on_the_initialisation_leaves_the_orders_noise_and_the_reorder_arm_misses_at_l3():
    """The experiment's runs and the paired null (`reorder`: the baseline's data from the baseline's weights,
    seeds 0 and 1, in data orders 2 and 3, L2-L4), against the same rung, unpaired and paired on the seed (a block
    design: the residual of log BPB on arm and seed), the noise pooled over the rungs. Paired, the noise per run in the mean over domains is the
    data order's (0.41%, against 0.45% unpaired), it falls most in books, qa and web, and the reorder arm's
    intervals narrow from ±13% to ±12%. The reorder arm holds 1 at L2 and L4 and misses it at L3 either way:
    the baseline's seed-0 run at L3 sits high. Of the curation arms' verdicts in the mean only quality at L4
    changes (a gain at its interval's edge)."""
    plain = fit_arms("--against", "rung", "--seed-noise", "pooled", csv=PAIRED)
    paired = fit_arms("--against", "rung", "--pair-on", "seed", "--seed-noise", "pooled", csv=PAIRED)
    sd = {d: (plain["seed_noise"][d], paired["seed_noise"][d]) for d in plain["seed_noise"]}
    assert sd["all"][0]["dof"] == 21 and sd["all"][1]["dof"] == 15 and sd["all"][1]["paired_on"] == "seed"
    assert sd["all"][0]["log_sd"] == pytest.approx(0.00452, abs=1e-5)
    assert sd["all"][1]["log_sd"] == pytest.approx(0.00413, abs=1e-5)
    for domain, (before, after) in {"books": (0.0097, 0.0056), "qa": (0.0089, 0.0063), "web": (0.0048, 0.0035),
                                    "math": (0.0096, 0.0102)}.items():
        assert sd[domain][0]["log_sd"] == pytest.approx(before, abs=1e-4)
        assert sd[domain][1]["log_sd"] == pytest.approx(after, abs=1e-4)
    replica = paired["arms"]["replica"]["all"]
    assert not replica["rungs"] and "shares" in replica["trend"]["note"]  # on seeds 2, 3: nothing to pair
    missed = {}
    for label, out in (("plain", plain), ("paired", paired)):
        missed[label] = sorted((d, r["rung"]) for d, cell in out["arms"]["reorder"].items() for r in cell["rungs"]
                               if not r["interval"][0] <= 1 <= r["interval"][1])
    assert missed["plain"] == [("all", 3), ("code", 3), ("qa", 3)]
    assert missed["paired"] == [("all", 3), ("code", 3), ("qa", 3), ("web", 3)]
    changed = [(arm, p["rung"]) for arm in ("dedup", "quality", "diverse", "quarter")
               for u, p in zip(plain["arms"][arm]["all"]["rungs"], paired["arms"][arm]["all"]["rungs"])
               if u["verdict"] != p["verdict"]]
    assert changed == [("quality", 4)]
    half = [[math.sqrt(r["interval"][1] / r["interval"][0]) - 1 for r in out["arms"]["reorder"]["all"]["rungs"]]
            for out in (plain, paired)]
    assert all(0.125 < w < 0.135 for w in half[0]) and all(0.115 < w < 0.126 for w in half[1])


CALIBRATION6 = FIXTURE.with_name("data_curation_calibration6_runs.csv")  # sweeps/data_curation_calibration6.yaml


def test_against_the_same_rung_each_rung_has_its_own_noise_and_the_checks_hold_within_chance():
    """The experiment read with each rung's own seed noise (the default): L2-L4 from the six arms' two seeds
    there (6 dof each), L5-L6 (one seed an arm) borrowing their pool. The replica holds 1 in 19 of 21 cells
    (misses at L2 in the mean and in web, where the arms' seeds scatter least); the quarter control loses at every
    rung; quality at L4 is a gain at its edge."""
    out = fit_arms("--against", "rung")
    noise = out["seed_noise"]["all"]
    assert noise["rule"] == "rung" and noise["dof"] == 18
    assert {r: (round(100 * v["log_sd"], 2) if v["log_sd"] else None, v["dof"]) for r, v in noise["by_rung"].items()} \
        == {"2": (0.30, 6), "3": (0.68, 6), "4": (0.33, 6), "5": (None, 0), "6": (None, 0)}
    replica = out["arms"]["replica"]
    missed = sorted((d, r["rung"]) for d, cell in replica.items() for r in cell["rungs"]
                    if not r["interval"][0] <= 1 <= r["interval"][1])
    assert missed == [("all", 2), ("web", 2)] and sum(len(c["rungs"]) for c in replica.values()) == 21
    half = [round(100 * (math.sqrt(r["interval"][1] / r["interval"][0]) - 1)) for r in replica["all"]["rungs"]]
    assert half == [10, 24, 11]
    assert [(r["seeds_for_target"], r["seeds_for_target_range"]) for r in replica["all"]["rungs"]] == \
        [(2, [2, 7]), (8, [4, 33]), (3, [2, 9])]
    assert [r["verdict"] for r in out["arms"]["quarter"]["all"]["rungs"]] == ["loss"] * 5
    quality = out["arms"]["quality"]["all"]["rungs"]
    assert [r["verdict"] for r in quality] == ["no measured gain", "no measured gain", "gain", "no measured gain",
                                               "no measured gain"]
    high = [r for r in out["arms"]["diverse"]["all"]["rungs"] if r["rung"] >= 5]
    assert all(r["seed_noise_from"] == "pooled" and r["seed_noise_dof"] == 18 for r in high)


def test_six_seeds_a_side_reach_ten_percent_where_the_rungs_noise_allows_and_not_at_l3():
    """sweeps/data_curation_calibration6.yaml: twelve seeds of the baseline's data a rung at L2-L4. Each rung's
    noise on 10 dof: the replica's seed-noise half-width is ±7%, ±14%, ±5% in the mean over domains, and it holds
    1 in 19 of 21 cells (misses at L2, mean and web: its new seeds 10 and 11 both ended high); with one noise
    pooled over the rungs the half-width is ±8.5% everywhere and it misses 5 of 21, L3 among them."""
    own = fit_arms("--against", "rung", csv=CALIBRATION6)
    pooled = fit_arms("--against", "rung", "--seed-noise", "pooled", csv=CALIBRATION6)
    assert own["seed_noise"]["all"]["equal_across_rungs"]["p_value"] == pytest.approx(0.0184, abs=2e-4)
    # the scatter within each arm's six seeds (10 dof a rung), what the intervals use
    assert {r: (round(100 * n["log_sd"], 2), n["dof"]) for r, n in own["seed_noise"]["all"]["by_rung"].items()} == \
        {"2": (0.41, 10), "3": (0.77, 10), "4": (0.32, 10)}
    missed, half = {}, {}
    for label, out in (("own", own), ("pooled", pooled)):
        no_interval_on_three_rungs(out)
        cells = {(d, r["rung"]): seed_noise_interval(out, d, r) for d, c in out["arms"]["replica"].items()
                 for r in c["rungs"]}
        assert len(cells) == 21 and all(r["runs"] == [6, 6] for r in out["arms"]["replica"]["all"]["rungs"])
        missed[label] = sorted(k for k, (lo, hi) in cells.items() if not lo <= 1 <= hi)
        half[label] = [round(100 * (math.sqrt(cells["all", L][1] / cells["all", L][0]) - 1), 1) for L in (2, 3, 4)]
    assert missed["own"] == [("all", 2), ("web", 2)]
    assert missed["pooled"] == [("all", 2), ("all", 3), ("books", 3), ("math", 2), ("stem", 3)]
    assert half["own"] == [7.1, 13.7, 5.5] and half["pooled"] == [8.5, 8.5, 8.5]
    l3 = own["arms"]["replica"]["all"]["rungs"][1]
    assert (l3["seeds_for_target"], l3["seeds_for_target_range"]) == (10, [6, 28])


def test_the_rebuilt_quality_and_diverse_arms_keep_the_readings():
    """notebooks/fixtures/data_curation_rebuilt_runs.csv: the experiment's runs with the quality and diverse arms
    rerun as the curation builds them now (sweeps/data_curation_rebuilt.yaml). Against the same rung the quality
    filter still measures nothing at any rung in the mean over domains, diversity weighting still loses compute
    (outside 1 at L2, L4 and L6), the replica holds 1 at every rung and the quarter control loses at every rung."""
    import pandas as pd

    rebuilt = FIXTURE.with_name("data_curation_rebuilt_runs.csv")
    runs, first = pd.read_csv(rebuilt), pd.read_csv(FIXTURE)
    assert len(runs) == len(first) == 46
    for arm in ("quality", "diverse"):  # rerun: other runs, the same design
        assert not set(runs[runs.arm == arm].run_id) & set(first.run_id)
        assert sorted(zip(runs[runs.arm == arm].rung, runs[runs.arm == arm].seed)) == \
            sorted(zip(first[first.arm == arm].rung, first[first.arm == arm].seed))
    kept = ~runs.arm.isin(["quality", "diverse"])
    assert set(runs[kept].run_id) == set(first[~first.arm.isin(["quality", "diverse"])].run_id)
    result = fit_arms("--against", "rung", csv=rebuilt)

    def readings(arm: str) -> list[str]:
        return [r["verdict"] for r in result["arms"][arm]["all"]["rungs"]]

    assert set(readings("quality")) == {"no measured gain"}
    assert readings("diverse") == ["loss", "no measured gain", "loss", "no measured gain", "loss"]
    assert set(readings("replica")) == {"no measured gain"}
    assert set(readings("quarter")) == {"loss"}
    assert result["arms"]["diverse"]["all"]["trend"]["verdict"] == "no measured trend"


def test_two_seeds_at_every_rung_calibrate_the_replica_at_all_five():
    """notebooks/fixtures/data_curation_upper_runs.csv: the rebuilt experiment and sweeps/data_curation_upper.yaml's
    14 runs (every arm's second seed at L5-L6, the replica there too): two seeds an arm at every rung. Each rung's
    interval then has its own noise (none borrows the pool), the replica holds 1 at all five rungs in the mean
    over domains (32 of 35 cells), its interval is inside ±10% only where the rung's noise is small (L5), and the
    arms' noise is not shown to differ (the assumption of pooling them at a rung)."""
    import pandas as pd

    upper = FIXTURE.with_name("data_curation_upper_runs.csv")
    runs, rebuilt = pd.read_csv(upper), pd.read_csv(FIXTURE.with_name("data_curation_rebuilt_runs.csv"))
    assert len(runs) == 60 and list(runs.run_id[:46]) == list(rebuilt.run_id)
    new = runs.iloc[46:]
    assert set(new.rung) == {5, 6} and sorted(new[new.arm == "replica"].seed) == [2, 2, 3, 3]
    assert sorted(new[new.arm != "replica"].arm) == sorted(["baseline", "dedup", "quality", "diverse", "quarter"] * 2)
    assert (runs.groupby(["arm", "rung"]).size() == 2).all()
    result = fit_arms("--against", "rung", csv=upper)
    noise = result["seed_noise"]["all"]
    assert {r: n["dof"] for r, n in noise["by_rung"].items()} == {str(r): 6 for r in range(2, 7)}
    assert [round(100 * noise["by_rung"][str(r)]["log_sd"], 2) for r in range(2, 7)] == [0.38, 0.89, 0.35, 0.2, 0.65]
    assert noise["equal_across_arms"]["p_value"] == pytest.approx(0.082, abs=1e-3)
    replica = result["arms"]["replica"]
    cells = {(d, r["rung"]): r for d, per in replica.items() for r in per["rungs"]}
    assert len(cells) == 35 and all(r["seed_noise_from"] == "rung" for r in cells.values())
    missed = sorted(k for k, r in cells.items() if not r["interval"][0] <= 1 <= r["interval"][1])
    assert missed == [("books", 5), ("code", 4), ("web", 2)]
    half = [round(100 * (math.sqrt(cells["all", L]["interval"][1] / cells["all", L]["interval"][0]) - 1), 1)
            for L in range(2, 7)]
    assert half == [11.8, 29.6, 10.6, 6.0, 20.8]
    assert [cells["all", L]["seeds_for_target"] for L in range(2, 7)] == [3, 10, 3, 2, 6]

    def readings(arm: str) -> list[str]:
        return [r["verdict"] for r in result["arms"][arm]["all"]["rungs"]]

    assert readings("diverse") == ["loss", "no measured gain", "loss", "loss", "loss"]
    assert set(readings("quarter")) == {"loss"} and set(readings("dedup")) == {"no measured gain"}
    assert readings("quality") == ["no measured gain"] * 3 + ["loss", "no measured gain"]
    assert all(result["arms"][a]["all"]["trend"]["verdict"] == "no measured trend" for a in result["arms"])


def test_the_seeds_the_fit_names_bring_every_rung_inside_ten_percent():
    """notebooks/fixtures/data_curation_named_seeds_runs.csv: the calibration on the seeds the two-seed runs named
    for ±10% at L3 and L6 (10 and 6 a side; sweeps/data_curation_named_seeds.yaml's 16 runs), with the six-seed
    calibration at L2-L4 and the two seeds a side at L5. In the mean over domains every rung's replica interval
    is inside ±10% and holds 1 at four of five rungs: L2, the same runs as on six seeds, misses, and its miss
    turns the replica's trend into a false "grows with scale"."""
    import pandas as pd

    named = FIXTURE.with_name("data_curation_named_seeds_runs.csv")
    runs, six = pd.read_csv(named), pd.read_csv(FIXTURE.with_name("data_curation_calibration6_runs.csv"))
    upper = pd.read_csv(FIXTURE.with_name("data_curation_upper_runs.csv"))
    assert len(runs) == 60 and list(runs.run_id[:36]) == list(six.run_id)
    high = upper[upper.rung.isin([5, 6]) & upper.arm.isin(["baseline", "replica"])]
    assert list(runs.run_id[36:44]) == list(high.run_id)
    sides = runs.groupby(["rung", "arm"]).size().unstack()
    assert list(sides.baseline) == list(sides.replica) == [6, 10, 6, 2, 6]
    result = fit_arms("--against", "rung", csv=named)
    noise = result["seed_noise"]["all"]["by_rung"]
    assert [(round(100 * noise[str(r)]["log_sd"], 2), noise[str(r)]["dof"]) for r in range(2, 7)] == \
        [(0.41, 10), (0.71, 18), (0.32, 10), (0.14, 2), (0.26, 10)]
    cells = {(d, r["rung"]): r for d, per in result["arms"]["replica"].items() for r in per["rungs"]}
    half = [round(100 * (math.sqrt(cells["all", L]["interval"][1] / cells["all", L]["interval"][0]) - 1), 1)
            for L in range(2, 7)]
    assert half == [6.4, 8.1, 5.0, 7.2, 4.1] and max(half) < 10
    missed = sorted(k for k, r in cells.items() if not r["interval"][0] <= 1 <= r["interval"][1])
    assert missed == [("all", 2), ("math", 3), ("web", 2)]
    single = [math.sqrt(r["interval"][1] / r["interval"][0]) - 1 for (d, _), r in cells.items() if d != "all"]
    assert len(single) == 30 and sum(h <= 0.10 for h in single) == 13  # one domain alone needs more seeds
    trend = result["arms"]["replica"]["all"]["trend"]
    assert trend["verdict"] == "grows with scale" and trend["interval"][0] > 0
    assert cells["all", 3]["seeds_for_target"] == 8  # on 18 dof L3's noise names fewer than the 10 run
