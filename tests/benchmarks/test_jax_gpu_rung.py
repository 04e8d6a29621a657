"""benchmarks/jax_gpu_rung.py (#19's GPU half) end to end in --quick mode: both engines' own steps, each
in its own child process, on the CPU at reduced widths of mai-base-2 L18, bf16; bad input; and the
full mode's refusal where there is no GPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import jax_gpu_rung


@pytest.mark.slow
def test_quick_mode_steps_both_engines_on_one_config_and_prints_the_contract(capsys):
    assert jax_gpu_rung.main(["--quick", "--json", "--steps", "2"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"benchmark", "machine", "results", "checks"} and payload["benchmark"] == "jax_gpu_rung"
    results = payload["results"]
    assert results["ran"] and results["quick"] and "failed" not in results
    assert (results["recipe"], results["rung"], results["precision"]) == ("mai-base-2", 18, "bf16")
    assert results["batch_tokens"] == results["batch_sequences"] * results["seq_len"]
    vocab = jax_gpu_rung.train_config(True, 2, 2)["vocab_size"]
    for engine in ("torch", "jax"):
        got = results[engine]
        assert got["steps"] == 2 and got["tokens_per_second"] > 0, engine
        # random tokens from an init of std ~0.02: the loss starts near ln(vocab)
        assert abs(got["last_loss"] - math.log(vocab)) < 0.5, (engine, got["last_loss"])
    assert results["jax"]["compute_dtype"] == "bfloat16" and results["jax"]["compile_seconds"] > 0
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
    assert report.results["failed"] == {"torch": "timed out after 0.5 s", "jax": "timed out after 0.5 s"}
    assert not report.checks
