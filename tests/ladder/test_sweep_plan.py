"""`ladder sweep plan SPEC`: every trial with its key, training FLOPs, GPU-hours and days, and the totals,
checked against the rung plan (`ladder plan`) and the compute arithmetic written out here."""

from __future__ import annotations

import json

import pytest

from ladder.cli import main
from sweeps.plan import plan_sweep
from sweeps.spec import load_spec


def _plan(capsys, *argv: str) -> dict:
    assert main(["sweep", "plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def rungs() -> dict[int, dict]:
    from ladder.cli.plan import plan_payload
    from ladder.plan.generator import plan_ladder
    from ladder.plan.recipe import load_recipe
    import argparse

    recipe = load_recipe("mai-base-2")
    args = argparse.Namespace(gpus=None, gpu_memory=None)
    return {r["L"]: r for r in plan_payload(recipe, plan_ladder(recipe, None, None), args)["rungs"]}


def test_the_mai_base_2_ladder_costs_what_its_rungs_do(capsys, rungs):
    out = _plan(capsys, "mai_base_2_ladder")
    assert [t["key"] for t in out["trials"]] == [p.key for p in plan_sweep(load_spec("mai_base_2_ladder"))]
    assert (out["pool"], out["mfu"], out["goodput"], out["peak_flops_per_gpu"]) == ("GB200", 0.21, 0.89, 2.5e15)
    for t in out["trials"]:
        rung = rungs[t["L"]]
        assert t["train_flops"] == pytest.approx(rung["train_flops"], rel=1e-12)
        assert (t["steps"], t["tokens"]) == (rung["steps"], rung["tokens"])
        assert t["gpu_hours"] == pytest.approx(rung["train_flops"] / (2.5e15 * 0.21 * 0.89) / 3600, rel=1e-12)
        assert t["wall_clock_days"] == pytest.approx(t["gpu_hours"] / t["gpus"] / 24, rel=1e-12)
        assert t["fits"] is True and t["peak_bytes"] <= t["usable_bytes"]
    totals = out["totals"]
    assert totals["trials"] == 25
    assert totals["train_flops"] == pytest.approx(5 * sum(r["train_flops"] for r in rungs.values()), rel=1e-12)
    assert totals["gpu_hours"] == pytest.approx(totals["train_flops"] / (2.5e15 * 0.21 * 0.89) / 3600, rel=1e-12)
    assert totals["longest_trial_days"] == max(t["wall_clock_days"] for t in out["trials"]) <= 7


def test_the_stated_mfu_and_goodput_set_the_gpu_hours(capsys):
    base = _plan(capsys, "mai_base_2_ladder")["totals"]
    other = _plan(capsys, "mai_base_2_ladder", "--mfu", "0.42", "--goodput", "0.5")
    assert (other["mfu"], other["goodput"]) == (0.42, 0.5)
    assert other["totals"]["gpu_hours"] == pytest.approx(base["gpu_hours"] * 0.21 * 0.89 / (0.42 * 0.5), rel=1e-12)
    assert other["totals"]["train_flops"] == base["train_flops"]


def test_a_capped_cpu_sweep_counts_the_steps_it_trains_and_has_no_wall_clock(capsys):
    out = _plan(capsys, "smoke")
    configs = {p.key: p.config for p in plan_sweep(load_spec("smoke"))}
    for t in out["trials"]:
        config = configs[t["key"]]
        assert config["max_steps"] == t["steps"] == 20 < config["steps"]
        assert t["train_flops"] == config["flops_per_token"] * 20 * config["batch_sequences"] * config["seq_len"]
        assert t["gpus"] == 0 and t["wall_clock_days"] is None and t["peak_bytes"] is None and t["fits"] is None


def test_the_table_names_every_trial_and_the_totals(capsys):
    assert main(["sweep", "plan", "mai_base_2_ladder"]) == 0
    out = capsys.readouterr().out
    assert "25 trials" in out and "GPU-hours" in out and "MFU 21%" in out and "goodput 89%" in out
    for p in plan_sweep(load_spec("mai_base_2_ladder")):
        assert p.key in out
