"""The final BPB's standard error reaches the fits' table as `bpb_se_<domain>` (metric
final_bpb_se/<domain>) beside `bpb_<domain>`, and is never taken for a domain; runs and fixtures made
before it simply lack the column. (From a logged run to the table: tests/rungs/test_learning_curve.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ladder.run.mlflow_runs import domains_of, fit_table, long_by_domain

FIXTURES = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures"


def runs_frame() -> pd.DataFrame:
    return pd.DataFrame([
        {"run_id": "a", "metrics.final_bpb/code": 3.0, "metrics.final_bpb/web": 4.0,
         "metrics.final_bpb_se/code": 0.05, "metrics.final_bpb_se/web": 0.02, "tags.diverged": "false"},
        {"run_id": "old", "metrics.final_bpb/code": 3.2, "metrics.final_bpb/web": 4.2, "tags.diverged": "false"},
        {"run_id": "bad", "metrics.final_bpb/code": 9.0, "metrics.final_bpb/web": 9.0,
         "metrics.final_bpb_se/code": 0.3, "metrics.final_bpb_se/web": 0.3, "tags.diverged": "true"},
    ])


def test_the_se_columns_sit_beside_the_domains_and_are_not_domains() -> None:
    table = fit_table(runs_frame())
    assert domains_of(table) == ["code", "web"]
    assert table.loc[0, "bpb_se_code"] == 0.05 and table.loc[0, "bpb_se_web"] == 0.02
    assert np.isnan(table.loc[1, "bpb_se_code"])  # a run logged before the standard error existed
    assert table.loc[0, "bpb"] == 3.5  # the mean of the domains' BPB, no standard error in it
    assert table.loc[2, ["bpb_code", "bpb_se_code"]].isna().all()  # a diverged run has neither
    long = long_by_domain(table)
    assert list(long.columns).count("bpb_se") == 1 and "bpb_se_code" not in long.columns
    by_key = {(r.run_id, r.domain): r.bpb_se for r in long.itertuples()}
    assert by_key[("a", "code")] == 0.05 and by_key[("a", "web")] == 0.02 and np.isnan(by_key[("old", "web")])


def test_a_fixture_without_standard_errors_reads_as_before() -> None:
    runs = pd.read_csv(FIXTURES / "demo_runs.csv")
    long = long_by_domain(runs)
    assert "bpb_se" not in long.columns and len(long) == len(runs) * len(domains_of(runs))
