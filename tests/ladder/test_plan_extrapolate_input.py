"""`ladder plan` and `ladder extrapolate` on input a user can type or a file edited by hand: one line and
exit 2 before any work, never a traceback, minutes of counting, or a card that contradicts itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ladder.cli import main
from ladder.plan.recipe import RECIPES_DIR

FIXTURES = Path(__file__).resolve().parents[2] / "notebooks" / "fixtures"


def _refused(capsys, argv: list[str], *says: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line, = err.strip().splitlines()
    for word in says:
        assert word in line, line
    return line


@pytest.mark.parametrize("argv", [["extrapolate", "cpu-demo", "--rung", "3000000"],
                                  ["plan", "cpu-demo", "--rungs", "99999999999"],
                                  ["extrapolate", "mai-base-2", "--rung", "2147483647"]])
def test_a_rung_of_millions_of_layers_is_refused_before_it_is_counted(capsys, argv):
    # counting walks every layer: 3,000,000 layers took over a minute and 10 GB before the budget check
    _refused(capsys, argv, "1 to 10,000")


def test_a_width_that_is_not_a_whole_number_shows_its_fraction(capsys):
    _refused(capsys, ["plan", "mai-base-2", "--rungs", "17"], "= 1450.67, not an integer")


@pytest.mark.parametrize("flag", ["--mfu", "--goodput"])
def test_mfu_and_goodput_without_gpus_are_refused_not_ignored(capsys, flag):
    _refused(capsys, ["plan", "cpu-demo", flag, "0.5"], flag, "needs --gpus")


@pytest.mark.parametrize("laws, says", [({"log_lr_intercept": 1000}, "log LR* = "),
                                         ({"log_lr_intercept": -1000}, "log LR* = "),
                                         ({"lr_wd_product_steps_exponent": 400}, "log LR*·WD* = ")])
def test_recipe_laws_that_give_no_usable_lr_are_refused(tmp_path, capsys, laws, says):
    recipe = yaml.safe_load((RECIPES_DIR / "cpu-demo.yaml").read_text())
    recipe["hparam_laws"] = laws
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    _refused(capsys, ["plan", str(tmp_path / "r.yaml")], "hparam_laws", says)


@pytest.fixture(scope="module")
def laws_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("laws") / "laws.json"
    assert main(["fit", "power-law", "--csv", str(FIXTURES / "demo_runs.csv"), "--x", "train_flops", "--y", "bpb",
                 "--group", "domain", "--floor", "auto", "--bootstrap", "0", "--holdout-top", "0", "--save", str(path),
                 "--json"]) == 0
    return path


def test_the_ladders_own_top_rung_is_inside_the_data(laws_file, capsys):
    # the plan's 13254654680064 FLOPs and the table's 1.325465468e+13 are one rung: not "×1 beyond"
    capsys.readouterr()
    assert main(["extrapolate", "cpu-demo-d2", "--rung", "7", "--laws", str(laws_file), "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert {b["data_position"] for b in card["predicted_bpb"].values()} == {"inside"}


def _edited(laws_file: Path, tmp_path: Path, edit) -> str:
    data = json.loads(laws_file.read_text())
    edit(data["power_law"]["books"])
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("edit, says", [
    (lambda b: b["params"].update(E=0.5), "floor_at_zero but E = 0.5"),
    (lambda b: b["params"].update(A=b["params"]["A"] * 2), "disagree"),
    (lambda b: b.update(x_range=[0, 0]), "ZeroDivisionError"),
    (lambda b: b.update(x_range=[1]), "IndexError"),
    (lambda b: b.update(x_range="abc"), "TypeError"),
    (lambda b: b.update(prediction="abc"), "power_law.books"),
])
def test_a_hand_edited_laws_file_is_refused_naming_the_domain(laws_file, tmp_path, capsys, edit, says):
    path = _edited(laws_file, tmp_path, edit)
    _refused(capsys, ["extrapolate", "cpu-demo-d2", "--rung", "9", "--laws", path], path, "power_law.books", says)


def test_a_law_fitted_against_another_column_than_training_flops_is_refused(tmp_path, capsys):
    # evaluated at the target's training FLOPs, a law of tokens gave a BPB of the wrong unit and exit 0
    path = tmp_path / "tokens.json"
    assert main(["fit", "power-law", "--csv", str(FIXTURES / "demo_runs.csv"), "--x", "tokens", "--y", "bpb",
                 "--group", "domain", "--floor", "auto", "--bootstrap", "0", "--holdout-top", "0", "--save", str(path),
                 "--json"]) == 0
    _refused(capsys, ["extrapolate", "cpu-demo-d2", "--rung", "9", "--laws", str(path)], "power_law.books",
             "fitted against 'tokens'", "--x train_flops")
    _refused(capsys, ["fit", "iso-bpb", "--laws", str(path)], "fitted against 'tokens'")


def test_fitted_lr_laws_that_overflow_at_the_target_are_refused(tmp_path, capsys):
    law = {"params": {"const": 0.0, "log_steps": 1.0}, "terms": ["log_steps"], "exactly_determined": True}
    hparams = {"hparams": {"selected": {"log_lr": law, "lr_wd_product": {**law, "params": {"const": -5.0}}}}}
    path = tmp_path / "hp.json"
    path.write_text(json.dumps(hparams))  # log LR* = log steps: fine at the probe's 1000 steps, e^huge nowhere
    capsys.readouterr()
    assert main(["extrapolate", "cpu-demo", "--rung", "6", "--laws", str(path), "--json"]) == 0
    law["params"]["log_steps"] = 100.0  # passes no probe: LR = steps^100
    path.write_text(json.dumps(hparams))
    _refused(capsys, ["extrapolate", "cpu-demo", "--rung", "6", "--laws", str(path)], "hparams.selected", "log LR*")


@pytest.mark.parametrize("value, says", [("{dir}", "is a directory, not a file"),
                                          ("{file}/x.png", "which is a file"),
                                          ("x.pdf", "writes PNG"), ("", "an empty path")])
def test_a_plot_path_that_cannot_be_written_is_refused_before_the_card(laws_file, tmp_path, capsys, value, says):
    (tmp_path / "afile").write_text("")
    plot = value.format(dir=tmp_path, file=tmp_path / "afile")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # argparse refuses the flag as it reads it
        main(["extrapolate", "cpu-demo-d2", "--rung", "9", "--laws", str(laws_file), "--plot", plot])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--plot" in err and says in err and "Traceback" not in err


def test_extrapolate_from_runs_says_why_the_lr_wd_laws_are_not_fitted(capsys):
    """The demo's runs hold one LR/WD slice: the card falls back to the recipe's laws, and said why only in the
    JSON's provenance."""
    csv = Path(__file__).parents[2] / "notebooks" / "fixtures" / "demo_runs.csv"
    assert main(["extrapolate", "cpu-demo-d2", "--rung", "9", "--csv", str(csv), "--floor", "auto",
                 "--bootstrap", "0"]) == 0
    err = capsys.readouterr().err
    assert "LR/WD laws not fitted from these runs (the recipe's laws are used): column 'log_lr_wd'" in err
