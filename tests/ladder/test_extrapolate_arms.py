"""`ladder fit arms --save` and `ladder extrapolate --laws`: the card's data arms (each arm's EG carried to
the target's compute, its interval and reading), the far-extrapolation warning, and bad input as exit 2
with one line."""

from __future__ import annotations

import json
import math

import pytest

from fits.eg_extrapolate import eg_at
from fits.extrapolate import FAR_EXTRAPOLATION
from ladder.cli import main
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from tests.fits.test_eg_scaling import COMPUTE, runs_table

K = 1.3  # the dedup arm: the baseline's law at 1.3× the compute, so its EG is 1.3 at every scale


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("arms")
    runs_table({"baseline": lambda C: C, "dedup": lambda C: K * C}).to_csv(tmp / "runs.csv", index=False)
    arms = tmp / "arms.json"
    assert main(["fit", "arms", "--csv", str(tmp / "runs.csv"), "--baseline", "baseline", "--domains", "code,web",
                 "--bootstrap", "100", "--save", str(arms), "--json"]) == 0
    return {"dir": tmp, "arms": str(arms)}


def test_the_saved_file_holds_each_arms_trend_and_the_compute_it_was_measured_at(files):
    saved = json.loads(open(files["arms"]).read())["arms"]
    assert saved["baseline"] == "baseline" and set(saved["arms"]["dedup"]) == {"code", "web"}
    cell = saved["arms"]["dedup"]["code"]
    assert cell["train_flops_range"] == pytest.approx([COMPUTE[0], COMPUTE[-1]], rel=1e-12)
    assert {"intercept", "slope", "dof", "cov", "log_compute", "weights"} <= set(cell["trend"])
    assert "baseline_laws" not in saved


def test_the_card_carries_each_arm_to_the_target_with_its_interval(files, capsys):
    target = plan_rung(load_recipe("cpu-demo"), 8, None).train_flops
    assert target < COMPUTE[-1] * FAR_EXTRAPOLATION  # inside the warning's reach
    code, out, err = run(capsys, "extrapolate", "cpu-demo", "--rung", "8", "--laws", files["arms"], "--json")
    assert code == 0 and "warning" not in err
    card = json.loads(out)
    saved = json.loads(open(files["arms"]).read())["arms"]
    assert card["data_arms"]["ci_level"] == 0.95 and card["warnings"] == []
    for domain in ("code", "web"):
        c = card["data_arms"]["baselines"]["baseline"]["dedup"][domain]
        assert c["interval"][0] < K < c["interval"][1]
        assert c["verdict"] in ("gain", "no measured gain")
        assert c["extrapolation_factor"] == pytest.approx(target / COMPUTE[-1], rel=1e-12)
        assert c["data_position"] == "beyond"
        reference = eg_at(saved["arms"]["dedup"][domain], target)  # the one code path, on the saved file
        assert c["eg"] == pytest.approx(reference["eg"], rel=1e-12)
        assert c["interval"] == pytest.approx(reference["interval"], rel=1e-12)
    assert card["provenance"]["arms_files"] == {"baseline": [files["arms"]]}


def test_the_table_has_a_data_arms_section(files, capsys):
    code, out, _ = run(capsys, "extrapolate", "cpu-demo", "--rung", "8", "--laws", files["arms"])
    assert code == 0
    assert "data arms" in out and "recipe card" in out
    rows = [line for line in out.splitlines() if "dedup" in line]
    assert len(rows) == 2 and all("beyond the data" in r for r in rows)


def test_far_beyond_the_arms_compute_the_card_and_stderr_warn(files, capsys):
    code, out, err = run(capsys, "extrapolate", "mai-base-2", "--rung", "102", "--laws", files["arms"],
                         "--arms-baseline", "baseline", "--json")
    assert code == 0
    card = json.loads(out)
    c = card["data_arms"]["baselines"]["baseline"]["dedup"]["code"]
    assert c["extrapolation_factor"] > FAR_EXTRAPOLATION
    (warning,) = [w for w in card["warnings"] if "data arms" in w]
    assert "dedup vs baseline" in warning
    assert f"warning: {warning}" in err


def test_arms_and_power_laws_load_together_and_old_laws_files_still_load(files, tmp_path, capsys):
    laws = tmp_path / "laws.json"
    assert main(["fit", "power-law", "--csv", str(files["dir"] / "runs.csv"), "--x", "train_flops", "--y", "bpb",
                 "--bootstrap", "20", "--floor", "auto", "--select", "all", "--save", str(laws), "--json"]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "extrapolate", "cpu-demo", "--rung", "8", "--laws", str(laws), "--json")
    assert code == 0 and "data_arms" not in json.loads(out)
    code, out, _ = run(capsys, "extrapolate", "cpu-demo", "--rung", "8", "--laws", str(laws), "--laws", files["arms"],
                       "--json")
    card = json.loads(out)
    assert code == 0 and card["predicted_bpb"] and card["data_arms"]["baselines"]["baseline"]["dedup"]


def test_a_bare_fit_arms_json_loads_as_a_laws_file(files, tmp_path, capsys):
    code, out, _ = run(capsys, "fit", "arms", "--csv", str(files["dir"] / "runs.csv"), "--baseline", "baseline",
                       "--domains", "code", "--bootstrap", "50", "--json")
    bare = tmp_path / "bare.json"
    bare.write_text(out)
    code, out, _ = run(capsys, "extrapolate", "cpu-demo", "--rung", "8", "--laws", str(bare), "--json")
    c = json.loads(out)["data_arms"]["baselines"]["baseline"]["dedup"]["code"]
    assert code == 0 and math.isfinite(c["eg"])


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "bad.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("content, says", [
    ('{"arms": [1]}', ["bad.json", "arms"]),
    ('{"arms": {"baseline": "b"}}', ["bad.json", "arms", "baseline"]),
    ('{"arms": {"baseline": "b", "arms": {"dedup": [1]}}}', ["bad.json", "arms.dedup"]),
    ('{"arms": {"baseline": "b", "arms": {"dedup": {"code": {"rungs": []}}}}}', ["bad.json", "arms.dedup.code"]),
])
def test_a_malformed_arms_section_exits_2_with_one_line(tmp_path, capsys, content, says):
    code, out, err = run(capsys, "extrapolate", "cpu-demo", "--rung", "8", "--laws", _write(tmp_path, content))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and all(s in err for s in says)


def test_a_laws_file_without_arms_or_an_unknown_baseline_exits_2_with_one_line(files, tmp_path, capsys):
    empty = _write(tmp_path, json.dumps({"power_law": {}, "hparams": None}))
    code, out, err = run(capsys, "extrapolate", "cpu-demo", "--rung", "8", "--laws", empty, "--arms-baseline", "baseline")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--arms-baseline" in err and "no data arms" in err and "ladder fit arms" in err
    code, out, err = run(capsys, "extrapolate", "cpu-demo", "--rung", "8", "--laws", files["arms"],
                         "--arms-baseline", "control")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "'control'" in err and "['baseline']" in err
