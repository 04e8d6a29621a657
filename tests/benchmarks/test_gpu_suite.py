"""benchmarks/gpu_suite.py: the GPU benchmarks in one run of bounded wall time. Its budget arithmetic,
the planner's memory flag by card, a real child run in --quick mode, a child killed at its limit with
what it wrote kept and the next child still run, and bad input."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_suite
from benchmarks.gpu_suite import SHARES, device_memory_flag, plan_limits


def test_each_child_gets_its_share_plus_what_the_ones_before_left_never_more_than_is_left():
    names = list(SHARES)
    budget = 470.0
    first = plan_limits(budget, {}, names)
    assert first == pytest.approx(SHARES["gpu_rung"] * budget)
    # gpu_rung used 100 s of its 188: jax_gpu_rung gets its own share and the 88 s left over
    second = plan_limits(budget, {"gpu_rung": 100.0}, names)
    assert second == pytest.approx(SHARES["jax_gpu_rung"] * budget + (first - 100.0))
    # a child that took its whole limit leaves nothing over; the last never gets more than is left
    third = plan_limits(budget, {"gpu_rung": first, "jax_gpu_rung": SHARES["jax_gpu_rung"] * budget}, names)
    assert third == pytest.approx(SHARES["block_kernels"] * budget)
    assert plan_limits(budget, {"gpu_rung": 300.0, "jax_gpu_rung": 160.0, "block_kernels": 9.0}, names) == pytest.approx(1.0)
    assert plan_limits(budget, {"gpu_rung": 300.0, "jax_gpu_rung": 200.0, "block_kernels": 9.0}, names) == 0.0
    # a run of some children shares the whole budget among them
    assert plan_limits(100.0, {}, ["muon"]) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="budget_seconds"):
        plan_limits(0.0, {}, names)


def test_the_planner_lays_l18_out_for_the_cards_marketed_memory():
    assert device_memory_flag("NVIDIA H200") == "141GB"
    assert device_memory_flag("NVIDIA H100 80GB HBM3") == "80GB"
    assert device_memory_flag("Tesla T4") is None and device_memory_flag(None) is None
    # "H200" inside "GH200" is not an H200: a GH200's GPU has 96 GB (its "480GB" is the CPU's memory)
    assert device_memory_flag("NVIDIA GH200 480GB") is None
    assert device_memory_flag("NVIDIA GB200") == "186GB" and device_memory_flag("NVIDIA B200") == "180GB"


def test_a_child_skipped_for_no_time_passes_its_share_on_and_the_next_one_runs(tmp_path):
    """muon's share of 2 s is under a second (skipped); block_kernels then gets its own share and muon's,
    the whole 2 s, and is run (killed at its limit), not skipped with muon's share computed again."""
    summary = gpu_suite.run_suite(tmp_path, budget_seconds=2.0, quick=True, only=["muon", "block_kernels"])
    skipped, ran = summary["results"]["children"]
    assert skipped["name"] == "muon" and skipped["status"] == "skipped"
    assert ran["name"] == "block_kernels" and ran["status"] != "skipped"
    assert ran["limit_seconds"] == pytest.approx(2.0, abs=0.01)


def test_jax_gpu_rung_keeps_its_children_inside_its_max_seconds(monkeypatch):
    """Each child runs to its limit (the clock moves by it; no GPU child can start here): the three children
    together stay within --max-seconds, the later ones skipped and said so when too little is left, so
    gpu_suite, which kills the run a little past its --max-seconds, never loses its JSON."""
    from benchmarks import jax_gpu_rung

    for max_seconds in (128.0, 75.0, 40.0):
        now = [0.0]
        calls: list[tuple[str, float]] = []

        def to_its_limit(args, timeout_s, *, jax_child, calls=calls, now=now):
            calls.append((args[0], timeout_s))
            now[0] += timeout_s
            return {"failed": f"timed out after {timeout_s:g} s", "phase": None}

        monkeypatch.setattr(jax_gpu_rung.time, "monotonic", lambda now=now: now[0])
        monkeypatch.setattr(jax_gpu_rung, "_spawn", to_its_limit)
        results = jax_gpu_rung.run(True, max_seconds=max_seconds).results
        assert sum(t for _, t in calls) <= max_seconds, (max_seconds, calls)
        assert all(t >= jax_gpu_rung.MIN_CHILD_SECONDS for _, t in calls)
        ran = {name for name, _ in calls}
        for child, key in (("torch", "torch"), ("jax", "jax")):
            if child not in ran:
                assert results[key]["failed"].startswith("skipped:"), results[key]


def test_gpu_rung_is_given_the_flag_and_a_limit_inside_its_share():
    rung = next(c for c in gpu_suite.CHILDREN if c.name == "gpu_rung")
    cmd = rung.command(False, 200.0, "141GB")
    assert cmd[cmd.index("--max-seconds") + 1] == "160" and cmd[cmd.index("--gpu-memory") + 1] == "141GB"
    quick = rung.command(True, 200.0, "141GB")
    assert "--quick" in quick and "--gpu-memory" not in quick
    muon = next(c for c in gpu_suite.CHILDREN if c.name == "muon")
    assert "--max-seconds" not in muon.command(False, 50.0, None)


@pytest.mark.slow
def test_a_quick_run_runs_its_child_and_keeps_its_json_and_checks(tmp_path, capsys):
    code = gpu_suite.main(["--out", str(tmp_path), "--only", "muon", "--quick", "--budget-seconds", "400", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    (row,) = summary["results"]["children"]
    assert row["name"] == "muon" and row["status"] == "ok" and code == 0 and row["returncode"] == 0
    child = json.loads((tmp_path / "muon.json").read_text())
    assert child["benchmark"] == "muon" and child["checks"]
    assert [c["name"] for c in summary["checks"]] == [f"muon.{c['name']}" for c in child["checks"]]
    assert summary["machine"]["gpu"] is None or "name" in summary["machine"]["gpu"]


def test_a_child_past_its_limit_is_killed_and_the_next_still_runs(tmp_path, capsys, monkeypatch):
    """block_kernels needs far more than 2.5 s: it is killed with its process group, its stderr kept;
    the suite goes on to the next child with the time that is left, and says so in its exit code."""
    monkeypatch.setattr(gpu_suite, "SHARES", {**SHARES, "block_kernels": 0.625, "muon": 0.375})
    lines: list[str] = []
    summary = gpu_suite.run_suite(tmp_path, budget_seconds=4.0, quick=True, only=["block_kernels", "muon"],
                                      progress=lines.append)
    killed, after = summary["results"]["children"]
    assert killed["status"] == "timed_out" and killed["returncode"] is None
    assert killed["seconds"] >= killed["limit_seconds"] > 0 and (tmp_path / "block_kernels.stderr.txt").exists()
    assert not (tmp_path / "block_kernels.json").exists()
    assert after["name"] == "muon" and after["status"] in ("timed_out", "skipped")
    assert json.loads((tmp_path / "summary.json").read_text())["results"]["children"][0]["status"] == "timed_out"
    assert any("block_kernels timed_out" in line for line in lines)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    for argv in (["--only", "gpu_rung,nonsense"], ["--only", "muon,muon"], ["--budget-seconds", "0"]):
        with pytest.raises(SystemExit) as stop:
            gpu_suite.main(["--out", str(tmp_path), *argv])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "gpu_suite: error:" in err and "Traceback" not in err
    assert not (tmp_path / "summary.json").exists()
