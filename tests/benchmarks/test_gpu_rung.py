"""benchmarks/gpu_rung.py end to end in --quick mode (reduced widths, CPU), and its layer fitting."""

from __future__ import annotations

import json

import torch

from benchmarks import gpu_rung


def test_quick_mode_prints_the_contract_json_with_no_host_sync_in_forward_backward(capsys):
    assert gpu_rung.main(["--quick", "--json", "--batch-sequences", "1"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"benchmark", "machine", "results", "checks"} and payload["benchmark"] == "gpu_rung"
    # --quick times the bf16 reference matmul at 512, not 2048 (~100 s of CPU without bf16 units)
    assert payload["machine"]["peak_bf16_matmul_size"] == 512 and payload["machine"]["peak_bf16_flops_measured"] > 0
    results = payload["results"]
    assert results["ran"] and results["n_layers"] == 6 and results["top_k"] == 7
    for key in ("tokens_per_second", "seconds_per_step", "mfu", "achieved_tflops", "peak_memory_bytes"):
        assert results[key] > 0, key
    assert 0 < results["mfu"] < 1 and results["peak_source"].startswith("cpu nominal")
    assert torch.isfinite(torch.tensor(results["final_loss"]))
    # the MoE model's forward and backward read nothing on the host
    assert results["host_syncs_forward_backward"] == 0, results["host_sync_ops_forward_backward"]
    assert [c["name"] for c in payload["checks"]] == ["host_syncs_forward_backward"] and payload["checks"][0]["ok"]


def test_full_mode_without_a_gpu_reports_that_it_did_not_run():
    if torch.cuda.is_available():
        return
    report = gpu_rung.run(False)
    assert report.results["ran"] is False and not report.checks


def test_fitted_layers_grow_with_device_memory_and_stay_within_l18():
    small, large = gpu_rung.fit_layers(80 * 2**30, 8), gpu_rung.fit_layers(141 * 2**30, 8)
    assert 1 <= small < large <= 18
    cfg = gpu_rung.rung_config(False, large)
    assert (cfg.d_model, cfg.n_experts, cfg.top_k, cfg.seq_len, cfg.vocab_size) == (1536, 512, 7, 4096, 131072)
    assert gpu_rung.estimate_bytes(cfg, 8 * 4096)["total"] <= 0.85 * 141 * 2**30


def test_an_out_of_memory_run_retries_with_one_layer_fewer(monkeypatch):
    """The one-shot GPU run still reports when the memory estimate was short (device faked)."""
    from types import SimpleNamespace

    from benchmarks.common import Report

    monkeypatch.setattr(gpu_rung.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_rung.torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=141 * 2**30))
    monkeypatch.setattr(gpu_rung.torch.cuda, "empty_cache", lambda: None)
    tried = []

    def fake_run(quick, cuda, layers, *rest):
        tried.append(layers)
        if layers > 5:
            raise torch.OutOfMemoryError("fake")
        return Report("gpu_rung", {"n_layers": layers})

    monkeypatch.setattr(gpu_rung, "_run", fake_run)
    fitted = gpu_rung.fit_layers(141 * 2**30, 8)
    report = gpu_rung.run(False)
    assert tried == list(range(fitted, 4, -1)) and report.results["n_layers"] == 5
    assert report.results["out_of_memory_at_layers"] == tried[:-1]
