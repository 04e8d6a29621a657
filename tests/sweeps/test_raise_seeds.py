"""`sweeps.raise_seeds`: the spec that gives each arm, at each rung, the seeds a fit names. Checked against the
spec's own plan (every trial it had keeps its key, so a rerun skips it; the new trials are the new seeds
alone), on arms that share the baseline's seeds and on a replica with seeds of its own, and, through
`ladder fit arms --raise-seeds`, against `sweeps/data_curation_named_seeds.yaml`, written by hand from the
same fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ladder.cli import main
from sweeps.plan import plan_sweep
from sweeps.raise_seeds import raised_spec
from sweeps.spec import SWEEPS_DIR, load_spec, parse_spec

FIXTURES = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures"
SPEC = {
    "name": "ablation", "recipe": "cpu-demo-d2", "experiment": "x", "seeds": [0],
    "overrides": {"eval_interval": 200},
    "blocks": [
        {"name": "arms", "rungs": [3, 2], "seeds": [0, 1], "arms": {"baseline": {}, "dedup": {"dropout": 0.1}}},
        {"name": "check", "rungs": [3, 2], "seeds": [2, 3], "arms": {"replica": {}}},
    ],
}


def trials(spec) -> dict[str, tuple[str, int, int]]:
    return {p.key: (p.trial.arm, p.trial.L, p.trial.seed) for p in plan_sweep(spec)}


def test_the_baseline_and_the_arms_on_its_seeds_share_new_seeds_and_a_replica_gets_its_own():
    spec = parse_spec(SPEC, "spec")
    data, added, skipped = raised_spec(spec, {("dedup", 3): 4, ("replica", 3): 5, ("dedup", 2): 1},
                                       baseline="baseline")
    assert skipped == []
    # the baseline at L3 needs the most any arm there needs (5): three new seeds, the first not used at L3
    assert added == {("baseline", 3): [4, 5, 6], ("dedup", 3): [4, 5], ("replica", 3): [7, 8, 9]}
    raised = parse_spec(data, "raised")
    assert raised.name == "ablation_raised" and raised.overrides == spec.overrides
    before, after = trials(spec), trials(raised)
    assert set(before) <= set(after)  # every trial run so far keeps its key: a rerun skips it
    new = sorted(after[k] for k in set(after) - set(before))
    assert new == sorted([("baseline", 3, s) for s in (4, 5, 6)] + [("dedup", 3, s) for s in (4, 5)]
                         + [("replica", 3, s) for s in (7, 8, 9)])


def test_an_arm_at_its_number_keeps_its_seeds_and_cells_of_another_spec_are_left_out():
    spec = parse_spec(SPEC, "spec")
    data, added, skipped = raised_spec(spec, {("dedup", 2): 2, ("replica", 2): 1}, baseline="baseline")
    assert added == {} and skipped == [] and set(trials(parse_spec(data, "raised"))) == set(trials(spec))
    data, added, skipped = raised_spec(spec, {("dedup", 3): 3, ("quality", 3): 4, ("dedup", 5): 4},
                                       baseline="baseline")
    assert skipped == [("dedup", 5), ("quality", 3)] and added == {("baseline", 3): [4], ("dedup", 3): [4]}
    with pytest.raises(ValueError, match=r"none of the fit's .*\('quality', 3\)"):  # another sweep's spec
        raised_spec(spec, {("quality", 3): 4}, baseline="baseline")


def test_seeds_the_runs_had_from_other_specs_count_and_are_not_reused():
    """An experiment holds runs of several specs (a calibration's, an earlier top-up's): the fit counted their
    seeds, so they count towards the number, and a new seed never repeats one."""
    spec = parse_spec(SPEC, "spec")
    runs = {("replica", 3): [2, 3, 4, 5], ("baseline", 3): [0, 1, 6], ("dedup", 3): [0, 1]}
    _, added, _ = raised_spec(spec, {("replica", 3): 5, ("dedup", 3): 3}, baseline="baseline", run_seeds=runs)
    # the baseline has 0, 1, 6: three of the five the replica needs; the replica has four of five
    assert added == {("baseline", 3): [7, 8], ("dedup", 3): [7], ("replica", 3): [9]}


def seeds_by_cell(spec) -> dict[tuple[str, int], set[int]]:
    out: dict[tuple[str, int], set[int]] = {}
    for block in spec.blocks:
        for arm in block.arms:
            for rung in block.rungs:
                out.setdefault((arm, rung), set()).update(block.seeds or spec.seeds)
    return out


def test_the_cli_writes_what_was_written_by_hand_from_the_same_fit(tmp_path, capsys):
    """The six-seed calibration's fit names 10 seeds a side at L3 and six at L2 and L4; the named-seeds sweep
    added seeds 12-15 to the baseline and 16-19 to the replica at L3 by hand. The CLI writes the same."""
    out = tmp_path / "raised.yaml"
    code = main(["fit", "arms", "--csv", str(FIXTURES / "data_curation_calibration6_runs.csv"), "--baseline",
                 "baseline", "--floor", "auto", "--against", "rung", "--raise-seeds",
                 str(SWEEPS_DIR / "data_curation_calibration6.yaml"), "--raised-spec", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "8 new seeds; baseline L3 +4; replica L3 +4" in captured.err
    import json

    assert json.loads(captured.out)["raised_spec"]["added"] == [
        {"arm": "baseline", "rung": 3, "seeds": [12, 13, 14, 15]}, {"arm": "replica", "rung": 3, "seeds": [16, 17, 18, 19]}]
    raised, six = seeds_by_cell(load_spec(out)), seeds_by_cell(load_spec("data_curation_calibration6"))
    by_hand = seeds_by_cell(load_spec("data_curation_named_seeds"))
    for arm in ("baseline", "replica"):
        assert raised[(arm, 3)] == six[(arm, 3)] | by_hand[(arm, 3)]
        assert raised[(arm, 2)] == six[(arm, 2)] and raised[(arm, 4)] == six[(arm, 4)]
    text = out.read_text()
    assert text.startswith("# data_curation_calibration6 with each arm's seeds") and yaml.safe_load(text)


def test_once_the_named_seeds_ran_the_fit_asks_for_no_more(tmp_path, capsys):
    """Over the 60 runs of three specs (the calibration, the upper rungs, the named seeds), the runs' own seeds
    count: the named-seeds spec's cells are at their number, and the cells it does not run are said."""
    out = tmp_path / "raised.yaml"
    code = main(["fit", "arms", "--csv", str(FIXTURES / "data_curation_named_seeds_runs.csv"), "--baseline",
                 "baseline", "--floor", "auto", "--against", "rung", "--raise-seeds",
                 str(SWEEPS_DIR / "data_curation_named_seeds.yaml"), "--raised-spec", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "0 new seeds" in err and "replica L2 (not in data_curation_named_seeds)" in err
    assert seeds_by_cell(load_spec(out)) == seeds_by_cell(load_spec("data_curation_named_seeds"))


def test_a_run_without_a_seed_is_not_counted(tmp_path, capsys):
    """A table whose runs lack a seed (an older run, a hand-made CSV) counts the seeds it has."""
    import pandas as pd

    runs = pd.read_csv(FIXTURES / "data_curation_calibration6_runs.csv")
    runs.loc[(runs.arm == "replica") & (runs.rung == 3) & (runs.seed == 11), "seed"] = None
    runs.to_csv(tmp_path / "runs.csv", index=False)
    code = main(["fit", "arms", "--csv", str(tmp_path / "runs.csv"), "--baseline", "baseline", "--floor", "auto",
                 "--against", "rung", "--raise-seeds", str(SWEEPS_DIR / "data_curation_calibration6.yaml"),
                 "--raised-spec", str(tmp_path / "raised.yaml")])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "baseline L3 +4; replica L3 +4" in err  # seed 11 is in the spec: the spec's seeds count as ever


@pytest.mark.parametrize("argv, says", [
    (["--against", "rung", "--raise-seeds", "data_curation_calibration6"], "--raised-spec OUT go together"),
    (["--raise-seeds", "data_curation_calibration6", "--raised-spec", "x.yaml"], "add --against rung"),
    (["--against", "rung", "--raise-seeds", "no_such_spec", "--raised-spec", "x.yaml"], "no_such_spec"),
])
def test_bad_raise_seeds_flags_exit_2_saying_why(tmp_path, capsys, argv, says, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["fit", "arms", "--csv", str(FIXTURES / "data_curation_calibration6_runs.csv"), "--baseline",
                 "baseline", "--floor", "auto", *argv])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err
    assert not (tmp_path / "x.yaml").exists()
