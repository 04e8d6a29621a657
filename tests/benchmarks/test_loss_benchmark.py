"""benchmarks/loss.py: the byte count behind the loss's design (meta device, L18's full shapes) and
the CPU measurement of its candidates."""

from __future__ import annotations

import torch

from benchmarks import loss as loss_bench


def test_the_chunked_path_moves_about_half_the_plain_paths_bytes_per_logit_with_the_same_gemms():
    """At one L18 micro-batch (32,768 tokens, d 1,536, vocabulary 131,072) on the GPU's path (bf16
    operands, fp32 GEMM outputs): the three GEMMs' 39.6 TFLOP either way, and the ops on the logits."""
    counted = loss_bench.traffic()
    flops = loss_bench.gemm_flops(loss_bench.TOKENS, loss_bench.D_MODEL, loss_bench.VOCAB)
    assert flops == 6 * 32_768 * 131_072 * 1_536
    for row in counted.values():
        assert row["gemm_flops"] == flops
    assert counted["chunked_eager"]["bytes_per_logit"] <= 30 < 45 <= counted["plain"]["bytes_per_logit"], counted


def test_the_cpu_measurement_runs_the_chunked_and_plain_loss_and_they_agree():
    torch.set_num_threads(1)
    out = loss_bench.measure(torch.device("cpu"), 256, 16, 512, repeats=1, budget_seconds=60.0)
    rows = out["candidates"]
    assert set(rows) == {"chunked_eager", "plain"} and all(r["ran"] and r["seconds"] > 0 for r in rows.values())
    assert rows["plain"]["loss_abs_error"] < 1e-5 and rows["plain"]["grad_weight_rel_error"] < 1e-5
    report = loss_bench.loss_report(loss_bench.Report("loss", out), out)
    assert [c.name for c in report.checks] == ["loss_chunked_minus_plain"] and report.checks[0].ok
