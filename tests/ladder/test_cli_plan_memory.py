"""`ladder plan --gpu-memory`: a layout per rung that fits, the per-rank memory, and bad input."""

from __future__ import annotations

import json
import math

import pytest

from ladder.cli import main

ACCEPTANCE = ["plan", "mai-base-2", "--rungs", "18,24,30,36,42", "--gpus-per-node", "8", "--gpu-memory", "141GB"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_acceptance_command_fits_every_rung(capsys):
    rc, out, _ = run_cli(capsys, *ACCEPTANCE, "--json")
    assert rc == 0
    rungs = json.loads(out)["rungs"]
    assert [r["L"] for r in rungs] == [18, 24, 30, 36, 42]
    for r in rungs:
        lay, mem = r["layout"], r["memory"]
        assert lay["gpus"] == lay["dp"] * lay["ep"] == lay["world"]
        assert lay["nodes"] == math.ceil(lay["gpus"] / 8)
        assert lay["usable_bytes"] == int(141e9 * 0.9)
        assert mem["total"] == sum(mem[k] for k in ("params", "grads", "optimizer", "activations", "buffers"))
        assert 0 < mem["total"] <= lay["usable_bytes"]
        assert r["batch_sequences"] % lay["gpus"] == 0 and r["n_experts"] % lay["ep"] == 0
        per_rank = r["batch_sequences"] // lay["gpus"]
        assert lay["accumulation_steps"] * lay["micro_batch_sequences"] == per_rank
        # expert parallelism runs at the planner's capacity factor, and the config says so
        assert lay["capacity_factor"] == lay["train_config"]["capacity_factor"] == (1.5 if lay["ep"] > 1 else None)
    # larger rungs never need fewer GPUs
    gpus = [r["layout"]["gpus"] for r in rungs]
    assert gpus == sorted(gpus) and gpus[-1] > 8  # L42 spans nodes


def test_table_shows_the_memory_plan(capsys):
    rc, out, _ = run_cli(capsys, *ACCEPTANCE)
    assert rc == 0
    assert "memory plan" in out and "141.0 GB per GPU" in out and "source scaling" in out and "cap×" in out


def test_no_memory_keys_without_the_flag(capsys):
    rc, out, _ = run_cli(capsys, "plan", "mai-base-2", "--rungs", "18", "--json")
    assert rc == 0
    row = json.loads(out)["rungs"][0]
    assert "layout" not in row and "memory" not in row


@pytest.mark.parametrize("argv,words", [
    (["--gpu-memory", "141XB"], ["--gpu-memory", "141XB", "141GB"]),
    (["--gpus-per-node", "8"], ["--gpus-per-node", "needs --gpu-memory"]),
    (["--gpu-memory", "141GB", "--gpus-per-node", "0"], ["--gpus-per-node", "positive"]),
    (["--gpu-memory", "141GB", "--headroom", "1.5"], ["--headroom"]),
    (["--gpu-memory", "8GB", "--max-gpus", "8"], ["L18", "no layout up to 8 GPUs", "params"]),
])
def test_bad_memory_flags_exit_2(capsys, argv, words):
    rc, out, err = run_cli(capsys, "plan", "mai-base-2", "--rungs", "18", *argv)
    assert rc == 2 and out == ""
    assert all(w in err for w in words), err
    assert "Traceback" not in err
