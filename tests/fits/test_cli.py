"""`ladder fit …` and `ladder extrapolate …`: JSON contracts, exit 2 on bad input, MLflow round trip."""

import json

import numpy as np
import pandas as pd
import pytest

from ladder.cli import main
from tests.fits.hparam_synth import sweep


def ladder_csv(tmp_path, n_rungs=5):
    rng = np.random.default_rng(0)
    rows = []
    for C in np.geomspace(1e17, 1e20, n_rungs):
        for domain, (E, A) in {"code": (0.4, 20.0), "math": (0.5, 30.0)}.items():
            for seed in range(2):
                rows.append({"run_id": f"{domain}-{C:.0e}-{seed}", "train_flops": C, "domain": domain,
                             "bpb": (E + A * C**-0.08) * np.exp(rng.normal(0, 0.002))})
    path = tmp_path / "ladder.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def run_json(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else None), out.err


def test_power_law_json_schema(tmp_path, capsys):
    csv = ladder_csv(tmp_path)
    code, payload, _ = run_json(capsys, ["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb",
                                         "--group", "domain", "--bootstrap", "200", "--holdout-top", "1", "--json"])
    assert code == 0
    assert [f["group"] for f in payload["fits"]] == ["code", "math"]
    for f in payload["fits"]:
        assert {"group", "E", "A", "alpha", "ci", "backtest"} <= set(f)
        assert set(f["ci"]) == {"E", "A", "alpha"} and f["ci"]["alpha"][0] < f["alpha"] < f["ci"]["alpha"][1]
        assert f["backtest"]["kind"] == "holdout" and len(f["backtest"]["predictions"]) == 1
        assert f["n_points"] == 10 and f["backtest"]["n_train"] == 8  # the top rung is held out of the backtest only
    assert payload["fits"][0]["alpha"] == pytest.approx(0.08, abs=0.02)


@pytest.mark.parametrize("mutate,needle", [
    (lambda df: df.drop(columns="bpb"), "bpb"),
    (lambda df: df.assign(train_flops=np.where(df.index == 3, -5.0, df.train_flops)), "non-positive"),
])
def test_power_law_bad_input_exits_2_with_one_message(tmp_path, capsys, mutate, needle):
    csv = ladder_csv(tmp_path)
    pd.read_csv(csv).pipe(mutate).to_csv(csv, index=False)
    code, _, err = run_json(capsys, ["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb", "--json"])
    assert code == 2
    assert needle in err and str(csv) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_group_without_a_floor_is_reported_and_the_others_fitted(tmp_path, capsys):
    csv = ladder_csv(tmp_path)
    df = pd.read_csv(csv)
    bent = df["domain"] == "math"  # BPB falling faster at the top: no E ≥ 0 fits, E runs to its bound
    df.loc[bent, "bpb"] = 5.0 - 0.02 * np.log(df.loc[bent, "train_flops"] / 1e17) ** 2
    df.to_csv(csv, index=False)
    code = main(["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb", "--group", "domain",
                 "--bootstrap", "50", "--plot", str(tmp_path / "laws.png"), "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and (tmp_path / "laws.png").stat().st_size > 0  # math's panel shows its data alone
    by_group = {f["group"]: f for f in payload["fits"]}
    assert by_group["code"]["alpha"] == pytest.approx(0.08, abs=0.02) and by_group["code"]["backtest"]["predictions"]
    assert by_group["math"]["E"] is None and "bound" in by_group["math"]["not_identified"]
    assert by_group["math"]["reason"].startswith("math: ")
    # its top rung is still predicted (E = 0 below the top, said so), so the backtest covers every domain
    assert by_group["math"]["backtest"]["floor_at_zero"] and by_group["math"]["backtest"]["predictions"]


def test_delta_auto_is_resolved_from_the_seeds_and_recorded(tmp_path, capsys):
    csv = ladder_csv(tmp_path)
    code, payload, _ = run_json(capsys, ["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb",
                                         "--group", "domain", "--bootstrap", "50", "--delta", "auto", "--json"])
    assert code == 0
    for f in payload["fits"]:
        assert f["options"]["delta_rule"].startswith("auto") and 0 < f["options"]["delta"] < 0.01  # noise sd 0.002
        assert f["backtest"]["delta"] > 0
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb", "--delta", "median"])
    assert exit_info.value.code == 2 and "positive number or 'auto'" in capsys.readouterr().err


def test_no_group_fitted_exits_1_with_each_groups_reason(tmp_path, capsys):
    csv = ladder_csv(tmp_path)
    df = pd.read_csv(csv)
    df["bpb"] = 5.0 - 0.02 * np.log(df["train_flops"] / 1e17) ** 2
    df.to_csv(csv, index=False)
    code = main(["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb", "--group", "domain", "--json"])
    out = capsys.readouterr()
    assert code == 1 and "Traceback" not in out.err
    assert "no group could be fitted" in out.err and "code: " in out.err and "math: " in out.err
    assert [f["reason"].split(":")[0] for f in json.loads(out.out)["fits"]] == ["code", "math"]


def test_one_thin_group_never_sinks_the_others(tmp_path, capsys):
    """A group with two rungs cannot be fitted, backtested or bootstrapped: it gets its own reason,
    naming it; the other groups keep their laws and the command exits 0."""
    csv = ladder_csv(tmp_path)
    df = pd.read_csv(csv)
    thin = df[(df.domain == "code") & (df.train_flops < 2e18)].assign(domain="thin")
    pd.concat([df, thin]).to_csv(csv, index=False)
    code = main(["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb", "--group", "domain",
                 "--bootstrap", "100", "--progressive", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    by_group = {f["group"]: f for f in payload["fits"]}
    assert by_group["code"]["alpha"] is not None and by_group["math"]["alpha"] is not None
    assert by_group["thin"]["alpha"] is None and by_group["thin"]["reason"].startswith("thin: ")
    assert "distinct values" in by_group["thin"]["reason"]


def test_holdout_top_2_table_shows_the_top_rung_and_json_all_of_them(tmp_path, capsys):
    csv = ladder_csv(tmp_path, n_rungs=6)
    argv = ["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb", "--group", "domain",
            "--bootstrap", "100", "--holdout-top", "2"]
    code, payload, _ = run_json(capsys, [*argv, "--json"])
    assert code == 0
    preds = payload["fits"][0]["backtest"]["predictions"]
    assert len(preds) == 2 and preds[0]["x"] < preds[1]["x"] == pytest.approx(1e20)
    assert main(argv) == 0
    table = capsys.readouterr().out
    code_row = next(line for line in table.splitlines() if "code" in line)
    assert f"{preds[1]['actual']:.4g} vs {preds[1]['predicted']:.4g}" in code_row
    assert f"{preds[0]['actual']:.4g} vs" not in code_row


def test_power_law_csv_needs_its_columns_named(tmp_path, capsys):
    code, _, err = run_json(capsys, ["fit", "power-law", "--csv", str(ladder_csv(tmp_path)), "--json"])
    assert code == 2 and "--x" in err


def test_chinchilla_cli_on_epochs_points(tmp_path, capsys, epoch_240):
    csv = tmp_path / "chin.csv"
    epoch_240.rename(columns={"Model Size": "N"})[["N", "tokens", "loss"]].to_csv(csv, index=False)
    code, payload, _ = run_json(capsys, ["fit", "chinchilla", "--csv", str(csv), "--n", "N", "--d", "tokens", "--y",
                                         "loss", "--n-starts", "16", "--json"])
    assert code == 0
    assert {"E", "A", "B", "alpha", "beta"} <= set(payload)
    assert payload["alpha"] == pytest.approx(0.34731, rel=0.01) and payload["beta"] == pytest.approx(0.36718, rel=0.01)


def test_hparams_cli_contract(tmp_path, capsys):
    csv = tmp_path / "sweep.csv"
    sweep(seed=11).to_csv(csv, index=False)
    code, payload, _ = run_json(capsys, ["fit", "hparams", "--csv", str(csv), "--json"])
    assert code == 0
    assert set(payload["lr_wd_product"]) >= {"coef", "steps_exponent"}
    assert set(payload["log_lr"]) >= {"intercept", "log_tpp", "log_steps"}
    assert len(payload["slices"]) == 15
    assert payload["lr_wd_product"]["steps_exponent"] == pytest.approx(-1.0, abs=0.05)


def test_extrapolate_falls_back_to_the_reports_laws_and_says_so(capsys):
    code, card, _ = run_json(capsys, ["extrapolate", "mai-base-2", "--rung", "102", "--json"])
    assert code == 0
    t, hp = card["target"], card["hyperparameters"]
    assert t["L"] == 102 and t["d_model"] == 8704 and t["n_heads"] == 96
    assert 35 < t["compute"]["wall_clock_days"] < 45
    assert "NOT fitted" in hp["source"] and "report" in card["provenance"]["hparam_laws"]
    lr = np.exp(-1.51 + 0.175 * np.log(t["tpp"]) - 0.573 * np.log(t["steps"]))
    assert hp["lr"]["value"] == pytest.approx(lr)
    assert hp["lr_wd_product"]["value"] == pytest.approx(17.04 / t["steps"])


def test_extrapolate_with_saved_laws(tmp_path, capsys):
    csv, laws, hp = ladder_csv(tmp_path), tmp_path / "laws.json", tmp_path / "hp.json"
    assert main(["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb", "--group", "domain",
                 "--bootstrap", "200", "--save", str(laws), "--json"]) == 0
    sweep(seed=12).to_csv(tmp_path / "sweep.csv", index=False)
    assert main(["fit", "hparams", "--csv", str(tmp_path / "sweep.csv"), "--save", str(hp), "--json"]) == 0
    capsys.readouterr()
    code, card, _ = run_json(capsys, ["extrapolate", "cpu-demo", "--rung", "8", "--laws", str(laws), "--laws", str(hp),
                                      "--json"])
    assert code == 0
    assert set(card["predicted_bpb"]) == {"code", "math"}
    b = card["predicted_bpb"]["code"]
    assert b["interval"][0] < b["value"] < b["interval"][1]
    assert card["hyperparameters"]["source"] == "fitted laws"
    assert card["hyperparameters"]["lr"]["interval95"] is not None
    code, _, err = run_json(capsys, ["extrapolate", "cpu-demo", "--rung", "8", "--laws", str(tmp_path / "nope.json")])
    assert code == 2 and "nope.json" in err


def test_fit_from_an_mlflow_experiment_and_logged_back(tmp_path, capsys):
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from ladder.run.mlflow_runs import fit_table, read_runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("ladder-test", artifact_location=str(tmp_path / "artifacts"))
    rng = np.random.default_rng(1)
    for L, C in zip((3, 4, 5, 6, 7), np.geomspace(1e14, 1e17, 5)):
        run = client.create_run(exp, tags={"rung": str(L), "diverged": "false"})
        bpb = {d: (E + 9 * C**-0.1) * np.exp(rng.normal(0, 0.002)) for d, E in (("code", 0.9), ("math", 1.1))}
        client.log_batch(run.info.run_id, params=[Param("lr", "0.003"), Param("weight_decay", "0.1")],
                         metrics=[Metric("total_train_flops", C, 0, 1), Metric("wall_seconds", C / 1e12, 0, 1)]
                         + [Metric(f"final_bpb/{d}", v, 0, 1) for d, v in bpb.items()])
        client.set_terminated(run.info.run_id, "FINISHED")
    table = fit_table(read_runs("ladder-test", uri))
    assert len(table) == 5 and {"bpb_code", "bpb_math", "train_flops", "lr", "wd"} <= set(table.columns)
    code, payload, _ = run_json(capsys, ["fit", "power-law", "--experiment", "ladder-test", "--tracking-uri", uri,
                                         "--bootstrap", "100", "--json"])
    assert code == 0
    assert [f["group"] for f in payload["fits"]] == ["code", "math"]
    fit_run = client.get_run(payload["mlflow_fit_run_id"])
    assert fit_run.data.tags["kind"] == "fit" and fit_run.data.tags["n_source_runs"] == "5"
    assert "code.alpha" in fit_run.data.metrics
    assert len(read_runs("ladder-test", uri)) == 5  # the fit run is not read back as a training run
    # the recipe card straight from the experiment: BPB laws fitted here, LR/WD not swept → report laws
    code, card, _ = run_json(capsys, ["extrapolate", "cpu-demo", "--rung", "8", "--experiment", "ladder-test",
                                      "--tracking-uri", uri, "--bootstrap", "100", "--json"])
    assert code == 0 and set(card["predicted_bpb"]) == {"code", "math"}
    assert card["provenance"]["experiment"]["n_runs"] == 5
    assert "NOT fitted" in card["hyperparameters"]["source"]


def test_efficiency_and_iso_bpb_commands(tmp_path, capsys):
    def law(C):
        return 0.45 + 30.0 * C ** (-0.07)
    rows = []
    for L, k in {18: 1.02, 24: 1.07, 30: 1.10, 36: 1.16, 42: 1.28}.items():
        C = 1e18 * (L / 18) ** 6
        rows.append({"arm": "baseline", "rung": L, "train_flops": C, "wall_seconds": C / 1e15, "bpb": law(C)})
        rows.append({"arm": "agc", "rung": L, "train_flops": C, "wall_seconds": C / 1e15, "bpb": law(k * C)})
    csv = tmp_path / "ablation.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    code, out, _ = run_json(capsys, ["fit", "efficiency", "--csv", str(csv), "--baseline", "baseline", "--bootstrap",
                                     "100", "--json"])
    assert code == 0
    assert [round(r["eg_flops"], 3) for r in out["arms"]["agc"]] == [1.02, 1.07, 1.10, 1.16, 1.28]
    code, _, err = run_json(capsys, ["fit", "efficiency", "--csv", str(csv), "--baseline", "nope", "--json"])
    assert code == 2 and "nope" in err

    laws = tmp_path / "laws.json"
    assert main(["fit", "power-law", "--csv", str(ladder_csv(tmp_path)), "--x", "train_flops", "--y", "bpb",
                 "--group", "domain", "--bootstrap", "100", "--save", str(laws), "--json"]) == 0
    capsys.readouterr()
    code, out, _ = run_json(capsys, ["fit", "iso-bpb", "--laws", str(laws), "--json"])
    assert code == 0
    assert [r["reference"] for r in out["references"]] == ["DeepSeek-V4-Pro-Base", "MAI-Base-1"]
    assert set(out["references"][0]["domains"]) == {"code", "math"}


def test_fit_table_maps_the_training_jobs_names_and_blanks_diverged_runs():
    from ladder.run.mlflow_runs import fit_table, long_by_domain

    runs = pd.DataFrame({
        "run_id": ["a", "b"], "params.lr": [0.01, 0.02], "params.weight_decay": [0.1, 0.1], "params.steps": [100, 100],
        "params.tpp": [5.0, 5.0], "params.params_active": [1e6, 1e6], "metrics.total_train_flops": [1e15, 1e15],
        "metrics.final_bpb/code": [1.2, 9.9], "metrics.final_bpb/math": [1.4, 9.9], "tags.rung": ["3", "3"],
        "tags.diverged": ["false", "true"]})
    t = fit_table(runs)
    assert t.loc[0, "wd"] == 0.1 and t.loc[0, "train_flops"] == 1e15 and t.loc[0, "rung"] == 3
    assert t.loc[0, "bpb"] == pytest.approx(1.3) and t.loc[0, "bpb_code"] == 1.2
    assert t.loc[1, "diverged"] and np.isnan(t.loc[1, "bpb"]) and np.isnan(t.loc[1, "bpb_math"])
    long = long_by_domain(t)
    assert sorted(long["domain"]) == ["code", "math"] and set(long["run_id"]) == {"a"}


def test_a_three_rung_ladder_is_told_which_flags_fit_it_and_what_they_cost(tmp_path, capsys):
    """A first small ladder (the demo's L2–L4, one seed a rung): the bootstrap cannot run on 3 rungs, and
    the refusal names the flags that fit it anyway and what they give up; those flags then fit it."""
    runs = pd.read_csv("notebooks/fixtures/demo_runs.csv")
    csv = tmp_path / "three.csv"
    runs[(runs["block"] == "ladder") & (runs["rung"] <= 4)].to_csv(csv, index=False)
    argv = ["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb", "--group", "domain",
            "--floor", "auto"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1
    assert "--bootstrap 0" in err and "--holdout-top 0" in err
    assert "no prediction interval" in err and "no backtest" in err
    code, payload, _ = run_json(capsys, argv + ["--bootstrap", "0", "--holdout-top", "0", "--json"])
    assert code == 0 and len(payload["fits"]) == 6 and all(f["alpha"] > 0 for f in payload["fits"])


def test_an_ungrouped_law_the_data_refuse_exits_1_as_a_group_does(capsys):
    """The data show no floor under --floor fit: exit 1 (no law), as for every group of a grouped fit; it was 2,
    the exit of a bad table, so a script could not tell them apart."""
    from pathlib import Path

    from ladder.cli import main

    csv = Path(__file__).parents[2] / "notebooks" / "fixtures" / "demo_runs.csv"
    assert main(["fit", "power-law", "--csv", str(csv), "--x", "train_flops", "--y", "bpb_code", "--bootstrap", "0"]) == 1
    err = capsys.readouterr().err
    assert "E → 0: these points show no loss floor" in err and len(err.strip().splitlines()) == 1
