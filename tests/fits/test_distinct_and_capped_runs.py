"""`fit hparams` sees what was run: steps and TPP of runs capped by max_steps,
and values equal up to float noise counted as one (a constant LR·WD is one value)."""

import numpy as np
import pandas as pd
import pytest

from fits.errors import FlatSurfaceError
from fits.surfaces import fit_surface
from fits.validate import n_distinct
from ladder.run.mlflow_runs import fit_table


def constant_product_sweep():
    """LR swept with WD written as the sweep's round numbers so that LR·WD = 3e-4: one value, but the
    float products differ in their last bits."""
    lr = np.repeat([1e-3, 2e-3, 3e-3, 6e-3, 1.2e-2, 1.5e-2], 2)
    wd = np.repeat([0.3, 0.15, 0.1, 0.05, 0.025, 0.02], 2)
    rng = np.random.default_rng(0)
    return pd.DataFrame({"lr": lr, "wd": wd, "lr_wd": lr * wd,
                         "bpb": 1.0 + 0.05 * np.log(lr / 5e-3) ** 2 + rng.normal(0, 1e-3, len(lr))})


def test_a_constant_lr_wd_counts_as_one_value():
    df = constant_product_sweep()
    assert len(np.unique(df["lr_wd"])) > 1  # the float noise the count must see through
    assert n_distinct(df["lr_wd"].to_numpy()) == 1 and n_distinct(df["lr"].to_numpy()) == 6
    with pytest.raises(FlatSurfaceError, match="got 1"):
        fit_surface(df, ["lr", "lr_wd"], "bpb", id_column=None)


def test_runs_capped_by_max_steps_report_the_steps_and_tpp_they_ran():
    runs = pd.DataFrame({"run_id": ["capped", "full"], "params.steps": [1000, 1000], "params.max_steps": [250, "None"],
                         "params.tpp": [20.0, 20.0], "params.lr": [1e-3, 1e-3]})
    table = fit_table(runs).set_index("run_id")
    assert table.loc["capped", "steps"] == 250 and table.loc["capped", "tpp"] == pytest.approx(5.0)
    assert table.loc["full", "steps"] == 1000 and table.loc["full", "tpp"] == pytest.approx(20.0)
    assert table.loc["capped", "steps_planned"] == 1000 and table.loc["capped", "tpp_planned"] == 20.0
