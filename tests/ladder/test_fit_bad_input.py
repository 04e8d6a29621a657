"""Bad input to `ladder fit` and `ladder extrapolate` that used to crash or mislead: a negative --seed, a
--tracking-uri MLflow cannot read, NaN in a laws file, an infinite or malformed references YAML, a bad
cell of a wide `bpb_<domain>` table, --holdout-top past the rungs, --rung 0, a negative --bootstrap; and
what a grouped fit says about empty `bpb_<domain>` cells and E's interval under --floor auto.

Bad input exits 2 with one line naming the file (or flag) and the field. Run in-process with small
bootstraps (the fixture: notebooks/fixtures/demo_runs.csv, 14 runs, 6 rungs, 6 domains)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ladder.cli import main
from tests.ladder.test_hostile_input import refused

FIXTURES = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures"
DEMO = FIXTURES / "demo_runs.csv"
GROUPED = ["fit", "power-law", "--x", "train_flops", "--y", "bpb", "--group", "domain", "--floor", "auto"]
LAST_LINE = 15  # demo_runs.csv: header + 14 runs; its last run is a ladder rung


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse refuses a flag's value by exiting
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused_by_argparse(code: int, out: str, err: str, *says: str) -> str:
    """argparse's refusal of a flag's value: exit 2, one line naming the flag (the usage block it printed before
    made it 5-10 lines, where every other bad input is one)."""
    assert code == 2 and out == "" and "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and len(err.strip().splitlines()) == 1, err
    for word in says:
        assert word in errors[0], errors[0]
    return errors[0]


def demo_with(tmp_path: Path, name: str, column: str, value, *, last_only: bool = True) -> str:
    df = pd.read_csv(DEMO)
    if isinstance(value, str):
        df[column] = df[column].astype(object)
    if last_only:
        df.loc[df.index[-1], column] = value
    else:
        df[column] = value
    path = tmp_path / name
    df.to_csv(path, index=False)
    return str(path)


@pytest.fixture(scope="module")
def laws(tmp_path_factory) -> Path:
    """A laws file of the fixture's six domains (`ladder fit power-law --save`), with a small bootstrap."""
    path = tmp_path_factory.mktemp("laws") / "laws.json"
    assert main(["fit", "power-law", "--csv", str(DEMO), *GROUPED[2:], "--bootstrap", "20", "--holdout-top", "0",
                 "--save", str(path), "--json"]) == 0
    return path


@pytest.fixture(autouse=True)
def _no_env_store(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


# ---------------------------------------------------------------- 1. --seed

@pytest.mark.parametrize("argv", [
    ["fit", "power-law", "--csv", str(DEMO), *GROUPED[2:], "--bootstrap", "10"],
    ["fit", "chinchilla", "--csv", str(DEMO), "--n", "params_active", "--d", "tokens", "--y", "bpb"],
    ["fit", "arms", "--csv", str(FIXTURES / "data_curation_runs.csv"), "--baseline", "baseline", "--floor", "auto"],
], ids=["power-law", "chinchilla", "arms"])
def test_a_negative_seed_is_refused_at_the_flag(capsys, argv):
    line = refused_by_argparse(*run(capsys, *argv, "--seed", "-1"), "--seed", "≥ 0", "'-1'")
    assert "expected non-negative integer" not in line


def test_a_seed_that_is_not_a_whole_number_is_refused_at_the_flag(capsys):
    refused_by_argparse(*run(capsys, "fit", "power-law", "--csv", str(DEMO), "--seed", "1.5"), "--seed", "'1.5'")


# ---------------------------------------------------------------- 3. --tracking-uri

@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_a_huber_delta_that_is_not_a_positive_finite_number_is_refused_at_the_flag(capsys, value):
    # inf passed the flag before and failed once per domain, exit 1
    refused_by_argparse(*run(capsys, "fit", "power-law", "--csv", str(DEMO), *GROUPED[2:], "--delta", value),
                        "--delta", repr(value))


def test_a_tracking_uri_mlflow_cannot_read_is_refused_naming_it_and_what_works(capsys, tmp_path):
    line = refused(*run(capsys, "fit", "power-law", "--experiment", "x", "--tracking-uri", "bogus://foo"),
                   "--tracking-uri", "'bogus://foo'", "sqlite:///", "http(s)://")
    assert "Exception" not in line
    assert list(tmp_path.iterdir()) == []  # nothing written


# ---------------------------------------------------------------- 4. non-finite numbers in a laws file

def _broken_laws(laws: Path, tmp_path: Path, edit) -> str:
    data = json.loads(laws.read_text())
    edit(data["power_law"]["code"])
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes them
    return str(path)


@pytest.mark.parametrize("edit, key", [
    (lambda fit: fit["params"].__setitem__("alpha", float("nan")), "params.alpha"),
    (lambda fit: fit["params"].__setitem__("A", float("inf")), "params.A"),
    (lambda fit: fit["params"].__setitem__("A", -2.0), "params.A"),
    (lambda fit: fit["ci"].__setitem__("alpha", [0.05, float("nan")]), "ci.alpha[1]"),
    (lambda fit: fit["bootstrap_draws"][3].__setitem__(2, float("nan")), "bootstrap_draws[3][2]"),
], ids=["nan-alpha", "inf-A", "negative-A", "nan-ci", "nan-draw"])
@pytest.mark.parametrize("command", ["extrapolate", "iso-bpb"])
def test_a_non_finite_number_in_a_laws_file_is_refused_naming_its_key(capsys, laws, tmp_path, edit, key, command):
    path = _broken_laws(laws, tmp_path, edit)
    argv = (["extrapolate", "cpu-demo-d2", "--rung", "9", "--laws", path] if command == "extrapolate"
            else ["fit", "iso-bpb", "--laws", path])
    refused(*run(capsys, *argv), "broken.json", "power_law.code", key)


def test_power_law_from_dict_refuses_nan_and_reads_a_good_law(laws):
    from fits.errors import FitInputError
    from fits.power_law import power_law_from_dict

    fit = json.loads(laws.read_text())["power_law"]["code"]
    law = power_law_from_dict(fit)
    assert law.params == fit["params"] and law.bootstrap_params.shape[1] == 3
    with pytest.raises(FitInputError, match=r"params\.E must be a finite number"):
        power_law_from_dict({**fit, "params": {**fit["params"], "E": float("nan")}})


# ---------------------------------------------------------------- 5. references YAML

@pytest.mark.parametrize("text, says", [
    ("references:\n  - name: X\n    train_flops: .inf\n    bpb: {code: 1.0}\n", ["references[0].train_flops", "inf"]),
    ("references:\n  - name: X\n    train_flops: .nan\n    bpb: {code: 1.0}\n", ["references[0].train_flops"]),
    ("references:\n  - name: X\n    train_flops: 1.0e+25\n    bpb: {code: .inf}\n", ["references[0].bpb.code"]),
    ("references:\n  - name: X\n    train_flops: 1.0e+25\n    bpb: {code: -1}\n", ["references[0].bpb.code"]),
    ("references:\n  - just a name\n", ["references[0]", "mapping"]),
    ("references: [\n", ["not a valid references YAML", "line 2, column 1"]),
], ids=["inf-flops", "nan-flops", "inf-bpb", "negative-bpb", "not-a-mapping", "malformed"])
def test_a_bad_references_file_is_refused_in_one_line_naming_it_once(capsys, laws, tmp_path, text, says):
    refs = tmp_path / "refs.yaml"
    refs.write_text(text)
    line = refused(*run(capsys, "fit", "iso-bpb", "--laws", str(laws), "--references", str(refs)), *says)
    assert line.count("refs.yaml") == 1, line


# ---------------------------------------------------------------- 11. a wide table's bad cell

def test_an_infinite_domain_bpb_names_its_column_and_line(capsys, tmp_path):
    csv = demo_with(tmp_path, "inf_code.csv", "bpb_code", np.inf)
    line = refused(*run(capsys, *GROUPED, "--csv", csv, "--bootstrap", "0"), "inf_code.csv", "bpb_code",
                   f"line {LAST_LINE}")
    assert "row 27" not in line


def test_a_non_numeric_domain_bpb_names_its_column_and_line(capsys, tmp_path):
    csv = demo_with(tmp_path, "text_code.csv", "bpb_code", "oops")
    refused(*run(capsys, *GROUPED, "--csv", csv, "--bootstrap", "0"), "bpb_code", "'oops'", f"line {LAST_LINE}")


def test_a_missing_compute_names_its_line_in_the_file(capsys, tmp_path):
    csv = demo_with(tmp_path, "nan_flops.csv", "train_flops", np.nan)
    line = refused(*run(capsys, *GROUPED, "--csv", csv, "--bootstrap", "0"), "train_flops", f"line {LAST_LINE}")
    assert "row 13" not in line
    # extrapolate checks the compute column on the table as the file has it: one cell, counted once
    refused(*run(capsys, "extrapolate", "cpu-demo-d2", "--rung", "9", "--csv", csv, "--floor", "auto",
                 "--bootstrap", "0"), "nan_flops.csv", "train_flops", "has 1 missing", f"line {LAST_LINE}")


def test_the_long_table_keeps_the_lines_of_the_file():
    from ladder.run.mlflow_runs import long_by_domain

    wide = pd.read_csv(DEMO)
    wide.index = pd.RangeIndex(2, len(wide) + 2, name="line")
    long = long_by_domain(wide)
    assert long.index.is_unique and long.index.name == "line"
    assert f"{LAST_LINE} (code)" in long.index
    assert long_by_domain(pd.read_csv(DEMO)).index.equals(pd.RangeIndex(len(wide) * 6))  # unnamed: as before


# ---------------------------------------------------------------- 14. empty bpb_<domain> cells

def test_an_empty_domain_cell_is_left_out_and_said_so(capsys, tmp_path):
    csv = demo_with(tmp_path, "nan_code.csv", "bpb_code", np.nan)
    code, out, err = run(capsys, *GROUPED, "--csv", csv, "--bootstrap", "0", "--holdout-top", "0", "--json")
    assert code == 0
    fits = {f["group"]: f for f in json.loads(out)["fits"]}
    assert fits["code"]["n_points"] == 5 and fits["books"]["n_points"] == 6
    assert f"code: 1 run with no BPB (an empty bpb_<domain> cell) left out of its law (line {LAST_LINE})" in err


def test_a_domain_with_no_bpb_at_all_is_reported_not_fitted_with_its_reason(capsys, tmp_path):
    csv = demo_with(tmp_path, "allnan_code.csv", "bpb_code", np.nan, last_only=False)
    code, out, err = run(capsys, *GROUPED, "--csv", csv, "--bootstrap", "0", "--holdout-top", "0", "--json")
    assert code == 0
    fits = {f["group"]: f for f in json.loads(out)["fits"]}
    assert sorted(fits) == ["books", "code", "math", "qa", "stem", "web"]
    assert fits["code"]["E"] is None and fits["code"]["n_points"] == 0 and "no run has a BPB" in fits["code"]["reason"]
    assert all(fits[d]["E"] is not None for d in fits if d != "code")
    assert err.count("code: ") == 1 and "code: not fitted: bpb_code is empty in all 14 runs" in err
    code, out, err = run(capsys, *GROUPED, "--csv", csv, "--bootstrap", "0", "--holdout-top", "0")
    assert code == 0 and "not fitted" in out and err.count("code: ") == 1


def test_a_table_with_no_bpb_anywhere_is_refused(capsys, tmp_path):
    df = pd.read_csv(DEMO)
    df[[c for c in df.columns if c.startswith("bpb_")]] = np.nan
    csv = tmp_path / "no_bpb.csv"
    df.to_csv(csv, index=False)
    refused(*run(capsys, *GROUPED, "--csv", str(csv), "--bootstrap", "0"), "no_bpb.csv", "every bpb_<domain>",
            "empty")


def test_runs_without_bpb_on_every_domain_are_said_once_with_how_many_diverged(capsys, tmp_path):
    df = pd.read_csv(DEMO)
    df.loc[df.index[:2], "diverged"] = True  # two LR/WD runs: fit_table blanks a diverged run's BPB
    df.loc[df.index[:2], [c for c in df.columns if c.startswith("bpb_")]] = np.nan
    csv = tmp_path / "diverged.csv"
    df.to_csv(csv, index=False)
    code, _, err = run(capsys, *GROUPED, "--csv", str(csv), "--bootstrap", "0", "--holdout-top", "0", "--json")
    assert code == 0
    assert ("books, code, math, qa, stem, web: 2 runs with no BPB (an empty bpb_<domain> cell) left out of their "
            "laws (lines 2, 3; 2 of them diverged)") in err


def test_missing_bpb_names_runs_by_id_where_the_table_has_no_lines():
    from ladder.run.mlflow_runs import describe_rows, missing_bpb

    df = pd.DataFrame({"run_id": ["a", "b", "c"], "bpb_code": [1.0, np.nan, np.nan], "bpb_web": [1.0, 2.0, 3.0]})
    missing = missing_bpb(df)
    assert list(missing) == ["code"] and describe_rows(df, missing["code"]) == "runs b, c"


# ---------------------------------------------------------------- 12. --holdout-top, --rung, --bootstrap

def test_holding_out_more_rungs_than_there_are_says_how_many_can_be(capsys):
    code, out, _ = run(capsys, *GROUPED, "--csv", str(DEMO), "--bootstrap", "0", "--holdout-top", "10", "--json")
    assert code == 0
    skipped = json.loads(out)["fits"][0]["backtest"]["skipped"]
    assert "of 6" in skipped and "at most 3" in skipped and "-4" not in skipped


def test_extrapolate_names_the_rung_flag(capsys, laws):
    line = refused(*run(capsys, "extrapolate", "cpu-demo-d2", "--laws", str(laws), "--rung", "0"), "--rung:", "0")
    assert "--rungs" not in line


def test_extrapolate_refuses_a_negative_bootstrap(capsys):
    refused(*run(capsys, "extrapolate", "cpu-demo-d2", "--rung", "9", "--csv", str(DEMO), "--floor", "auto",
                 "--bootstrap", "-1"), "--bootstrap", "-1")


# ---------------------------------------------------------------- 13. E = 0 lies in its interval

@pytest.mark.parametrize("select", ["ladder", "all"])
def test_every_parameter_lies_in_its_interval_under_floor_auto(capsys, select):
    code, out, _ = run(capsys, *GROUPED, "--csv", str(DEMO), "--bootstrap", "60", "--holdout-top", "0",
                       "--select", select, "--json")
    assert code == 0
    for f in json.loads(out)["fits"]:
        ci = f["ci"] or f["interval"]["unreliable_ci"]
        for k in ("E", "A", "alpha"):
            assert ci[k][0] <= f[k] <= ci[k][1], (f["group"], k, f[k], ci[k])
        if f["floor_at_zero"]:
            assert f["E"] == 0.0 and ci["E"][0] == 0.0


def test_a_saved_law_from_before_reads_with_its_e_interval_from_zero(laws):
    from fits.power_law import power_law_from_dict

    fit = json.loads(laws.read_text())["power_law"]["books"]
    assert fit["floor_at_zero"]
    old = {**fit, "ci": {**fit["ci"], "E": [1.5e-5, 0.9]}}  # as the fits wrote it before
    law = power_law_from_dict(old)
    assert law.ci["E"] == (0.0, 0.9) and law.conf_int()["E"][0] == 0.0


# ---------------------------------------------------------------- minor: n_starts

def test_chinchilla_refuses_n_starts_below_one(capsys):
    from fits.chinchilla import fit_chinchilla
    from fits.errors import FitInputError

    df = pd.read_csv(DEMO)
    with pytest.raises(FitInputError, match="n_starts must be a whole number ≥ 1"):
        fit_chinchilla(df, n="params_active", d="tokens", y="bpb", n_starts=-3)
    refused(*run(capsys, "fit", "chinchilla", "--csv", str(DEMO), "--n", "params_active", "--d", "tokens", "--y",
                 "bpb", "--n-starts", "-3"), "--n-starts", "-3")
