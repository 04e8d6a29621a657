"""benchmarks/jax_gpu_rung.py end to end in --quick mode: the grouped-matmul candidates and both
engines' own steps, each in its own child process, on the CPU at reduced widths of mai-base-2 L18,
bf16; a failing JAX child reports its phase and memory analysis; bad input; and the full mode's
refusal where there is no GPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import jax_gpu_rung


@pytest.mark.slow
def test_quick_mode_steps_both_engines_on_one_config_and_prints_the_contract(capsys):
    # One layer and one sequence a step, not the quick defaults' two and two: the contract and the code
    # path are the same (the quick model's layers are all sliding-window MoE layers, global_every=6, so a
    # second layer is the same code again); each engine traces and compiles one layer, and its steps and
    # the candidates' calls see half the tokens. That the two flags took effect is checked below.
    assert jax_gpu_rung.main(["--quick", "--json", "--steps", "2", "--layers", "1", "--batch-sequences", "1"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"benchmark", "machine", "results", "checks"} and payload["benchmark"] == "jax_gpu_rung"
    results = payload["results"]
    assert results["ran"] and results["quick"] and "failed" not in results
    assert (results["recipe"], results["rung"], results["precision"]) == ("mai-base-2", 18, "bf16")
    assert (results["layers"], results["batch_sequences"]) == (1, 1)
    assert results["batch_tokens"] == results["batch_sequences"] * results["seq_len"]
    assert results["grouped_matmul"]["rows"] == results["batch_tokens"] * jax_gpu_rung.train_config(True, 1, 1)["top_k"]
    vocab = jax_gpu_rung.train_config(True, 1, 1)["vocab_size"]
    for engine in ("torch", "jax"):
        got = results[engine]
        assert got["steps"] == 2 and got["tokens_per_second"] > 0, engine
        # random tokens from an init of std ~0.02: the loss starts near ln(vocab)
        assert abs(got["last_loss"] - math.log(vocab)) < 0.5, (engine, got["last_loss"])
    assert results["jax"]["compute_dtype"] == "bfloat16" and results["jax"]["compile_seconds"] > 0
    assert set(results["jax"]["memory_analysis"]) == {"grads", "update"}
    table = results["grouped_matmul"]["candidates"]
    assert list(table) == list(jax_gpu_rung.CANDIDATES)
    for name, row in table.items():  # every candidate ran and agrees with the first
        assert row["seconds"] > 0 and row["max_relative_difference"] <= jax_gpu_rung.CANDIDATE_TOLERANCE, name
    # the dense ragged_dot lowering shows in its memory: (E, rows, K) against the blocks' rows
    assert table["ragged"]["memory_analysis"]["temp_bytes"] > 4 * table["blocks"]["memory_analysis"]["temp_bytes"]
    assert results["jax_moe_backend"] == jax_gpu_rung.best_candidate(results["grouped_matmul"])
    assert results["jax"]["moe_backend"] == results["jax_moe_backend"]
    ratio = results["jax"]["tokens_per_second"] / results["torch"]["tokens_per_second"]
    assert results["jax_over_torch_tokens_per_second"] == pytest.approx(ratio)
    assert [c["name"] for c in payload["checks"]] == ["jax_over_torch_tokens_per_second"]
    assert payload["checks"][0]["target"] == jax_gpu_rung.RATIO_TARGET


def test_the_config_is_l18_at_its_real_widths_with_the_layers_and_batch_asked_for():
    cfg = jax_gpu_rung.train_config(False, 3, 4)
    assert (cfg["d_model"], cfg["n_experts"], cfg["top_k"], cfg["seq_len"], cfg["vocab_size"]) == (
        1536, 512, 7, 4096, 131072)
    assert (cfg["n_layers"], cfg["batch_sequences"], cfg["precision"]) == (3, 4, "bf16")


def test_bad_sizes_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match="steps"):
        jax_gpu_rung.run(True, steps=0)
    with pytest.raises(ValueError, match="layers"):
        jax_gpu_rung.run(True, layers=-1, steps=1)


def test_full_mode_without_a_gpu_says_why_it_did_not_run():
    if torch.cuda.is_available():  # the full mode would run for real (minutes): the probe alone
        reason = jax_gpu_rung.gpu_missing()
        assert reason is None or "no GPU backend" in reason, reason
        return
    report = jax_gpu_rung.run(False)
    assert report.results["ran"] is False and not report.checks
    assert "no CUDA device" in report.results["reason"]


def test_a_child_that_does_not_finish_is_reported_failed_with_no_check():
    report = jax_gpu_rung.run(True, steps=1, timeout_s=0.5)
    assert report.results["failed"] == {name: "timed out after 0.5 s" for name in ("torch", "jax", "grouped_matmul")}
    assert not report.checks


@pytest.mark.slow
def test_a_failing_jax_child_reports_the_phase_it_was_in_and_the_memory_it_had(tmp_path, monkeypatch):
    # a fault injected where the update program is traced: the gradient program compiled first
    import rungs.jaxjob.engine as engine

    def broken(cfg, tx):
        def update(params, opt_state, g):
            raise MemoryError("out of device memory (injected)")
        return update
    monkeypatch.setattr(engine, "update_function", broken)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(jax_gpu_rung.train_config(True, 1, 1)))
    got = jax_gpu_rung._child("jax", str(path), 1, 1, "blocks")
    assert got["failed"] == "set-up (compile: update program): MemoryError"
    assert "injected" in got["error"]
    assert set(got["memory_analysis"]) == {"grads"} and got["memory_analysis"]["grads"]["total_bytes"] > 0


def test_the_fastest_agreeing_candidate_is_chosen_and_a_killed_child_names_its_last_phase():
    table = {"candidates": {"blocks": {"seconds": 2.0, "max_relative_difference": 0.0},
                            "pallas": {"seconds": 1.0, "max_relative_difference": 1e-3},
                            "ragged": {"seconds": 0.5, "max_relative_difference": 0.5},   # fast and wrong
                            "other": {"failed": "TritonError"}}}
    assert jax_gpu_rung.best_candidate(table) == "pallas"
    assert jax_gpu_rung.best_candidate({"failed": "exit 1"}) is None
    assert jax_gpu_rung._last_phase("noise\nphase: compile: both programs\nphase: warm-up step 0\nTraceback") == \
        "warm-up step 0"


def test_bad_candidates_are_refused():
    with pytest.raises(ValueError, match="candidates"):
        jax_gpu_rung.run(True, steps=1, candidates=("cublas",))
    assert jax_gpu_rung.main(["--quick", "--moe-backend", "cudnn"]) == 2
