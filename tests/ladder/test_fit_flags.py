"""`ladder fit` flags that must do what they say: --ci-level/--bootstrap checked everywhere, --save and
--plot where offered, --progressive in the table, table-level bad input once with exit 2, iso-BPB below a
law's floor, and an ablation with no arm besides the baseline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ladder.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures"
AGC = FIXTURES / "agc_ablation_runs.csv"
CURATION = FIXTURES / "data_curation_runs.csv"
DEMO = FIXTURES / "demo_runs.csv"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err


@pytest.fixture(scope="module")
def chin_csv(tmp_path_factory) -> Path:
    """A small Chinchilla grid: 4 sizes × 4 token multipliers, L = 1.7 + 400/N^0.34 + 410/D^0.28."""
    rng = np.random.default_rng(0)
    rows = [{"run_id": f"r{i}{t}", "params_active": N, "tokens": N * t,
             "bpb": (1.7 + 400 / N**0.34 + 410 / (N * t) ** 0.28) * np.exp(rng.normal(0, 0.003))}
            for i, N in enumerate([1e5, 1e6, 1e7, 1e8]) for t in [5, 20, 80, 320]]
    path = tmp_path_factory.mktemp("chin") / "chin.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def floor_csv(tmp_path_factory) -> Path:
    """One domain with a visible floor: bpb_code = 1.2 + 300·C^−0.2, 7 compute levels, 2 seeds."""
    rng = np.random.default_rng(1)
    rows = [{"run_id": f"r{i}-{s}", "train_flops": C, "bpb_code": (1.2 + 300 * C**-0.2) * np.exp(rng.normal(0, 0.003))}
            for i, C in enumerate(np.geomspace(1e15, 1e18, 7)) for s in range(2)]
    path = tmp_path_factory.mktemp("floor") / "floor.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def floor_laws(floor_csv) -> Path:
    path = floor_csv.parent / "floorlaws.json"
    assert main(["fit", "power-law", "--csv", str(floor_csv), "--x", "train_flops", "--y", "bpb", "--group", "domain",
                 "--bootstrap", "50", "--holdout-top", "0", "--save", str(path), "--json"]) == 0
    return path


# ---------------------------------------------------------------- efficiency: --ci-level, --bootstrap, --save

@pytest.mark.parametrize("argv, field", [
    (["--ci-level", "1.5"], "--ci-level"),
    (["--ci-level", "0"], "--ci-level"),
    (["--bootstrap", "-5"], "--bootstrap"),
])
def test_efficiency_refuses_a_bad_level_or_bootstrap_with_exit_2(capsys, argv, field):
    code, out, err = run(capsys, "fit", "efficiency", "--csv", str(AGC), "--baseline", "agc_off", "--floor", "auto",
                         *argv)
    one_line_error(code, out, err, field)


def test_efficiency_save_fits_the_trend_on_the_rungs_shared_law_as_fit_arms_does(tmp_path, capsys):
    # every rung's EG is read off the one baseline law, so their errors move together: the saved trend is the
    # generalised least squares of `fit arms` (fits.eg_scaling.eg_trend), with the same slope and interval
    curation, saved = FIXTURES / "data_curation_runs.csv", tmp_path / "eff.json"
    code, _, _ = run(capsys, "fit", "efficiency", "--csv", str(curation), "--baseline", "baseline", "--floor", "auto",
                     "--wall", "none", "--save", str(saved), "--json")
    assert code == 0
    trend = json.loads(saved.read_text())["arms"]["arms"]["quarter"]["all"]["trend"]
    code, out, _ = run(capsys, "fit", "arms", "--csv", str(curation), "--baseline", "baseline", "--floor", "auto",
                       "--domains", "all", "--bootstrap", "1000", "--json")
    arms = json.loads(out)["arms"]["quarter"]["all"]["trend"]
    assert trend["method"] == arms["method"] == "gls"
    assert trend["slope"] == pytest.approx(arms["slope"]) and trend["interval"] == pytest.approx(arms["interval"])


def test_efficiency_save_writes_an_arms_laws_file_that_extrapolate_reads(tmp_path, capsys):
    from ladder.cli.fit.laws_file import load_laws

    saved = tmp_path / "eff.json"
    code, out, _ = run(capsys, "fit", "efficiency", "--csv", str(AGC), "--baseline", "agc_off", "--floor", "auto",
                       "--bootstrap", "20", "--save", str(saved), "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["saved"] == str(saved) and saved.is_file()
    section = json.loads(saved.read_text())["arms"]
    assert section["baseline"] == "agc_off" and section["domains"] == ["all"]
    cell = section["arms"]["agc_on"]["all"]
    assert [c["eg"] for c in cell["rungs"]] == pytest.approx([r["eg_flops"] for r in payload["arms"]["agc_on"]])
    assert all("eg_time" in c for c in cell["rungs"]) and cell["trend"]["slope"] is not None
    laws = load_laws([str(saved)])
    assert list(laws["arms"]) == ["agc_off"] and list(laws["arms"]["agc_off"]["arms"]) == ["agc_on"]
    code, out, _ = run(capsys, "extrapolate", "cpu-demo-d2", "--rung", "9", "--laws", str(saved), "--json")
    assert code == 0
    card = json.loads(out)
    assert "agc_on" in card["data_arms"]["baselines"]["agc_off"]


def test_efficiency_matches_a_numeric_arm_column_to_the_baseline_and_saves_t_weighted_trends(tmp_path, capsys):
    """--baseline is text and `fit arms` compares the arm column as text: `fit efficiency` compared it as read, so
    an arm column of numbers (0, 1) never matched (exit 2: "no rows with arm == '0'; arms present: ['0', '1']").
    Its saved trend reads each rung's σ with the Student-t of that rung's interval (fits.eg_scaling.eg_trend)."""
    import math

    from scipy import stats

    from tests.fits.test_eg_scaling import runs_table

    table = runs_table({"baseline": lambda C: C, "dedup": lambda C: 1.3 * C})  # five rungs: the law has intervals
    named, numeric, saved = tmp_path / "named.csv", tmp_path / "numeric.csv", tmp_path / "numeric.json"
    table.to_csv(named, index=False)
    table.assign(arm=table["arm"].map({"baseline": 0, "dedup": 1})).to_csv(numeric, index=False)
    argv = ("--wall", "none", "--bootstrap", "50", "--json")
    code, out, err = run(capsys, "fit", "efficiency", "--csv", str(numeric), "--baseline", "0", *argv,
                         "--save", str(saved))
    assert code == 0, err
    payload = json.loads(out)
    code, out, _ = run(capsys, "fit", "efficiency", "--csv", str(named), "--baseline", "baseline", *argv)
    assert list(payload["arms"]) == ["1"]
    rows = payload["arms"]["1"]
    assert [r["eg_flops"] for r in rows] == pytest.approx([r["eg_flops"] for r in json.loads(out)["arms"]["dedup"]])
    cell = json.loads(saved.read_text())["arms"]["arms"]["1"]["all"]
    sigma = [(math.log(r["eg_flops_interval"][1]) - math.log(r["eg_flops_interval"][0]))
             / (2 * stats.t.ppf(0.975, r["eg_flops_interval_dof"])) for r in rows]
    assert cell["trend"]["weights"] == pytest.approx([1 / s**2 for s in sigma], rel=1e-9)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # fits.prediction, inverting past the floor
def test_efficiency_says_an_arm_below_the_baseline_floor_and_saves_it(floor_csv, tmp_path, capsys):
    base = pd.read_csv(floor_csv).rename(columns={"bpb_code": "bpb"})
    levels = sorted(base["train_flops"].unique())
    base = base.assign(arm="base", rung=base["train_flops"].map(levels.index))
    arm = pd.DataFrame({"arm": "x", "rung": range(len(levels)), "train_flops": levels,
                        "bpb": [1.2 + 250 * C**-0.2 for C in levels[:-1]] + [1.0]})  # the top one below E = 1.2
    csv, saved = tmp_path / "eff_floor.csv", tmp_path / "eff_floor.json"
    pd.concat([base, arm]).to_csv(csv, index=False)
    code, out, _ = run(capsys, "fit", "efficiency", "--csv", str(csv), "--baseline", "base", "--wall", "none",
                       "--bootstrap", "20", "--save", str(saved))
    assert code == 0 and "below the baseline law's floor" in out
    cell = json.loads(saved.read_text())["arms"]["arms"]["x"]["all"]
    assert cell["rungs"][-1]["eg"] is None and cell["trend"]["slope"] is None


def test_a_baseline_only_table_is_refused_by_efficiency_and_arms(tmp_path, capsys):
    agc = pd.read_csv(AGC)
    only = tmp_path / "a_baseonly.csv"
    agc[agc["arm"] == "agc_off"].to_csv(only, index=False)
    code, out, err = run(capsys, "fit", "efficiency", "--csv", str(only), "--baseline", "agc_off", "--floor", "auto")
    one_line_error(code, out, err, "no arm besides the baseline 'agc_off'", "['agc_off']")
    curation = pd.read_csv(CURATION)
    only = tmp_path / "c_baseonly.csv"
    curation[curation["arm"] == "baseline"].to_csv(only, index=False)
    code, out, err = run(capsys, "fit", "arms", "--csv", str(only), "--baseline", "baseline", "--floor", "auto")
    one_line_error(code, out, err, "no arm besides the baseline 'baseline'")


# ---------------------------------------------------------------- chinchilla: --plot, --save

@pytest.mark.parametrize("extra", [[], ["--shared-exponent"]])
def test_chinchilla_plot_writes_a_png(chin_csv, tmp_path, capsys, extra):
    png = tmp_path / "chin.png"
    code, out, _ = run(capsys, "fit", "chinchilla", "--csv", str(chin_csv), "--n", "params_active", "--d", "tokens",
                       "--y", "bpb", "--n-starts", "8", "--plot", str(png), "--json", *extra)
    assert code == 0
    payload = json.loads(out)
    assert payload["plot"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"
    if extra:
        assert payload["law"] == "chinchilla_shared_exponent" and payload["alpha"] == payload["beta"]


def test_chinchilla_plot_with_a_holdout_and_the_shared_exponent_table(chin_csv, tmp_path, capsys):
    png = tmp_path / "chin_bt.png"
    code, out, _ = run(capsys, "fit", "chinchilla", "--csv", str(chin_csv), "--n", "params_active", "--d", "tokens",
                       "--y", "bpb", "--n-starts", "8", "--holdout-top", "1", "--bootstrap", "20", "--plot", str(png))
    assert code == 0 and png.is_file() and "held out" in out
    code, out, _ = run(capsys, "fit", "chinchilla", "--csv", str(chin_csv), "--n", "params_active", "--d", "tokens",
                       "--y", "bpb", "--n-starts", "8", "--shared-exponent")
    assert code == 0 and "η" in out


def test_chinchilla_refuses_negative_n_starts(chin_csv, capsys):
    code, out, err = run(capsys, "fit", "chinchilla", "--csv", str(chin_csv), "--n", "params_active", "--d", "tokens",
                         "--y", "bpb", "--n-starts", "-3")
    one_line_error(code, out, err, "--n-starts")


def test_a_chinchilla_laws_file_is_refused_by_extrapolate_and_iso_bpb_saying_why(chin_csv, tmp_path, capsys):
    saved = tmp_path / "chin.json"
    code, out, _ = run(capsys, "fit", "chinchilla", "--csv", str(chin_csv), "--n", "params_active", "--d", "tokens",
                       "--y", "bpb", "--n-starts", "8", "--save", str(saved), "--json")
    assert code == 0 and json.loads(out)["saved"] == str(saved)
    assert "chinchilla" in json.loads(saved.read_text())
    code, out, err = run(capsys, "extrapolate", "cpu-demo-d2", "--rung", "9", "--laws", str(saved))
    one_line_error(code, out, err, "do not read Chinchilla laws", "fit power-law --save")
    code, out, err = run(capsys, "fit", "iso-bpb", "--laws", str(saved))
    one_line_error(code, out, err, "do not read Chinchilla laws")


# ---------------------------------------------------------------- power-law: --progressive, --cluster

def test_power_law_progressive_shows_in_the_table(floor_csv, capsys):
    code, out, err = run(capsys, "fit", "power-law", "--csv", str(floor_csv), "--x", "train_flops", "--y", "bpb",
                         "--group", "domain", "--bootstrap", "20", "--holdout-top", "0", "--progressive")
    assert code == 0
    assert "progressive backtest" in out and "rungs fitted" in out
    code_json, out_json, _ = run(capsys, "fit", "power-law", "--csv", str(floor_csv), "--x", "train_flops", "--y",
                                 "bpb", "--group", "domain", "--bootstrap", "20", "--holdout-top", "0",
                                 "--progressive", "--json")
    steps = json.loads(out_json)["fits"][0]["progressive_backtest"]["steps"]
    fitted = [s for s in steps if "error" not in s]
    assert fitted and all(f"{s['actual']:.4g} vs {s['predicted']:.4g}" in out for s in fitted)
    for s in steps:
        if "error" in s:
            assert "not fitted" in out and s["error"] in err


def test_power_law_without_progressive_has_no_progressive_table(floor_csv, capsys):
    code, out, _ = run(capsys, "fit", "power-law", "--csv", str(floor_csv), "--x", "train_flops", "--y", "bpb",
                       "--group", "domain", "--bootstrap", "20", "--holdout-top", "0")
    assert code == 0 and "progressive" not in out


def test_a_missing_cluster_column_is_refused_once_with_exit_2_for_a_grouped_fit(capsys):
    code, out, err = run(capsys, "fit", "power-law", "--csv", str(DEMO), "--x", "train_flops", "--y", "bpb",
                         "--group", "domain", "--floor", "auto", "--bootstrap", "20", "--cluster", "nope")
    one_line_error(code, out, err, "--cluster", "'nope'")


# ---------------------------------------------------------------- iso-bpb

def test_iso_bpb_says_a_reference_below_the_floor_is_out_of_reach(floor_laws, tmp_path, capsys):
    refs = tmp_path / "below.yaml"
    refs.write_text("references:\n  - name: X\n    train_flops: 1.0e+25\n    bpb: {code: 1.0}\n")
    code, out, err = run(capsys, "fit", "iso-bpb", "--laws", str(floor_laws), "--references", str(refs))
    assert code == 0
    assert "below the law's floor E=" in out and "no compute reaches it" in out and "0×" not in out
    code, out, _ = run(capsys, "fit", "iso-bpb", "--laws", str(floor_laws), "--references", str(refs), "--json")
    assert code == 0 and json.loads(out)["references"][0]["domains"]["code"]["below_floor"] is True


def test_iso_bpb_refuses_references_whose_domains_have_no_law(floor_laws, tmp_path, capsys):
    refs = tmp_path / "zzz.yaml"
    refs.write_text("references:\n  - name: X\n    train_flops: 1.0e+25\n    bpb: {zzz: 1.0}\n")
    code, out, err = run(capsys, "fit", "iso-bpb", "--laws", str(floor_laws), "--references", str(refs))
    one_line_error(code, out, err, "['zzz']", "['code']")


def test_iso_bpb_leaves_out_a_domain_without_a_law_and_says_so(floor_laws, tmp_path, capsys):
    refs = tmp_path / "mixed.yaml"
    refs.write_text("references:\n  - name: X\n    train_flops: 1.0e+25\n    bpb: {code: 1.25, zzz: 1.0}\n")
    code, out, err = run(capsys, "fit", "iso-bpb", "--laws", str(floor_laws), "--references", str(refs))
    assert code == 0 and "×" in out and "zzz" not in out
    assert "X: no law for ['zzz']" in err
