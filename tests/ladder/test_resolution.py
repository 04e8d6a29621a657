"""What a ladder can resolve before it runs (ladder.analysis.resolution) and `ladder sweep plan`'s lines."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from fits.noise import SEED_NOISE_LOG_SD, SEED_NOISE_PRIOR_DOF
from ladder.analysis.resolution import suggestions, top_rung_half_width
from ladder.cli import main

DEMO_FLOPS = [1.770283008e11, 6.462934733e11, 1.835443814e12, 3.896116224e12, 7.770736927e12, 1.325465468e13]


@pytest.mark.parametrize("seeds", [[1] * 6, [2, 2, 3, 1, 2, 2]])
def test_the_expected_width_is_the_straight_line_prediction_formula(seeds):
    """log A·C^(−α) is a straight line in log C: the width must be t·σ·√(1/m_top + 1/n + (z* − z̄)²/Szz)."""
    z = np.repeat(np.log(DEMO_FLOPS[:-1]), seeds[:-1])
    z_top = np.log(DEMO_FLOPS[-1])
    var = SEED_NOISE_LOG_SD**2 * (1 / seeds[-1] + 1 / len(z) + (z_top - z.mean()) ** 2 / ((z - z.mean()) ** 2).sum())
    dof = SEED_NOISE_PRIOR_DOF + (len(z) - 5) + (5 - 2)
    expected = np.expm1(stats.t.ppf(0.975, dof) * np.sqrt(var))
    got = top_rung_half_width(DEMO_FLOPS, seeds)
    assert got["half_width"] == pytest.approx(expected, rel=1e-10)
    assert got["dof"] == dof and sum(got["shares"].values()) == pytest.approx(1.0)


def test_suggestions_are_the_fewest_that_reach_the_target():
    s = suggestions(DEMO_FLOPS, [1] * 6, 0.02)
    k = s["seeds_per_rung"]
    assert top_rung_half_width(DEMO_FLOPS, [k] * 6)["half_width"] <= 0.02 < top_rung_half_width(
        DEMO_FLOPS, [k - 1] * 6)["half_width"]
    n = s["rungs_same_span"]
    wide = lambda m: top_rung_half_width(list(np.geomspace(DEMO_FLOPS[0], DEMO_FLOPS[-1], m)), [1] * m)["half_width"]  # noqa: E731
    assert wide(n) <= 0.02 < wide(n - 1)
    assert suggestions(DEMO_FLOPS, [1] * 6, 0.001)["seeds_per_rung"] is None  # out of reach: said, not invented


def test_sweep_plan_states_the_demo_ladders_resolution(capsys):
    assert main(["sweep", "plan", "demo", "--json", "--target-width", "2%"]) == 0
    res = json.loads(capsys.readouterr().out)["resolution"]
    assert res["rungs"] == [2, 3, 4, 5, 6, 7] and res["seeds"] == [1] * 6  # the L2 grid's centre is L2 itself
    assert res["half_width"] == pytest.approx(top_rung_half_width(DEMO_FLOPS, [1] * 6)["half_width"], rel=1e-6)
    assert res["suggest"]["target_half_width"] == 0.02 and res["suggest"]["seeds_per_rung"] == 2
    assert main(["sweep", "plan", "demo"]) == 0
    out = capsys.readouterr().out
    assert "resolution: top rung L7 predicted from L2–L6" in out and "2 seeds on every rung" in out


def test_sweep_plan_counts_a_backtests_extra_seeds():
    from ladder.analysis.resolution import ladder_runs

    t = {"block": "ladder", "L": 4, "train_flops": 1.0, "tpp": 5.0, "arm": "base", "at_law": True}
    trials = [t | {"key": "a"}, t | {"key": "b", "block": "extra"}, t | {"key": "c", "block": "grid", "at_law": False},
              t | {"key": "d", "block": "other-tpp", "tpp": 20.0}, t | {"key": "a", "block": "extra"}]
    assert len(ladder_runs(trials)) == 2  # the ladder's run and the extra seed, each key once


def test_an_ablation_without_a_ladder_block_is_read_for_one_arm(capsys):
    """Each arm of an ablation is its own law: the other arms' runs are not its seeds (sweeps/data_curation.yaml
    counted 41 runs of five arms as one law's, and said ±1.0% where the baseline's 7 runs give ±2.6%)."""
    from ladder.analysis.resolution import ladder_runs

    t = {"block": "low", "L": 4, "train_flops": 1.0, "tpp": 5.0, "arm": "base", "at_law": True}
    trials = [t | {"key": "a"}, t | {"key": "b", "arm": "dedup"}, t | {"key": "c", "seed": 1},
              t | {"key": "d", "at_law": False}, t | {"key": "e", "block": "high", "L": 6}]
    assert sorted(ladder_runs(trials)) == [(4, 1.0), (4, 1.0), (6, 1.0)]  # a, c and e: base at the law
    assert main(["sweep", "plan", "agc_ablation", "--json"]) == 0  # arms agc_on, agc_off: two seeds each, L3-L6
    res = json.loads(capsys.readouterr().out)["resolution"]
    assert res["arm"] == "agc_on" and res["seeds"] == [2, 2, 2, 2] and res["runs_fitted"] == 6
    assert main(["sweep", "plan", "demo", "--json"]) == 0  # a ladder block: no arm named
    assert json.loads(capsys.readouterr().out)["resolution"]["arm"] is None


def test_a_bad_target_width_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "plan", "demo", "--target-width", "wide"])
    assert exit_info.value.code == 2 and "--target-width" in capsys.readouterr().err


def _plan_resolution(tmp_path, capsys, name: str, block: dict) -> dict:
    import yaml

    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({"name": name, "recipe": "cpu-demo",
                                    "blocks": [{"name": "ladder", "rungs": [2, 3, 4, 5], **block}]}))
    assert main(["sweep", "plan", str(spec), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["resolution"]


def test_a_ladder_blocks_grid_neighbours_and_other_arms_are_not_its_seeds(tmp_path, capsys):
    """`sweep plan` counted every trial of the "ladder" block as a seed of its law: an LR grid e^±1 away, or
    arms that turn AGC off or pin lr=0.5, made one seed a rung read as three (±1.8% where one seed gives ±3.4%)."""
    plain = _plan_resolution(tmp_path, capsys, "plain", {})
    assert plain["seeds"] == [1] * 4 and plain["arm"] is None
    grid = _plan_resolution(tmp_path, capsys, "grid", {"lr_wd": {"log_lr": {"spacing": 1.0, "points": 3}}})
    assert grid["seeds"] == [1] * 4 and grid["half_width"] == pytest.approx(plain["half_width"])
    arms = _plan_resolution(tmp_path, capsys, "arms", {"arms": {"base": {}, "noagc": {"agc": False},
                                                                "big_lr": {"lr": 0.5}}})
    assert arms["seeds"] == [1] * 4 and arms["arm"] == "base"
    assert arms["half_width"] == pytest.approx(plain["half_width"])
    # An arm pinning lr is not at the law, even listed first: the law is read for the first arm that is.
    pinned_first = _plan_resolution(tmp_path, capsys, "pinned", {"arms": {"big_lr": {"lr": 0.5}, "base": {}}})
    assert pinned_first["arm"] == "base" and pinned_first["seeds"] == [1] * 4
    # A ladder at an explicit centre, the law nowhere: read at its centre.
    fixed = _plan_resolution(tmp_path, capsys, "fixed", {"lr_wd": {"centre": {"lr": 0.01, "weight_decay": 0.1},
                                                                   "log_lr": {"spacing": 1.0, "points": 3}}})
    assert fixed["seeds"] == [1] * 4


def test_a_ladder_blocks_runs_off_the_law_are_not_counted():
    from ladder.analysis.resolution import ladder_runs

    t = {"block": "ladder", "L": 4, "train_flops": 1.0, "tpp": 5.0, "arm": "base", "at_law": True}
    trials = [t | {"key": "a"}, t | {"key": "b", "at_law": False}, t | {"key": "c", "arm": "noagc"},
              t | {"key": "d", "tpp": 20.0}, t | {"key": "e", "block": "extra"}]
    assert sorted(ladder_runs(trials)) == [(4, 1.0), (4, 1.0)]  # a, and e: an extra seed of the same law
