"""The analysis helpers a notebook calls (resolution, time left, card fields, LR/WD surfaces) on edge input:
bad values are refused by a typed error naming the field or column, never turned into a silent number."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fits.errors import FitInputError
from ladder.analysis.demo import fit_lr_wd_surfaces
from ladder.analysis.recipe_card import data_position, human_count
from ladder.analysis.resolution import ladder_resolution, suggestions, top_rung_half_width
from ladder.analysis.sweep_eta import SweepEta, _minutes
from ladder.errors import LadderInputError

DEMO_FLOPS = [1.770283008e11, 6.462934733e11, 1.835443814e12, 3.896116224e12, 7.770736927e12, 1.325465468e13]


def test_flops_written_as_text_are_refused_not_sorted_as_text():
    # sorted as text, "1.3e13" would come before "1.7e11": the wrong rung would be the top
    with pytest.raises(LadderInputError) as info:
        top_rung_half_width([str(f) for f in DEMO_FLOPS], [1] * 6)
    assert info.value.field == "flops"


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_a_rung_without_positive_finite_flops_is_refused(bad):
    with pytest.raises(LadderInputError) as info:
        top_rung_half_width(DEMO_FLOPS[:5] + [bad], [1] * 6)
    assert info.value.field == "flops" and "rung 5" in str(info.value)


@pytest.mark.parametrize("seeds", [[1, 0, 1, 1, 1, 1], [1] * 5 + [0], [1, -1, 1, 1, 1, 1], [1.7] * 6, [1] * 5])
def test_seed_counts_that_are_not_one_whole_number_per_rung_are_refused(seeds):
    # zero seeds on a fitted rung used to shrink the dof silently; on the top it gave an infinite width
    with pytest.raises(LadderInputError) as info:
        top_rung_half_width(DEMO_FLOPS, seeds)
    assert info.value.field == "seeds"


def test_too_few_rungs_or_one_compute_below_the_top_is_a_typed_error():
    with pytest.raises(LadderInputError, match="3 below the top"):
        top_rung_half_width(DEMO_FLOPS[:3], [1] * 3)
    with pytest.raises(LadderInputError, match="distinct computes") as info:
        top_rung_half_width([DEMO_FLOPS[0]] * 5 + [DEMO_FLOPS[-1]], [1] * 6)  # a singular matrix before
    assert info.value.field == "flops"


def test_unsorted_rungs_give_the_sorted_ladders_width():
    order = [3, 0, 5, 1, 4, 2]
    seeds = [2, 1, 3, 1, 2, 1]
    shuffled = top_rung_half_width([DEMO_FLOPS[i] for i in order], [seeds[i] for i in order])
    assert shuffled["half_width"] == pytest.approx(top_rung_half_width(DEMO_FLOPS, seeds)["half_width"], rel=1e-12)
    assert shuffled["top_seeds"] == 1 and shuffled["runs_fitted"] == 9


@pytest.mark.parametrize("target", [0, -0.02, 1.0, math.nan, "2%"])
def test_a_target_width_outside_zero_to_one_is_refused(target):
    trials = [{"key": str(i), "block": "ladder", "L": i, "train_flops": f, "tpp": 5.0, "arm": "base", "at_law": True}
              for i, f in enumerate(DEMO_FLOPS)]
    with pytest.raises(LadderInputError) as info:
        suggestions(DEMO_FLOPS, [1] * 6, target)
    assert info.value.field == "target"
    with pytest.raises(LadderInputError):  # before: "±-2.0% is out of reach"
        ladder_resolution(trials, target=target)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -1.0, "1e12", None])
def test_time_left_refuses_bad_flops_before_the_sweep_starts(bad):
    with pytest.raises(LadderInputError) as info:
        SweepEta({"ladder L2 s0": 1e12, "ladder L3 s0": bad}, lambda m: None, clock=Clock())
    assert info.value.field == "flops_by_label" and "ladder L3 s0" in str(info.value)


def test_time_left_just_under_a_minute_is_not_shown_as_sixty_seconds():
    assert _minutes(59.6) == "1.0 min" and _minutes(59.4) == "59 s" and _minutes(90) == "1.5 min"
    clock, seen = Clock(), []
    eta = SweepEta({"a": 1.0, "b": 1.0}, seen.append, clock=clock)
    eta.start()
    clock.now = 59.7
    eta("[1/2] done     a bpb 1.0000 (60 s)")
    assert seen[-1].endswith("; elapsed 1.0 min, about 1.0 min left")


@pytest.mark.parametrize("n, text", [(999_950, "1M"), (999.6, "1k"), (999_499, "999k"), (1_234_567, "1.23M"),
                                     (-999_950, "-1M"), (999.4, "999"), (math.inf, "inf"), (math.nan, "nan")])
def test_a_count_takes_the_unit_of_its_rounded_value(n, text):
    assert human_count(n) == text  # was "1e+03k" at a unit's edge and "infT" for inf


@pytest.mark.parametrize("x_range", [[math.nan, math.nan], [1e13, 1e11], [1e11], ["1e11", "1e13"], None, [0.0, 1e13]])
def test_a_bad_fitted_range_is_refused_not_read_as_inside(x_range):
    with pytest.raises(LadderInputError) as info:
        data_position(1e12, x_range)
    assert info.value.field == "x_range"


def test_a_bad_target_compute_is_refused_not_read_as_inside():
    with pytest.raises(LadderInputError) as info:
        data_position(math.nan, [1e11, 1e13])
    assert info.value.field == "train_flops"
    assert data_position(1e12, (1e11, 1e13))["data_position"] == "inside"
    assert data_position(2e13, np.array([1e11, 1e13]))["data_position"] == "beyond"


def lr_wd_grid() -> pd.DataFrame:
    grid = pd.DataFrame([(lr, wd) for lr in (0.003, 0.01, 0.03) for wd in (0.03, 0.1, 0.3)], columns=["lr", "wd"])
    grid["bpb"] = 2 + 0.01 * np.log(grid.lr / 0.01) ** 2 + 0.01 * np.log(grid.lr * grid.wd / 0.001) ** 2
    return grid.assign(train_flops=1e12, params_active=1e6, steps=100, tpp=5.0)


@pytest.mark.parametrize("column", ["wd", "params_active", "steps", "tpp"])
def test_surfaces_name_a_missing_column(column):
    with pytest.raises(FitInputError) as info:
        fit_lr_wd_surfaces(lr_wd_grid().drop(columns=column))
    assert info.value.column == column


def test_surfaces_read_numbers_written_as_text_and_name_other_text():
    grid = lr_wd_grid()
    surfaces, errors = fit_lr_wd_surfaces(grid.assign(lr=grid["lr"].astype(str)))
    assert len(surfaces) == 1 and not errors
    assert surfaces[0].optimum_natural()["lr"] == pytest.approx(0.01, rel=1e-6)
    with pytest.raises(FitInputError, match="'fast'") as info:
        fit_lr_wd_surfaces(grid.assign(wd=["fast"] + [0.1] * 8))
    assert info.value.column == "wd"


def test_the_rungs_suggestion_says_seeds_in_the_plural():
    from ladder.analysis.resolution import describe

    flops = [1e11, 3e11, 1e12, 3e12, 1e13]
    trials = [{"key": f"{i}-{s}", "block": "ladder", "L": i, "train_flops": f, "tpp": 5.0, "arm": "base", "at_law": True}
              for i, f in enumerate(flops) for s in range(2)]
    res = ladder_resolution(trials, target=0.02)
    k = res["suggest"]["rungs_same_span"]
    wide = lambda n: top_rung_half_width(list(np.geomspace(1e11, 1e13, n)), [2] * n)["half_width"]  # noqa: E731
    assert wide(k) <= 0.02 < wide(k - 1)  # the fewest rungs, two seeds each, that reach ±2%
    assert f"{k} rungs over the same compute (2 seeds each)" in describe(res)


def test_report_numbers_take_their_form_from_the_value_as_rounded():
    from ladder.analysis.report import _fmt

    assert _fmt(999999.9) == _fmt(1e6) == "1.000e+06"
    assert _fmt(0.00099996) == "0.001" and _fmt(123.456) == "123.5" and _fmt(0.0) == "0"
