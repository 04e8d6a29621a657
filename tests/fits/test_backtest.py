"""Held-out-rung and progressive backtests."""

import numpy as np
import pandas as pd
import pytest

from fits.backtest import holdout_backtest, progressive_backtest
from fits.errors import FitInputError


def ladder(seed=0, noise=0.003):
    rng = np.random.default_rng(seed)
    C = np.repeat(np.geomspace(1e18, 1e21, 6), 3)
    return pd.DataFrame({"train_flops": C, "bpb": (0.6 + 35 * C**-0.08) * np.exp(rng.normal(0, noise, len(C)))})


def test_holdout_predicts_the_top_rung_within_its_interval():
    df = ladder()
    bt = holdout_backtest(df, holdout_top=1, bootstrap=300)
    assert bt["n_train"] == 15 and len(bt["predictions"]) == 1
    row = bt["predictions"][0]
    assert row["x"] == pytest.approx(1e21)
    assert row["lo"] < row["predicted"] < row["hi"]
    assert abs(row["rel_error"]) < 0.01 and row["inside"]
    # the error is measured against the rung's own mean, not a re-fit including it
    assert row["actual"] == pytest.approx(df[df.train_flops == df.train_flops.max()].bpb.mean())


def test_holdout_flags_a_top_rung_that_breaks_the_law():
    df = ladder()
    df.loc[df.train_flops == df.train_flops.max(), "bpb"] *= 1.05  # a regression at the top rung
    bt = holdout_backtest(df, holdout_top=1, bootstrap=300)
    assert not bt["all_inside"] and bt["predictions"][0]["rel_error"] < -0.03


def test_progressive_backtest_adds_rungs_one_at_a_time():
    bt = progressive_backtest(ladder(), bootstrap=100)
    assert [s["n_rungs_fitted"] for s in bt["steps"]] == [3, 4, 5]
    assert abs(bt["steps"][-1]["rel_error"]) < 0.01


def test_too_few_rungs_to_hold_one_out():
    df = ladder()
    with pytest.raises(FitInputError, match="leaves 2 distinct"):
        holdout_backtest(df[df.train_flops < 2e19], holdout_top=1)


def test_a_progressive_step_below_the_interval_rule_keeps_its_prediction():
    """On one run a rung (the demo's), a row bootstrap on 3 rungs always loses a rung in most resamples: the
    3-rung step was refused in every domain, and its reason said to use --bootstrap 0, which the CLI overrode."""
    from pathlib import Path

    from ladder.run.mlflow_runs import long_by_domain

    runs = pd.read_csv(Path(__file__).parents[2] / "notebooks" / "fixtures" / "demo_runs.csv")
    long = long_by_domain(runs[runs["block"] == "ladder"])
    bt = progressive_backtest(long[long["domain"] == "code"], bootstrap=200)
    first = bt["steps"][0]
    assert first["n_rungs_fitted"] == 3 and "error" not in first and abs(first["rel_error"]) < 0.02
    assert first["interval_available"] is False and "the one interval rule" in first["interval_reason"]
    assert bt["steps"][-1]["interval_available"] is True  # 5 rungs: the bootstrap asked for


def test_a_chinchilla_holdout_without_draws_is_refused_not_run_with_fifty():
    from fits.chinchilla_backtest import chinchilla_holdout

    with pytest.raises(FitInputError, match="bootstrap must be ≥ 50, got 0"):
        chinchilla_holdout(pd.DataFrame({"params": [1e8], "tokens": [1e9], "loss": [3.0]}), bootstrap=0)
