"""`ladder fit arms --csv`: one JSON object, a table, a figure, and bad input as exit 2 with one line."""

from __future__ import annotations

import json

import pytest

from ladder.cli import main
from tests.fits.test_eg_scaling import runs_table


@pytest.fixture(scope="module")
def csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("arms") / "runs.csv"
    runs_table({"baseline": lambda C: C, "dedup": lambda C: 1.3 * C}).to_csv(path, index=False)
    return path


def run(capsys, *argv):
    code = main(["fit", "arms", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_has_each_arm_domain_and_rung_with_intervals_and_a_trend(csv, tmp_path, capsys):
    png = tmp_path / "eg.png"
    code, out, _ = run(capsys, "--csv", str(csv), "--baseline", "baseline", "--domains", "code,web",
                       "--bootstrap", "100", "--plot", str(png), "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["domains"] == ["code", "web"] and list(payload["arms"]) == ["dedup"]
    for domain in ("code", "web"):
        cell = payload["arms"]["dedup"][domain]
        assert [r["rung"] for r in cell["rungs"]] == [2, 3, 4, 5, 6]
        assert all(r["interval"][0] < 1.3 < r["interval"][1] for r in cell["rungs"])
        assert {"slope", "interval", "verdict"} <= set(cell["trend"])
    assert payload["plot"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"


def test_table_names_the_readings(csv, capsys):
    code, out, _ = run(capsys, "--csv", str(csv), "--baseline", "baseline", "--domains", "code", "--bootstrap", "50")
    assert code == 0
    assert "EG_FLOPs" in out and "trend" in out and "dedup" in out and "gain" in out


@pytest.mark.parametrize("argv, field", [
    (["--baseline", "nope"], "arm"),
    (["--baseline", "baseline", "--domains", "maths"], "domains"),
    (["--baseline", "baseline", "--rung", "L"], "L"),
    (["--baseline", "baseline", "--ci-level", "1.5"], "--ci-level"),
    (["--baseline", "baseline", "--against", "rung", "--target-width", "0"], "--target-width"),
    (["--baseline", "baseline", "--pair-on", "seed"], "--pair-on"),
    (["--baseline", "baseline", "--against", "rung", "--pair-on", "init"], "init"),
])
def test_bad_input_exits_2_with_one_line_naming_the_field(csv, capsys, argv, field):
    code, out, err = run(capsys, "--csv", str(csv), *argv)
    assert code == 2 and out == ""
    assert field in err and len(err.strip().splitlines()) == 1


def test_a_missing_file_exits_2(tmp_path, capsys):
    code, _, err = run(capsys, "--csv", str(tmp_path / "none.csv"), "--baseline", "baseline")
    assert code == 2 and "none.csv" in err


def test_from_an_mlflow_experiment_the_eg_and_its_interval_are_logged_in_a_fit_run(tmp_path, capsys):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("arms-test", artifact_location=str(tmp_path / "artifacts"))
    table = runs_table({"baseline": lambda C: C, "dedup": lambda C: 1.3 * C})
    for row in table.itertuples():
        made = client.create_run(exp, tags={"rung": str(row.rung), "arm": row.arm, "diverged": "false"})
        client.log_batch(made.info.run_id, metrics=[
            Metric("total_train_flops", row.train_flops, 0, 1), Metric("final_bpb/code", row.bpb_code, 0, 1),
            Metric("final_bpb/web", row.bpb_web, 0, 1)])
        client.set_terminated(made.info.run_id, "FINISHED")
    code, out, _ = run(capsys, "--experiment", "arms-test", "--tracking-uri", uri, "--baseline", "baseline",
                       "--domains", "code", "--bootstrap", "50", "--json")
    assert code == 0
    payload = json.loads(out)
    logged = client.get_run(payload["mlflow_fit_run_id"]).data.metrics
    for r in payload["arms"]["dedup"]["code"]["rungs"]:
        key = f"eg/dedup/code/L{r['rung']}"
        assert logged[key] == pytest.approx(r["eg"])
        assert [logged[f"{key}/low"], logged[f"{key}/high"]] == pytest.approx(r["interval"])
    assert logged["eg_slope/dedup/code"] == pytest.approx(payload["arms"]["dedup"]["code"]["trend"]["slope"])
    assert not any(k.endswith("/seeds_for_target") for k in logged)  # read off the law: no seed count
    code, out, _ = run(capsys, "--experiment", "arms-test", "--tracking-uri", uri, "--baseline", "baseline",
                       "--domains", "code", "--bootstrap", "50", "--against", "rung", "--json")
    assert code == 0
    payload = json.loads(out)
    logged = client.get_run(payload["mlflow_fit_run_id"]).data.metrics
    for r in payload["arms"]["dedup"]["code"]["rungs"]:
        assert logged[f"eg/dedup/code/L{r['rung']}/seeds_for_target"] == r["seeds_for_target"] >= 2


def test_against_the_same_rung_is_a_flag_and_is_said(csv, capsys):
    code, out, _ = run(capsys, "--csv", str(csv), "--baseline", "baseline", "--domains", "code", "--bootstrap", "50",
                       "--against", "rung", "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["against"] == "rung" and payload["seed_noise"]["code"]["dof"] == 10
    rungs = payload["arms"]["dedup"]["code"]["rungs"]
    assert all(r["verdict"] == "gain" for r in rungs)  # the true 1.3 is outside 1 at every rung ...
    assert sum(r["interval"][0] < 1.3 < r["interval"][1] for r in rungs) >= 4  # ... and inside 95% intervals
    assert payload["target_half_width"] == 0.10 and all(r["seeds_for_target"] >= 2 for r in rungs)
    code, out, _ = run(capsys, "--csv", str(csv), "--baseline", "baseline", "--domains", "code", "--bootstrap", "50",
                       "--against", "rung", "--target-width", "0.05")
    assert code == 0 and "same rung" in out and "seeds a side for ±5%" in out


def test_pairing_on_the_seed_is_a_flag_and_is_said(csv, capsys):
    code, out, _ = run(capsys, "--csv", str(csv), "--baseline", "baseline", "--domains", "code", "--bootstrap", "50",
                       "--against", "rung", "--pair-on", "seed", "--json")
    assert code == 0
    payload = json.loads(out)
    noise = payload["seed_noise"]["code"]
    assert noise["paired_on"] == "seed" and noise["dof"] == 5  # one pair difference's dof per rung, not two
    assert all(r["runs"] == [2, 2] for r in payload["arms"]["dedup"]["code"]["rungs"])
    code, out, _ = run(capsys, "--csv", str(csv), "--baseline", "baseline", "--domains", "code", "--bootstrap", "50",
                       "--against", "rung", "--pair-on", "seed")
    assert code == 0 and "paired on seed" in out


def test_an_arm_below_the_baseline_laws_floor_is_an_unbounded_gain_said_in_table_json_and_figure(tmp_path, capsys):
    """The baseline's law has a floor E = 1.2; the arm's BPB, from a law with E = 0.9, drops below it: no compute
    brings the baseline there, so the arm's EG is unbounded at those rungs (it was a TypeError)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = [{"run_id": f"{arm}{k}{s}", "rung": k + 2, "arm": arm, "seed": s, "train_flops": C,
             "bpb": (E + 300 * C ** -0.2) * np.exp(rng.normal(0, 0.003))}
            for k, C in enumerate(np.geomspace(1e15, 1e18, 5)) for s in range(2)
            for arm, E in (("baseline", 1.2), ("better", 0.9))]
    path = tmp_path / "floor.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    png = tmp_path / "eg.png"
    code, out, _ = run(capsys, "--csv", str(path), "--baseline", "baseline", "--bootstrap", "50", "--floor", "fit",
                       "--plot", str(png), "--json")
    assert code == 0
    cell = json.loads(out)["arms"]["better"]["all"]
    beyond = [r for r in cell["rungs"] if r["eg"] is None]
    assert beyond and all(r["verdict"] == "gain beyond the baseline's floor" for r in beyond)
    assert cell["trend"]["slope"] is None and "floor" in cell["trend"]["note"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    code, out, _ = run(capsys, "--csv", str(path), "--baseline", "baseline", "--bootstrap", "50", "--floor", "fit")
    assert code == 0 and "+∞" in out and "gain beyond the baseline's floor" in out
