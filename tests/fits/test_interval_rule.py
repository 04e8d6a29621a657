"""One interval rule (`FitResult.interval_note`) for every interval the fit commands print: below 5
distinct x a power law has none, and neither has anything drawn from it. One test per path: the main
fit, each group of a grouped fit, the held-out and progressive backtest predictions, the recipe card,
efficiency gains and iso-BPB multipliers; and the card's warning beyond ~100× the data's compute."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pandas as pd
import pytest

from fits.backtest import holdout_backtest, progressive_backtest
from fits.power_law import fit_power_law
from ladder.cli import main


def law(c):
    return 0.6 + 40.0 * np.asarray(c) ** -0.08


def rungs(n: int, seed: int = 0, noise: float = 0.003) -> pd.DataFrame:
    C = np.repeat(np.geomspace(1e18, 1e21, n), 2)
    return pd.DataFrame({"train_flops": C, "bpb": law(C) * np.exp(np.random.default_rng(seed).normal(0, noise, len(C)))})


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """`ladder fit power-law --group` on a 6-rung group and a 4-rung one, table and JSON, laws saved."""
    tmp = tmp_path_factory.mktemp("intervals")
    df = pd.concat([rungs(6).assign(domain="wide"), rungs(4, seed=1).assign(domain="thin")], ignore_index=True)
    df["run_id"] = [f"r{i}" for i in range(len(df))]
    df.to_csv(tmp / "runs.csv", index=False)
    argv = ["fit", "power-law", "--csv", str(tmp / "runs.csv"), "--x", "train_flops", "--y", "bpb", "--group", "domain",
            "--bootstrap", "100"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main([*argv, "--save", str(tmp / "laws.json"), "--json"]) == 0
        payload = json.loads(out.getvalue())
        out.truncate(0)
        out.seek(0)
        assert main(argv) == 0
    return {"tmp": tmp, "json": {f["group"]: f for f in payload["fits"]}, "table": out.getvalue(),
            "stderr": err.getvalue()}


def test_the_main_fit_and_each_group_follow_the_rule(grouped):
    wide, thin = grouped["json"]["wide"], grouped["json"]["thin"]
    assert wide["interval"]["available"] and wide["ci"]["alpha"][0] < wide["alpha"] < wide["ci"]["alpha"][1]
    assert thin["ci"] == {} and not thin["interval"]["available"] and "4 distinct x" in thin["interval"]["reason"]
    thin_row = next(line for line in grouped["table"].splitlines() if "thin" in line)
    wide_row = next(line for line in grouped["table"].splitlines() if "wide" in line)
    assert "n/a" in thin_row and f"[{wide['ci']['alpha'][0]:.4g}, " in wide_row
    assert "thin: interval not available: 4 distinct x" in grouped["stderr"]


def test_backtest_predictions_follow_the_rule_of_the_fit_below_the_top(grouped):
    # wide: 5 rungs below its top, an interval; thin: 3 below, none: no lo/hi to misread, nothing inside
    wide = grouped["json"]["wide"]["backtest"]["predictions"][0]
    thin_bt = grouped["json"]["thin"]["backtest"]
    thin = thin_bt["predictions"][0]
    assert wide["interval_available"] and wide["lo"] < wide["predicted"] < wide["hi"] and wide["inside"] in (True, False)
    assert thin["interval_available"] is False and "3 distinct x" in thin["interval_reason"]
    assert thin["lo"] is None and thin["hi"] is None and thin["inside"] is None and thin_bt["all_inside"] is None
    thin_row = next(line for line in grouped["table"].splitlines() if "thin" in line)
    assert "(interval n/a)" in thin_row and thin_row.rstrip(" │").endswith("n/a")
    # five rungs: the held-out top is predicted from four, no interval (the case that printed 0.06%)
    five = holdout_backtest(rungs(5), bootstrap=100)["predictions"][0]
    assert five["lo"] is None and five["interval_reason"].startswith("4 distinct x")
    steps = progressive_backtest(rungs(6), bootstrap=50)["steps"]
    assert [s["n_rungs_fitted"] for s in steps] == [3, 4, 5]
    assert [s["interval_available"] for s in steps] == [False, False, True] and steps[0]["lo"] is None


def test_the_recipe_card_follows_the_rule_and_warns_far_beyond_the_data(grouped, capsys):
    laws = str(grouped["tmp"] / "laws.json")
    capsys.readouterr()
    assert main(["extrapolate", "cpu-demo", "--rung", "8", "--laws", laws, "--json"]) == 0
    out = capsys.readouterr()
    card = json.loads(out.out)
    wide, thin = card["predicted_bpb"]["wide"], card["predicted_bpb"]["thin"]
    assert wide["interval"][0] < wide["value"] < wide["interval"][1]
    assert thin["interval"] is None and "4 distinct x" in thin["interval_note"]
    # cpu-demo L8 is ~1e16 FLOPs, below these laws' data: no warning; mai-base-2 L102 is ~1e25, ×1e4 past it
    assert card["warnings"] == [] and "warning" not in out.err
    assert main(["extrapolate", "mai-base-2", "--rung", "102", "--laws", laws]) == 0
    out = capsys.readouterr()
    assert "warning: BPB extrapolated more than 100× beyond the largest fitted compute (thin ×" in out.err
    thin_row = next(line for line in out.out.splitlines() if "BPB thin" in line)
    assert thin_row.rstrip(" │").endswith("n/a") and "beyond the data" in thin_row


def test_efficiency_gains_and_iso_bpb_multipliers_follow_the_baseline_laws_rule():
    from fits.efficiency import efficiency_gains, iso_bpb_multipliers

    rows = []
    for n_rungs, arm in ((4, "baseline"), (4, "agc")):
        for L, C in zip(range(n_rungs), np.geomspace(1e18, 1e21, n_rungs)):
            rows.append({"arm": arm, "rung": L, "train_flops": C, "wall_seconds": C / 1e15,
                         "bpb": law(C * (1.05 if arm == "agc" else 1.0)) * (1 + 0.001 * (-1) ** L)})
    eg = efficiency_gains(pd.DataFrame(rows), bootstrap=100)
    for r in eg["arms"]["agc"]:
        assert r["eg_flops_interval"] is None and "4 distinct x" in r["eg_flops_interval_note"]
        assert r["eg_time_interval"] is None and r["eg_flops"] == pytest.approx(1.05, rel=0.05)
    thin = fit_power_law(rungs(4), bootstrap=100)
    wide = fit_power_laws_one(rungs(6))
    out = iso_bpb_multipliers({"thin": thin, "wide": wide},
                              [{"name": "ref", "train_flops": 1e22, "bpb": {"thin": 1.3, "wide": 1.3}}])
    domains = out["references"][0]["domains"]
    assert domains["thin"]["interval"] is None and domains["thin"]["interval_note"]
    assert domains["wide"]["interval"][0] <= domains["wide"]["multiplier"] <= domains["wide"]["interval"][1]


def fit_power_laws_one(df: pd.DataFrame):
    fit = fit_power_law(df, bootstrap=100)
    assert fit.interval_note is None
    return fit
