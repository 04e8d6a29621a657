"""mai-base-2's L18 at its real widths on one GPU: MFU against the spec peak, tokens/s, peak memory,
host synchronisations per training step (issue #21's benchmark; one prepared script, <= 8 minutes).

The model is L18's architecture from the planner (`ladder plan mai-base-2 --rungs 18`: d_model 1536,
512 experts of width 768, top-7, latent 768, seq 4096 with a 1024-token window on 5 of every 6
layers, vocab 131,072) with as many of its 18 layers as fit the device (estimated from the
parameter shapes: fp32 parameters, gradients and optimizer states, plus activations per token;
`--layers` overrides). One training step = forward of `--batch-sequences` sequences of 4096 tokens
under bf16 autocast (loss in token chunks, `rungs.loss`), load-balancing and z losses, backward,
the project's Muon + AdamW step (`rungs.optim.build_optimizer`), zero_grad. Measured:

- seconds per step (CUDA-synchronised wall clock over the timed steps, after two warm-up steps that
  create the optimizer state), tokens/s, and MFU = model FLOPs (the planner's 6·N-style count of
  this many layers, `ladder.plan.counting`) / seconds / the device's spec peak
  (`rungs.metrics.device_peak`: dense bf16 from the datasheet, never a timed matmul);
- peak memory: `torch.cuda.max_memory_allocated` over the timed steps (on the CPU, torch's
  MemTracker over one step);
- host synchronisations per step, two ways: `rungs.host_sync.HostSyncCounter` (reads of device
  values and data-sized ops, by op, any device; forward+backward and optimizer step apart, since
  on the CPU it cannot tell AdamW's CPU-resident step counter from a device value) and, on CUDA,
  the warnings of `torch.cuda.set_sync_debug_mode("warn")` during one step.

Weights are drawn on the device (N(0, init_std), norms 1): the model's own `init_weights` draws on
the CPU for reproducibility, minutes for 5B parameters, and a throughput benchmark needs no
particular values. `--quick` runs the same script at reduced widths on the CPU (the benchmarks
suite and its test); without a GPU the full mode reports that it did not run.
Checks: no host synchronisation in forward+backward; on a GPU, none in the whole step (both
counters) and MFU >= 0.30 (the issue's target,
beyond torchtitan's ~20% for a comparable MoE).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
import time
import warnings
from typing import Any

import torch

from benchmarks.common import Report, print_report
from ladder.plan.counting import count_flops_per_token
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.architecture import init_std, parameter_shapes
from rungs.host_sync import HostSyncCounter
from rungs.metrics import device_peak, utilisation
from rungs.model import ModelConfig, Transformer, rope_tables
from rungs.optim import build_optimizer
from rungs.router import load_balancing_loss, z_loss

RECIPE, RUNG = "mai-base-2", 18
MFU_TARGET = 0.30
LB_COEF, Z_COEF = 0.01, 1e-3
# Reduced widths for --quick (CPU): L18's structure (top-7 of many experts, latent experts, a
# window on 5 of 6 layers, one global layer) at a size a CPU steps through in seconds.
QUICK_WIDTHS = dict(n_layers=6, d_model=64, n_heads=4, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=4,
                    window_tokens=32, seq_len=128, n_experts=16, top_k=7, latent_dim=32, expert_hidden=32,
                    shared_hidden=64, vocab_size=512)


def rung_config(quick: bool, n_layers: int | None = None) -> ModelConfig:
    arch = dataclasses.asdict(plan_rung(load_recipe(RECIPE), RUNG).arch)
    if quick:
        arch |= QUICK_WIDTHS
    if n_layers is not None:
        arch["n_layers"] = n_layers
    return ModelConfig(**arch)


def estimate_bytes(cfg: ModelConfig, tokens_per_step: int) -> dict[str, int]:
    """Device bytes of one training step: fp32 parameters and gradients, Muon momentum (matrices) or
    AdamW moments (embeddings, head, vectors), activations kept for backward, and transients (the
    bf16 expert weights of one layer in forward and backward, one Muon chunk, a loss chunk)."""
    from rungs.loss import LOGITS_PER_CHUNK
    from rungs.muon import NS_CHUNK_BYTES

    state = 0
    for name, shape in parameter_shapes(cfg).items():
        n = math.prod(shape)
        adam = len(shape) < 2 or name.startswith(("embed.", "lm_head."))
        state += n * (16 if adam else 12)
    # bf16 values kept per token and layer, roughly: the MoE's one-round slab (k pairs x (latent +
    # 2 hidden)), attention, norms and the residual stream (~24 d_model values)
    per_token_layer = cfg.top_k * (cfg.latent_dim + 2 * cfg.expert_hidden) + 24 * cfg.d_model
    activations = 2 * per_token_layer * tokens_per_step * cfg.n_layers + 4 * tokens_per_step * cfg.d_model * 4
    expert_bf16 = 2 * 3 * cfg.n_experts * cfg.latent_dim * cfg.expert_hidden * 2
    muon_chunk = min(NS_CHUNK_BYTES, 4 * 3 * cfg.n_experts * cfg.latent_dim * cfg.expert_hidden * cfg.n_layers)
    loss_chunk = min(LOGITS_PER_CHUNK, tokens_per_step * cfg.vocab_size) * 4 * 2
    transient = expert_bf16 + 3 * muon_chunk + loss_chunk
    return {"states": state, "activations": activations, "transient": transient,
            "total": state + activations + transient}


def fit_layers(device_bytes: int, batch_sequences: int, fraction: float = 0.85) -> int:
    """The most of L18's layers (at least 1) whose estimated step fits `fraction` of the device."""
    fitted = 1
    for n in range(1, RUNG + 1):
        cfg = rung_config(False, n)
        if estimate_bytes(cfg, batch_sequences * cfg.seq_len)["total"] <= fraction * device_bytes:
            fitted = n
    return fitted


@torch.no_grad()
def init_on_device(model: Transformer) -> None:
    """The model's init policy (`rungs.architecture.init_std`) drawn on the model's device; RoPE tables,
    router buffers 0."""
    for name, p in model.named_parameters():
        std = init_std(name, model.cfg)
        if std is None:
            p.fill_(1.0)
        else:
            p.normal_(0.0, std)
    for name, buf in model.named_buffers():
        if name in ("rope_cos", "rope_sin"):
            cos, sin = rope_tables(model.cfg.seq_len, model.cfg.head_dim, model.cfg.rope_theta)
            buf.copy_(cos if name == "rope_cos" else sin)
        elif name.endswith(("router.expert_bias", "router.pending_counts")):
            buf.zero_()
        else:
            raise ValueError(f"init_on_device has no rule for buffer {name!r}")


def build(cfg: ModelConfig, device: torch.device):
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device=device)
    init_on_device(model)
    model.train()
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    return model, optimizer


def forward_backward(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """Loss of (B, T+1) tokens and its backward; returns the loss as a device tensor (not read)."""
    cfg = model.cfg
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
        ce, routes = model(tokens[:, :-1], tokens[:, 1:])
    loss = ce + LB_COEF * load_balancing_loss(routes, cfg.n_experts, cfg.top_k) + Z_COEF * z_loss(routes)
    loss.backward()
    return loss.detach()


def optimizer_step(optimizer) -> None:
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train_step(model: Transformer, optimizer, tokens: torch.Tensor) -> torch.Tensor:
    loss = forward_backward(model, tokens)
    optimizer_step(optimizer)
    return loss


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_sync_warnings(step) -> int:
    """Synchronising CUDA calls during `step()`, as `torch.cuda.set_sync_debug_mode("warn")` reports them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def cpu_peak_bytes(step) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:
        step()
    return int(sum(v["Total"] for v in tracker.get_tracker_snapshot("peak").values()))


def run(quick: bool, *, layers: int | None = None, batch_sequences: int | None = None,
        min_seconds: float | None = None, max_steps: int | None = None) -> Report:
    cuda = torch.cuda.is_available() and not quick
    if not quick and not cuda:
        return Report("gpu_rung", {"ran": False, "reason": "no CUDA device: run `python -m benchmarks.gpu_rung "
                                   "--json` on a GPU machine (--quick runs reduced widths on the CPU)"})
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)            # tiny CPU ops: idle-spinning workers only add noise
    batch_sequences = batch_sequences or (8 if cuda else 2)
    if cuda:
        layers = layers or fit_layers(torch.cuda.get_device_properties(0).total_memory, batch_sequences)
    out_of_memory_at: list[int] = []
    try:
        while True:
            try:
                report = _run(quick, cuda, layers, batch_sequences, min_seconds, max_steps)
            except torch.OutOfMemoryError:
                # The estimate was short: one layer fewer (a one-shot GPU run should still report).
                if not cuda or layers is None or layers <= 1 or len(out_of_memory_at) >= 3:
                    raise
                out_of_memory_at.append(layers)
                layers -= 1
            else:
                report.results["out_of_memory_at_layers"] = out_of_memory_at
                return report
            gc.collect()                    # outside the except block: the traceback no longer holds the model
            torch.cuda.empty_cache()
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, cuda: bool, layers: int | None, batch_sequences: int | None, min_seconds: float | None,
         max_steps: int | None) -> Report:
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    batch_sequences = batch_sequences or 2
    results: dict[str, Any] = {"ran": True, "quick": quick, "device": torch.cuda.get_device_name() if cuda else "cpu",
                               "recipe": RECIPE, "rung": RUNG, "precision": "bf16 autocast, fp32 master weights"}
    if cuda:
        torch.set_float32_matmul_precision("high")              # TF32 for the fp32 GEMMs (the router's)
        results["device_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.reset_peak_memory_stats(device)
        n_layers = layers or 1
    else:
        n_layers = layers or QUICK_WIDTHS["n_layers"]
    cfg = rung_config(quick, n_layers)
    tokens_per_step = batch_sequences * cfg.seq_len
    results |= {"n_layers": n_layers, "of_layers": RUNG, "batch_sequences": batch_sequences, "seq_len": cfg.seq_len,
                "tokens_per_step": tokens_per_step, "d_model": cfg.d_model, "n_experts": cfg.n_experts,
                "top_k": cfg.top_k, "expert_hidden": cfg.expert_hidden, "vocab_size": cfg.vocab_size,
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "estimated_bytes": estimate_bytes(cfg, tokens_per_step)}
    t0 = time.perf_counter()
    model, optimizer = build(cfg, device)
    _synchronize(device)
    results["build_seconds"] = time.perf_counter() - t0
    results["params"] = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, cfg.vocab_size, (batch_sequences, cfg.seq_len + 1), generator=gen).to(device)
               for _ in range(2)]

    def step(i: int = 0) -> torch.Tensor:
        return train_step(model, optimizer, batches[i % 2])

    for i in range(2):                                           # optimizer state, allocator, kernels
        step(i)
    _synchronize(device)
    # On a GPU only ops on device tensors count; on the CPU every read does, which includes
    # AdamW's step counters (CPU tensors on a GPU too, so no device sync there): reported apart.
    counters = {"forward_backward": HostSyncCounter(accelerator_only=cuda),
                "optimizer_step": HostSyncCounter(accelerator_only=cuda)}
    with counters["forward_backward"]:
        forward_backward(model, batches[0])
    with counters["optimizer_step"]:
        optimizer_step(optimizer)
    for phase, counter in counters.items():
        results[f"host_syncs_{phase}"] = counter.total
        results[f"host_sync_ops_{phase}"] = {op: [n, counter.where[op]] for op, n in counter.counts.items()}
        # higher-order ops run whole, uncounted inside (FlexAttention if it ran uncompiled)
        results[f"host_sync_uninspected_{phase}"] = dict(counter.uninspected)
    results["host_syncs_per_step"] = sum(c.total for c in counters.values())
    if cuda:
        results["cuda_sync_debug_syncs_per_step"] = cuda_sync_warnings(step)
        torch.cuda.reset_peak_memory_stats(device)
    min_seconds = min_seconds if min_seconds is not None else (60.0 if cuda else 0.0)
    max_steps, min_steps = max_steps or (30 if cuda else 2), 3 if cuda else 1
    _synchronize(device)
    t0, steps, last = time.perf_counter(), 0, None
    while True:                  # at least min_steps, then until min_seconds have passed or max_steps ran
        last = step(steps)
        steps += 1
        if steps >= max_steps or (steps >= min_steps and time.perf_counter() - t0 >= min_seconds):
            break
    _synchronize(device)
    seconds = (time.perf_counter() - t0) / steps
    results["final_loss"] = float(last) if last is not None else math.nan
    results["timed_steps"] = steps
    results["seconds_per_step"] = seconds
    results["tokens_per_second"] = tokens_per_step / seconds
    flops = count_flops_per_token(cfg)
    results["model_flops_per_token"] = 3 * flops.forward
    peak = device_peak(device.type)
    util = utilisation(3 * flops.forward * tokens_per_step, seconds, devices=1, peak=peak)
    results |= {"mfu": util.mfu, "achieved_tflops": util.achieved_flops_per_device / 1e12,
                "peak_tflops": (peak.flops or math.nan) / 1e12, "peak_source": peak.source, "mfu_capped": util.mfu_capped}
    if cuda:
        results["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        results["peak_memory_source"] = "torch.cuda.max_memory_allocated"
    else:
        results["peak_memory_bytes"] = cpu_peak_bytes(step)
        results["peak_memory_source"] = "MemTracker, one step"
    results["estimate_over_peak"] = results["estimated_bytes"]["total"] / results["peak_memory_bytes"]

    report = Report("gpu_rung", results)
    report.check("host_syncs_forward_backward", results["host_syncs_forward_backward"], "==", 0)
    if cuda:
        report.check("host_syncs_per_step", results["host_syncs_per_step"], "==", 0)
        report.check("cuda_sync_debug_syncs_per_step", results["cuda_sync_debug_syncs_per_step"], "==", 0)
        report.check("mfu", util.mfu, ">=", MFU_TARGET)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_rung", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced widths on the CPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--layers", type=int, help="layers of L18 to build (default: as many as fit)")
    parser.add_argument("--batch-sequences", type=int, help="sequences per step (default 8 on a GPU, 2 quick)")
    parser.add_argument("--min-seconds", type=float, help="time steps for at least this long (default 60 on a GPU)")
    args = parser.parse_args(argv)
    report = run(args.quick, layers=args.layers, batch_sequences=args.batch_sequences, min_seconds=args.min_seconds)
    print_report(report, quick=args.quick, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
