"""benchmarks/gpu_rung.py end to end in --quick mode (reduced widths, CPU, 2 micro-batches a step),
its layout and layer fitting from the memory planner, and its out-of-memory retry."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import gpu_rung


def test_quick_mode_steps_the_jobs_step_with_accumulation_and_reports_the_contract_json(capsys):
    assert gpu_rung.main(["--quick", "--json", "--steps", "1"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"benchmark", "machine", "results", "checks"} and payload["benchmark"] == "gpu_rung"
    # --quick times the bf16 reference matmul at 512, on the CPU it ran on
    assert payload["machine"]["peak_bf16_matmul_size"] == 512 and payload["machine"]["peak_bf16_matmul_device"] == "cpu"
    r = payload["results"]
    assert r["ran"] and r["n_layers"] == 6 and r["top_k"] == 7 and r["accumulation_steps"] == 2
    assert r["tokens_per_step"] == 2 * r["micro_batch_sequences"] * r["seq_len"]
    phases = r["phase_seconds"]
    for name in ("forward", "loss", "backward", "optimizer"):
        assert phases[name] > 0, name
    assert sum(phases[k] for k in ("forward", "loss", "backward", "optimizer", "other")) == pytest.approx(phases["step"])
    assert phases["forward"] == pytest.approx(2 * r["phase_seconds_per_micro_batch"]["forward"])
    for key in ("whole_step_mfu", "forward_backward_mfu"):
        assert 0 < r[key] < 1 and r["peak_source"].startswith("cpu nominal")
    assert r["forward_backward_mfu"] > r["whole_step_mfu"]                         # the optimizer takes time too
    assert r["tokens_per_second"] == pytest.approx(r["tokens_per_step"] / phases["step"])
    assert math.isfinite(r["final_loss"]) and r["newton_schulz_flops"] > 0
    assert r["planner_estimate_bytes"]["total"] > 0 and "peak_memory_bytes" not in r      # measured on a GPU
    kernels = r["top_kernels_one_micro_batch"]
    assert kernels and all(k["ms"] > 0 and 0 < k["share"] <= 1 for k in kernels)
    # the job's step reads nothing on the host but AdamW's CPU step counters (read after it)
    assert r["host_syncs_outside_adamw_step_counters"] == 0, r["host_sync_places"]
    assert [c["name"] for c in payload["checks"]] == ["host_syncs_per_step"] and payload["checks"][0]["ok"]


def test_full_mode_without_a_gpu_reports_that_it_did_not_run():
    if torch.cuda.is_available():
        return
    report = gpu_rung.run(False)
    assert report.results["ran"] is False and not report.checks


def test_the_layout_is_the_planners_and_the_fitted_layers_grow_with_device_memory():
    layout = gpu_rung.planned_layout(141 * 10**9)
    assert (layout["micro_batch_sequences"], layout["accumulation_steps"]) == (8, 16)   # L18 on 141-GB GPUs
    small, large = gpu_rung.fit_layers(80 * 2**30, 8, 16), gpu_rung.fit_layers(141 * 10**9, 8, 16)
    assert 1 <= small < large <= 18
    cfg = gpu_rung.train_config(False, large, 8, 16, True)
    assert (cfg.d_model, cfg.n_experts, cfg.top_k, cfg.seq_len, cfg.vocab_size) == (1536, 512, 7, 4096, 131072)
    assert cfg.accumulation_steps == 16 and cfg.n_layers == large and cfg.bf16_on("cuda")
    assert gpu_rung.planner_estimate(cfg, True)["total"] <= 0.9 * 141 * 10**9


def test_an_out_of_memory_run_retries_with_one_layer_fewer(monkeypatch):
    """The one-shot GPU run still reports when the memory estimate was short (device faked)."""
    from types import SimpleNamespace

    from benchmarks.common import Report

    monkeypatch.setattr(gpu_rung.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_rung.torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=141 * 10**9))
    monkeypatch.setattr(gpu_rung.torch.cuda, "empty_cache", lambda: None)
    tried = []

    def fake_run(quick, cuda, layers, *rest):
        tried.append(layers)
        if layers > 5:
            raise torch.OutOfMemoryError("fake")
        return Report("gpu_rung", {"n_layers": layers})

    monkeypatch.setattr(gpu_rung, "_run", fake_run)
    fitted = gpu_rung.fit_layers(141 * 10**9, 8, 16)
    report = gpu_rung.run(False)
    assert tried == list(range(fitted, 4, -1)) and report.results["n_layers"] == 5
    assert report.results["out_of_memory_at_layers"] == tried[:-1]
    assert report.results["planned_layout"]["accumulation_steps"] == 16


def test_on_an_80_gb_card_the_timed_job_recomputes_attention_as_the_planned_layout_does(monkeypatch):
    """The planner lays L18 out on 80 GB with selective activation checkpointing: the job gpu_rung times, its
    fitted layers and its memory estimate take it too (they were built without it, under the layout's name)."""
    from types import SimpleNamespace

    from benchmarks.common import Report
    from ladder.plan.rank_memory import Layout, memory_breakdown

    device_bytes = 80 * 10**9
    layout = gpu_rung.planned_layout(device_bytes)
    assert layout["checkpointing"] == "selective"
    monkeypatch.setattr(gpu_rung.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_rung.torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=device_bytes))
    seen = {}

    def record(quick, cuda, layers, micro, accumulation, steps, deadline, checkpointing="none"):
        seen.update(layers=layers, micro=micro, accumulation=accumulation, checkpointing=checkpointing)
        return Report("gpu_rung", {"n_layers": layers})

    monkeypatch.setattr(gpu_rung, "_run", record)
    gpu_rung.run(False)
    assert seen["checkpointing"] == "selective"
    assert (seen["micro"], seen["accumulation"]) == (layout["micro_batch_sequences"], layout["accumulation_steps"])
    assert seen["layers"] == gpu_rung.fit_layers(device_bytes, seen["micro"], seen["accumulation"], "selective")
    assert seen["layers"] >= gpu_rung.fit_layers(device_bytes, seen["micro"], seen["accumulation"], "none")
    cfg = gpu_rung.train_config(False, 2, seen["micro"], seen["accumulation"], True, "selective")
    assert cfg.activation_checkpointing == "selective"
    estimate = gpu_rung.planner_estimate(cfg, True)
    assert estimate == memory_breakdown(cfg.architecture(), Layout(dp=1, ep=1, micro_batch_sequences=seen["micro"],
                                                                   checkpointing="selective"),
                                        accumulation_steps=seen["accumulation"], lb_loss=cfg.lb_loss_coef > 0,
                                        z_loss=cfg.z_loss_coef > 0).to_dict()
