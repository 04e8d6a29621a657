"""Iso-BPB multipliers and efficiency gains against closed forms."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fits.efficiency import efficiency_gains, iso_bpb_multipliers, load_references
from fits.errors import FitInputError
from fits.power_law import fit_power_law

REFS = Path(__file__).resolve().parents[2] / "fits" / "references" / "mai_base_2_references.yaml"
E, A, ALPHA = 0.45, 30.0, 0.07


def law(C):
    return E + A * C ** (-ALPHA)


def test_multiplier_is_the_compute_ratio_at_equal_bpb():
    C = np.geomspace(1e19, 1e23, 6)
    fit = fit_power_law(pd.DataFrame({"train_flops": C, "bpb": law(C)}), bootstrap=100)
    # a reference that spent 5e24 FLOPs to reach the BPB our law reaches at 5e23: 10x
    refs = [{"name": "ref", "train_flops": 5e24, "bpb": {"code": float(law(5e23)), "math": float(law(1e24))}}]
    out = iso_bpb_multipliers({"code": fit, "math": fit}, refs)
    r = out["references"][0]
    assert r["domains"]["code"]["multiplier"] == pytest.approx(10.0, rel=1e-4)
    assert r["domains"]["math"]["multiplier"] == pytest.approx(5.0, rel=1e-4)
    assert r["range"] == pytest.approx([5.0, 10.0], rel=1e-4)
    lo, hi = r["domains"]["code"]["interval"]
    assert lo <= 10.0 <= hi


def test_reference_below_the_floor_needs_infinite_compute():
    C = np.geomspace(1e19, 1e23, 6)
    fit = fit_power_law(pd.DataFrame({"train_flops": C, "bpb": law(C)}))
    out = iso_bpb_multipliers({"code": fit}, [{"name": "r", "train_flops": 1e24, "bpb": {"code": E * 0.9}}])
    assert out["references"][0]["domains"]["code"]["below_floor"]
    assert out["references"][0]["domains"]["code"]["multiplier"] == 0.0


def test_shipped_references_file_is_valid_and_labelled():
    data = load_references(REFS)
    names = [r["name"] for r in data["references"]]
    assert names == ["DeepSeek-V4-Pro-Base", "MAI-Base-1"]
    assert "ILLUSTRATIVE" in REFS.read_text()


def test_eg_flops_and_time_recover_a_known_gain_growing_with_scale():
    """The candidate reaches at C the loss the baseline reaches at k·C, so EG_FLOPs = k; it runs
    10% slower per FLOP, so EG_time = k / 1.1."""
    gains = {18: 1.02, 24: 1.07, 30: 1.10, 36: 1.16, 42: 1.28}
    rows = []
    throughput = 1e15  # FLOP/s of the baseline
    for L, k in gains.items():
        C = 1e18 * (L / 18) ** 6
        rows.append({"arm": "baseline", "rung": L, "train_flops": C, "wall_seconds": C / throughput, "bpb": law(C)})
        rows.append({"arm": "agc", "rung": L, "train_flops": C, "wall_seconds": 1.1 * C / throughput, "bpb": law(k * C)})
    out = efficiency_gains(pd.DataFrame(rows), bootstrap=100)
    got = {r["rung"]: r for r in out["arms"]["agc"]}
    for L, k in gains.items():
        assert got[L]["eg_flops"] == pytest.approx(k, rel=1e-3)
        assert got[L]["eg_time"] == pytest.approx(k / 1.1, rel=1e-3)
        lo, hi = got[L]["eg_flops_interval"]
        assert lo <= k * (1 + 1e-3) and hi >= k * (1 - 1e-3)


def test_efficiency_input_errors():
    df = pd.DataFrame({"arm": ["a"] * 4, "rung": [1, 2, 3, 4], "train_flops": [1e18, 1e19, 1e20, 1e21],
                       "wall_seconds": [1.0, 2, 3, 4], "bpb": [1.0, 0.9, 0.8, 0.75]})
    with pytest.raises(FitInputError, match="baseline"):
        efficiency_gains(df)
    with pytest.raises(FitInputError, match="missing"):
        efficiency_gains(df.drop(columns="rung"), baseline="a")


def test_a_baseline_without_a_floor_is_refused_by_default_and_fitted_with_floor_auto():
    """The ablation's baseline law takes the one floor rule: an E that runs to zero is refused unless
    asked for "auto", where the nested law recovers the gain (here a constant 1.1× in compute)."""
    from fits.errors import FitBoundaryError

    rows = []
    for L, C in enumerate(np.geomspace(1e18, 1e22, 5)):
        rows.append({"arm": "baseline", "rung": L, "train_flops": C, "wall_seconds": C / 1e15, "bpb": 30 * C ** -0.07})
        rows.append({"arm": "agc", "rung": L, "train_flops": C, "wall_seconds": C / 1e15,
                     "bpb": 30 * (1.1 * C) ** -0.07})
    with pytest.raises(FitBoundaryError, match="no loss floor"):
        efficiency_gains(pd.DataFrame(rows), bootstrap=0, wall=None)
    out = efficiency_gains(pd.DataFrame(rows), bootstrap=0, wall=None, floor="auto")
    assert [r["eg_flops"] for r in out["arms"]["agc"]] == pytest.approx([1.1] * 5, rel=1e-4)
    assert out["baseline_law_flops"]["E"] == 0.0


def test_fit_efficiency_takes_the_floor_rule(tmp_path, capsys):
    from ladder.cli import main

    rows = [{"arm": arm, "rung": L, "train_flops": C, "bpb": 30 * (k * C) ** -0.07}
            for L, C in enumerate(np.geomspace(1e18, 1e22, 5)) for arm, k in (("baseline", 1.0), ("agc", 1.1))]
    pd.DataFrame(rows).to_csv(tmp_path / "ablation.csv", index=False)
    argv = ["fit", "efficiency", "--csv", str(tmp_path / "ablation.csv"), "--baseline", "baseline", "--wall", "none",
            "--bootstrap", "0"]
    assert main(argv) == 2 and "no loss floor" in capsys.readouterr().err
    assert main([*argv, "--floor", "auto"]) == 0
    table = capsys.readouterr().out
    assert table.count("+10.0%") == 5 and "n/a" in table  # no bootstrap: no interval, said so
