"""benchmarks.engine_seeds' comparison of the two engines over seeds, against scipy's t statistics:
gap / se is Welch's t (unpaired) and the paired t of the per-seed differences, per domain and for the
mean over domains."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from benchmarks.engine_seeds import compare


def test_gaps_over_standard_errors_are_welchs_and_the_paired_t():
    rng = np.random.default_rng(0)
    domains = ("code", "math", "web")
    torch_runs = {s: {d: 3.0 + rng.normal(0, 0.02) for d in domains} for s in range(5)}
    jax_runs = {s: {d: 3.01 + rng.normal(0, 0.03) for d in domains} for s in range(5)}
    out = compare(torch_runs, jax_runs)
    assert set(out) == {*domains, "mean"}
    columns = {d: ([torch_runs[s][d] for s in range(5)], [jax_runs[s][d] for s in range(5)]) for d in domains}
    columns["mean"] = ([np.mean(list(torch_runs[s].values())) for s in range(5)],
                       [np.mean(list(jax_runs[s].values())) for s in range(5)])
    for d, (t, j) in columns.items():
        assert out[d]["gap"] == pytest.approx(np.mean(j) - np.mean(t), abs=1e-12)
        assert out[d]["gap_over_se"] == pytest.approx(stats.ttest_ind(j, t, equal_var=False).statistic, rel=1e-9)
        assert out[d]["paired_gap_over_se"] == pytest.approx(stats.ttest_rel(j, t).statistic, rel=1e-9)


def test_one_seed_reports_the_gap_without_a_standard_error():
    out = compare({0: {"code": 3.0}}, {0: {"code": 3.5}})
    assert out["code"]["gap"] == pytest.approx(0.5) and "se" not in out["code"]
