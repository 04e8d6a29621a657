"""One rule for which runs a compute law is fitted on, one set of per-domain results, and the one
protocol every fit result keeps (frozen, built once, conf_int from the stored draws)."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from fits.compute_laws import PowerLawSet, fit_power_laws, select_runs
from fits.errors import FitInputError
from fits.results import LawResult

E, A, ALPHA = 0.8, 60.0, 0.12
FLOPS = np.geomspace(1e12, 5e13, 5)


def law(c):
    return E + A * np.asarray(c) ** -ALPHA


def sweep_table() -> pd.DataFrame:
    """A ladder exactly on the law, plus a noisy 3x3 LR/WD grid on the two smallest rungs (the demo's
    layout): the grid's best run sits below the law there, as the best of nine noisy runs does."""
    rng = np.random.default_rng(0)
    rows = [{"block": "ladder", "train_flops": c, "bpb": law(c)} for c in FLOPS]
    for c in FLOPS[:2]:
        rows += [{"block": "lr_wd", "train_flops": c, "bpb": law(c) * np.exp(rng.normal(0.0, 0.01))} for _ in range(9)]
    df = pd.DataFrame(rows)
    df["run_id"] = [f"r{i}" for i in range(len(df))]
    return df


def test_the_default_fits_the_ladder_block_and_recovers_the_law_the_best_run_per_compute_biases():
    table = sweep_table()
    ladder = fit_power_laws(table, group=None)
    assert ladder.selection["rule"] == "ladder" and ladder.selection["n_rows"] == 5
    assert ladder.laws["bpb"].params["alpha"] == pytest.approx(ALPHA, rel=1e-4)
    best = fit_power_laws(table, group=None, select="best")
    assert best.selection["n_rows"] == 5
    # best-of-9 at the two smallest rungs pulls them down: a flatter law, alpha well below the truth
    assert best.laws["bpb"].params["alpha"] < 0.97 * ALPHA
    assert fit_power_laws(table, group=None, select="all").selection["n_rows"] == len(table)


def test_selection_rules_on_tables_with_and_without_blocks():
    table = sweep_table()
    chosen, info = select_runs(table.drop(columns="block"), "train_flops", "bpb")
    assert len(chosen) == len(table) and "every row is the ladder" in info["description"]
    best, _ = select_runs(table, "train_flops", "bpb", select="best")
    assert (best.groupby("train_flops")["bpb"].min() == table.groupby("train_flops")["bpb"].min()).all()
    with pytest.raises(FitInputError, match="no rows of the 'ladder' block.*'lr_wd'"):
        select_runs(table[table["block"] != "ladder"], "train_flops", "bpb")
    with pytest.raises(FitInputError, match="select must be one of"):
        select_runs(table, "train_flops", "bpb", select="frontier")


def test_a_set_keeps_each_groups_reason_and_does_not_depend_on_row_order():
    flops = np.repeat(FLOPS, 3)
    noise = np.tile([-0.004, 0.0, 0.004], 5)
    df = pd.concat([pd.DataFrame({"domain": "code", "train_flops": flops, "bpb": law(flops) * np.exp(noise)}),
                    pd.DataFrame({"domain": "math", "train_flops": flops, "bpb": 40.0 * flops ** -0.07 * np.exp(noise)})],
                   ignore_index=True)
    df["run_id"] = [f"r{i}" for i in range(len(df))]
    laws = fit_power_laws(df, bootstrap=100)
    assert isinstance(laws, PowerLawSet) and isinstance(laws, LawResult)
    assert laws.names == ("code", "math") and set(laws.laws) == {"code"}
    assert "no loss floor" in laws.reasons["math"] and laws.to_dict()["not_fitted"]["math"] == laws.reasons["math"]
    assert len(laws.rows_of("math")) == 15
    shuffled = fit_power_laws(df.sample(frac=1.0, random_state=3), bootstrap=100)
    assert shuffled.laws["code"].ci == laws.laws["code"].ci  # same runs, same law, whatever their order
    assert laws.conf_int()["code"] == laws.laws["code"].ci
    assert "1 of 2 compute laws fitted" in laws.summary()
    with pytest.raises(FitInputError, match="non-numeric"):
        fit_power_laws(df.assign(bpb="x"))


def test_fit_results_are_frozen_and_read_intervals_off_their_draws():
    fit = fit_power_laws(sweep_table(), group=None, select="all", bootstrap=200).laws["bpb"]
    assert isinstance(fit, LawResult) and fit.n_bootstrap > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.ci = {}
    assert fit.conf_int() == fit.ci  # at its own level: the reported interval
    wide, narrow = fit.conf_int(0.99)["alpha"], fit.conf_int(0.5)["alpha"]
    assert wide[0] < narrow[0] < fit.params["alpha"] < narrow[1] < wide[1]
    four_rungs = sweep_table()[lambda t: t["train_flops"] < FLOPS[-1]]
    few = fit_power_laws(four_rungs, group=None, select="all", bootstrap=200).laws["bpb"]
    assert few.ci == {} and not few.extra["interval"]["available"]
    with pytest.raises(ValueError, match="interval not available"):
        few.conf_int()


def test_the_floor_rule_refuses_falls_back_to_or_assumes_the_nested_law():
    """floor 'fit' (the default) refuses an E that runs to zero, naming the way out; 'auto' keeps the
    nested law A·C^−α there and leaves a real floor alone; 'zero' fixes E = 0 in the fit and every
    resample: on pure power-law data (noise inside Huber's quadratic arm) it is least squares of log y
    on log C, checked against numpy's polyfit."""
    from fits.errors import FitBoundaryError

    rng = np.random.default_rng(2)
    flops = np.repeat(FLOPS, 2)
    no_floor = pd.DataFrame({"train_flops": flops, "bpb": 40.0 * flops ** -0.07 * np.exp(rng.normal(0, 1e-4, 10))})
    refused = fit_power_laws(no_floor, group=None)
    err = refused.errors["bpb"]
    assert isinstance(err, FitBoundaryError) and err.parameter == "log E" and "floor 'auto'" in str(err)
    auto = fit_power_laws(no_floor, group=None, floor="auto")
    law_auto = auto.laws["bpb"]
    assert law_auto.extra["floor_at_zero"] and law_auto.params["E"] == 0.0 and auto.selection["floor"]["rule"] == "auto"
    zero = fit_power_laws(no_floor, group=None, floor="zero", bootstrap=100).laws["bpb"]
    slope, intercept = np.polyfit(np.log(flops), np.log(no_floor["bpb"]), 1)
    assert zero.params["alpha"] == pytest.approx(-slope, rel=1e-5) and zero.params["A"] == pytest.approx(
        np.exp(intercept), rel=1e-4)
    assert law_auto.params["alpha"] == pytest.approx(zero.params["alpha"], rel=1e-5)
    assert np.all(zero.bootstrap_column("E") == 0.0) and zero.conf_int()["E"] == (0.0, 0.0)
    assert zero.options["floor"] == "zero" and zero.options["zero_floor"]

    floored = sweep_table()[lambda t: t["block"] == "ladder"]
    assert fit_power_laws(floored, group=None, floor="auto").laws["bpb"].params["E"] == pytest.approx(E, rel=1e-3)
    assumed = fit_power_laws(floored, group=None, floor="zero").laws["bpb"]
    free = fit_power_laws(floored, group=None).laws["bpb"]
    assert assumed.params["E"] == 0.0 and assumed.extra["floor_at_zero"] and assumed.objective > 10 * free.objective
    with pytest.raises(FitInputError, match="floor must be one of"):
        fit_power_laws(floored, group=None, floor="none")


def test_a_run_listed_twice_is_refused_not_taken_for_a_repeated_seed():
    """Two exports concatenated doubled every rung: a seed scatter of exactly 0 that narrowed the demo's code interval
    from ±2.5% to ±1.5%, exit 0."""
    from pathlib import Path

    from ladder.run.mlflow_runs import long_by_domain

    runs = pd.read_csv(Path(__file__).parents[2] / "notebooks" / "fixtures" / "demo_runs.csv")
    long = long_by_domain(runs)
    fit_power_laws(long, floor="auto", bootstrap=0)  # one row per run and domain: fine
    with pytest.raises(FitInputError, match=r"run '.*' appears 2 times \(group 'books'\)"):
        fit_power_laws(pd.concat([long, long], ignore_index=True), floor="auto", bootstrap=0)


def test_select_best_refuses_a_run_without_compute_as_the_other_rules_do():
    df = pd.DataFrame({"train_flops": [1e12, 2e12, 4e12, 8e12, np.nan], "bpb": [3.0, 2.8, 2.6, 2.5, 2.0]})
    for select in ("all", "best"):  # best dropped it unseen, the lowest BPB in the table
        with pytest.raises(FitInputError, match="missing or non-finite"):
            fit_power_laws(df, group=None, select=select, floor="auto", bootstrap=0)
