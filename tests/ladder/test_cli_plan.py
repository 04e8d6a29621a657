"""`ladder plan`: the JSON contract, the acceptance command, and exit 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ladder.cli import main
from ladder.plan.recipe import RECIPES_DIR

CONTRACT_FIELDS = {
    "L", "n_layers", "d_model", "n_heads", "head_dim", "n_kv_heads_global", "n_kv_heads_local", "n_experts",
    "top_k", "latent_dim", "expert_hidden", "vocab_size", "params_total", "params_active", "tokens", "tpp",
    "batch_tokens", "steps", "flops_per_token", "train_flops", "sources",
}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_acceptance_command_json(capsys):
    rc, out, _ = run_cli(capsys, "plan", "mai-base-2", "--rungs", "18,24,30,36,42,102", "--gpus", "16000",
                         "--mfu", "0.21", "--goodput", "0.89", "--json")
    assert rc == 0
    payload = json.loads(out)  # stdout is exactly one JSON object
    assert payload["recipe"] == "mai-base-2"
    assert [r["L"] for r in payload["rungs"]] == [18, 24, 30, 36, 42, 102]
    for rung in payload["rungs"]:
        assert CONTRACT_FIELDS | {"wall_clock_days"} <= set(rung)
        for src in rung["sources"].values():
            assert {"unique_tokens", "epochs"} <= set(src)
    top = payload["rungs"][-1]
    assert top["params_total"] == pytest.approx(2.8e12, rel=0.03)
    assert top["params_active"] == pytest.approx(80e9, rel=0.04)
    assert top["wall_clock_days"] == pytest.approx(38, rel=0.06)


def test_no_wall_clock_without_gpus(capsys):
    rc, out, _ = run_cli(capsys, "plan", "cpu-demo", "--json")
    assert rc == 0
    rungs = json.loads(out)["rungs"]
    assert all("wall_clock_days" not in r for r in rungs)
    assert [r["L"] for r in rungs] == [2, 3, 4, 5, 6]


def test_table_by_default(capsys):
    rc, out, _ = run_cli(capsys, "plan", "mai-base-2", "--rungs", "102", "--gpus", "16000")
    assert rc == 0
    assert "8,704" in out and "source scaling" in out and "days" in out


def test_console_script_end_to_end():
    exe = Path(sys.executable).with_name("ladder")
    proc = subprocess.run([str(exe), "plan", "cpu-demo", "--json"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["recipe"] == "cpu-demo"


def write_recipe(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load((RECIPES_DIR / "mai-base-2.yaml").read_text())
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _unknown_key(d):
    d["moe"]["n_expertz"] = 3


def _negative_tpp(d):
    d["tpp"] = -5


def _shares(d):
    d["mixture"][0]["share"] = 0.40


def _missing_size(d):
    del d["mixture"][2]["unique_tokens"]


@pytest.mark.parametrize(
    "mutate,field,words",
    [
        (_unknown_key, "moe.n_expertz", "unknown key"),
        (_negative_tpp, "tpp", "greater than 0"),
        (_shares, "mixture", "sum to 0.95"),
        (_missing_size, "mixture.2.unique_tokens", "missing"),
    ],
)
def test_bad_recipe_exits_2_naming_file_and_field(tmp_path, capsys, mutate, field, words):
    path = write_recipe(tmp_path, mutate)
    rc, out, err = run_cli(capsys, "plan", str(path), "--json")
    assert rc == 2
    assert out == ""
    assert str(path) in err and field in err and words in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_non_integer_width_exits_2(capsys):
    rc, _, err = run_cli(capsys, "plan", "mai-base-2", "--rungs", "20")
    assert rc == 2
    assert "width" in err and "not an integer" in err and "multiples of 3" in err


def test_unknown_recipe_and_bad_flags_exit_2(capsys, tmp_path):
    assert run_cli(capsys, "plan", "no-such-recipe")[0] == 2
    assert run_cli(capsys, "plan", str(tmp_path / "missing.yaml"))[0] == 2
    rc, _, err = run_cli(capsys, "plan", "mai-base-2", "--rungs", "18,x")
    assert rc == 2 and "--rungs" in err
    rc, _, err = run_cli(capsys, "plan", "mai-base-2", "--gpus", "16", "--mfu", "1.5")
    assert rc == 2 and "--mfu" in err
    rc, _, err = run_cli(capsys, "plan", "mai-base-2", "--tpp", "1e6")
    assert rc == 2 and "exceeds the full-scale budget" in err
    with pytest.raises(SystemExit) as exc:
        main(["plan"])
    assert exc.value.code == 2
