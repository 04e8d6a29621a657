"""The demo's fits and report: every domain is backtested, also where its law is not identified."""

import html
import json
import re

import numpy as np
import pandas as pd

from ladder.analysis.demo import demo_cards, fit_compute_laws, summary
from ladder.analysis.demo_result import DemoResult
from ladder.analysis.report import write_figures, write_report


def two_domain_ladder() -> pd.DataFrame:
    C = np.repeat(np.geomspace(1e12, 5e13, 5), 3)
    seeds = np.tile([-0.004, 0.0, 0.004], 5)  # three seeds symmetric around the law
    rows = [pd.DataFrame({"domain": "code", "train_flops": C, "bpb": (0.8 + 60.0 * C ** -0.12) * np.exp(seeds)}),
            pd.DataFrame({"domain": "math", "train_flops": C, "bpb": 40.0 * C ** -0.07 * np.exp(seeds)})]  # no floor
    df = pd.concat(rows, ignore_index=True)
    df["run_id"] = [f"r{i}" for i in range(len(df))]
    return df


def test_report_fits_a_domain_without_a_floor_as_the_nested_law_and_says_so(tmp_path):
    best = two_domain_ladder()
    laws, backtests = fit_compute_laws(best, bootstrap=100)
    # math has no floor (40·C^-0.07): its law is A·C^-α with E on its bound, flagged, not refused.
    assert set(laws) == {"code", "math"} and laws["math"].extra["floor_at_zero"]
    assert not laws["code"].extra["floor_at_zero"] and abs(laws["code"].params["E"] - 0.8) < 0.1
    assert abs(laws["math"].params["alpha"] - 0.07) < 0.005 and laws["math"].params["E"] < 1e-3
    assert backtests["math"]["floor_at_zero"] and abs(backtests["math"]["predictions"][0]["rel_error"]) < 0.01
    # four rungs below the top: no interval (the one rule), so nothing to be inside of
    assert not backtests["code"]["floor_at_zero"] and backtests["code"]["all_inside"] is None

    result = DemoResult(out_dir=tmp_path, tracking_uri="sqlite:///x.db", experiment="e", sweep={},
                        power_laws=laws, backtests=backtests)
    result.figures = write_figures(result, best, best)
    html = write_report(result, best).read_text()
    assert "no floor seen" in html and "E = 0: no floor below the top" in html and "law not fitted" not in html
    assert all(p.stat().st_size > 0 for p in result.figures.values())
    out = json.loads(json.dumps(summary(result), default=str))
    assert out["backtest"]["math"]["floor_at_zero"] and "math" in out["laws"]
    # demo.json as the report: no interval for an E that sits at zero (it gave [0, 0.985]), and the flag
    assert out["laws"]["math"]["floor_at_zero"] and "E" not in out["laws"]["math"]["ci"]
    assert not out["laws"]["code"]["floor_at_zero"]
    # the report's rung column counts rungs, with the runs beside them (it showed 15 runs as "rungs")
    assert "rungs (runs) / why not fitted" in html and "<td>5 (15)</td>" in html


def test_the_card_of_a_law_without_a_floor_predicts_and_says_e_is_zero():
    from ladder.analysis.recipe_card import build_card, card_rows

    laws, _ = fit_compute_laws(two_domain_ladder(), bootstrap=100)
    card = build_card("cpu-demo", 8, {"power_law": laws, "hparams": None, "files": []})
    math = card["predicted_bpb"]["math"]
    assert math["floor_at_zero"] and not card["predicted_bpb"]["code"]["floor_at_zero"]
    C = card["target"]["train_flops"]
    assert abs(math["value"] / (40.0 * C ** -0.07) - 1) < 0.01 and math["interval"][0] < math["value"] < math["interval"][1]
    row = next(r for r in card_rows(card) if r[0] == "BPB math")
    assert "E = 0" in row[1]


def test_the_reports_laws_are_written_once_from_the_recipe_defaults():
    from ladder.plan.recipe import HparamLaws

    assert HparamLaws().lr_wd_text() == "17.04 · steps^-1"
    assert HparamLaws().log_lr_text() == "-1.51 + 0.175·log TPP - 0.573·log steps"
    assert HparamLaws(log_lr_log_tpp=-0.2).log_lr_text() == "-1.51 - 0.2·log TPP - 0.573·log steps"


def test_a_held_out_rung_without_a_valid_interval_is_shown_as_n_a(tmp_path):
    # Five rungs: the top one is predicted from four, below the number of distinct x an interval needs
    # (fits.backtest), so the report must not print the bootstrap's lo/hi as a 95% interval.
    best = two_domain_ladder()
    laws, backtests = fit_compute_laws(best, bootstrap=100)
    prediction = backtests["code"]["predictions"][0]
    assert prediction["interval_available"] is False
    result = DemoResult(out_dir=tmp_path, tracking_uri="sqlite:///x.db", experiment="e", sweep={},
                        power_laws=laws, backtests=backtests)
    result.figures = write_figures(result, best, best)
    html = write_report(result, best).read_text()
    row = html[html.rindex("<td>code</td>"):].split("</tr>")[0]  # the backtest table comes after the laws
    assert prediction["lo"] is None and prediction["hi"] is None and prediction["inside"] is None
    assert "n/a" in row and "inside" not in row and "4 distinct x" in row


def test_the_report_and_ladder_extrapolate_show_the_same_card_rows(tmp_path, capsys):
    from ladder.analysis.recipe_card import build_card, card_rows
    from ladder.cli.extrapolate import render

    card = build_card("cpu-demo", 8, {"power_law": {}, "hparams": None, "files": []})
    rows = card_rows(card)
    assert [r[0] for r in rows[:6]] == ["architecture", "parameters", "tokens / TPP", "batch / steps", "training FLOPs",
                                       "compute"] and any(r[0] == "LR*" for r in rows)
    render(card)
    table = capsys.readouterr().out
    for png in ("bpb_vs_flops", "backtest"):
        (tmp_path / f"{png}.png").write_bytes(b"png")
    result = DemoResult(out_dir=tmp_path, tracking_uri="sqlite:///x.db", experiment="e", sweep={}, cards={"c": card},
                        figures={p: tmp_path / f"{p}.png" for p in ("bpb_vs_flops", "backtest")})
    page = html.unescape(write_report(result, pd.DataFrame()).read_text())
    for name, value, _ in rows:
        assert value in table and f"<td>{value}</td>" in page, name


def test_a_demo_whose_spec_names_its_recipe_by_path_gets_its_cards(tmp_path):
    """A spec's `recipe` may be a path; the demo built its card from the loaded recipe's name, which
    no shipped recipe has, and failed after the whole sweep had trained (2026-12-03)."""
    from ladder.plan.recipe import RECIPES_DIR

    text = (RECIPES_DIR / "cpu-demo-d2.yaml").read_text(encoding="utf-8")
    path = tmp_path / "my-d2.yaml"
    text = re.sub(r"(?m)^full_scale_tokens: .*$", "full_scale_tokens: 1.0e8", text)  # room for L15's tokens
    path.write_text(text.replace("name: cpu-demo-d2", "name: my-d2", 1))
    cards = demo_cards(str(path), 15, {"power_law": {}, "hparams": None, "files": []})
    assert set(cards) == {"my-d2 L15", "mai-base-2 L102"}
    assert cards["my-d2 L15"]["target"]["recipe"] == "my-d2" and cards["my-d2 L15"]["target"]["L"] == 15
