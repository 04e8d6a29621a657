"""mai-base-2's L18 on one GPU, stepped as the job steps it: MFU of the whole step and of forward +
backward, tokens/s, the step's phases, peak memory against the planner's estimate, top kernels, host
synchronisations, and the loss against its GEMMs (one prepared script, <= 8 minutes on an H200).

- The layout is the memory planner's for L18 (`ladder.plan.memory.choose_layout` on this device's
  memory: 8 sequences of 4,096 tokens a micro-batch and 16 micro-batches a step per rank on a 141-GB
  GPU); the model is L18's architecture with as many of its 18 layers as the planner says fit one
  device (`--layers` overrides); the config is the job's (`ladder.plan.resolve`), bf16 on a GPU.
- The step is the job's own (`rungs.torch_engine.train_step_on_device`: every micro-batch's forward
  and backward, activation gradient clipping, the global grad-norm clip, one Muon + AdamW step), its
  statistics read after it (`read_step_stats`), as `TorchEngine.train_step` does.
- Timed: 2 warm-up steps (optimizer state, compiled kernels), then `--steps` steps; phases by CUDA
  events from hooks (`benchmarks.step_phases`), nothing timed on the host during a GPU run. MFU =
  the planner's model FLOPs (`flops_per_token`, 6N-style, of this many layers) / seconds / the
  device's dense bf16 spec peak (`rungs.metrics.device_peak`).
- Beside the step: the loss at one micro-batch's shapes with its alternatives (`benchmarks.loss`),
  the optimizer's time over its Newton-Schulz GEMMs at the measured bf16 rate, host syncs counted by
  op (`rungs.host_sync.HostSyncCounter`) and by `torch.cuda.set_sync_debug_mode` (with the lines
  that made them), `torch.profiler`'s top kernels of one micro-batch.

Weights are drawn on the device (the model's init rule, `rungs.architecture.init_std`): drawing on
the CPU takes minutes for 5B parameters. `--quick` runs the same script on the CPU at reduced widths
with 2 micro-batches a step; without a GPU the full mode reports that it did not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
import time
import traceback
from typing import Any

import torch

from benchmarks import loss as loss_bench
from benchmarks.common import GPU_PEAK_MATMUL_SIZE, Report, measured_peak_bf16_flops, print_report, random_token_batch
from benchmarks.step_phases import PhaseClock, cuda_syncs, kernel_table
from ladder.plan.generator import plan_rung
from ladder.errors import LadderInputError
from ladder.plan.memory import DEFAULT_HEADROOM, Layout, choose_layout, memory_breakdown, parse_bytes
from ladder.plan.recipe import load_recipe
from ladder.plan.resolve import resolve_train_config
from rungs.agc import ActivationGradClipper
from rungs.architecture import ModelConfig, init_std
from rungs.config import TrainConfig, parse_config
from rungs.host_sync import HostSyncCounter
from rungs.loss import loss_chunk_tokens
from rungs.metrics import device_peak, utilisation
from rungs.model import Transformer
from rungs.optim import build_optimizer
from rungs.torch_engine import read_step_stats, train_step_on_device

RECIPE, RUNG = "mai-base-2", 18
TARGETS = {"whole_step_mfu": 0.30, "forward_backward_mfu": 0.35, "optimizer_over_newton_schulz_gemms": 1.5,
           "optimizer_share_of_step": 0.05, "peak_memory_error_vs_planner": 0.15}
# Reduced widths for --quick (CPU): L18's structure (top-7 of many experts, latent experts, a
# window on 5 of 6 layers, one global layer) at a size a CPU steps through in seconds.
QUICK_WIDTHS = dict(n_layers=6, d_model=64, n_heads=4, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=4,
                    window_tokens=32, seq_len=128, n_experts=16, top_k=7, latent_dim=32, expert_hidden=32,
                    shared_hidden=64, vocab_size=512)
QUICK_MICRO_SEQUENCES, QUICK_ACCUMULATION = 1, 2
LOSS_BUDGET_SECONDS = 150.0  # the most the loss candidates' comparison takes of a GPU run


def planned_layout(device_bytes: int) -> dict[str, Any]:
    """The planner's L18 layout for GPUs of `device_bytes` (`LayoutChoice.to_dict()`): per-rank
    micro-batch sequences and accumulation steps."""
    spec = plan_rung(load_recipe(RECIPE), RUNG)
    return choose_layout(spec.arch, batch_sequences=spec.batch_sequences, gpu_memory_bytes=device_bytes).to_dict()


def train_config(quick: bool, n_layers: int, micro: int, accumulation: int, cuda: bool,
                 checkpointing: str = "none") -> TrainConfig:
    """The job's config of L18 (quick: reduced widths) with `n_layers` layers, this accumulation and the
    layout's activation checkpointing."""
    overrides: dict[str, Any] = dict(QUICK_WIDTHS) if quick else {}
    overrides |= {"n_layers": n_layers, "micro_batch_sequences": micro, "batch_sequences": micro * accumulation,
                  "activation_checkpointing": checkpointing,
                  "tracking_uri": None, "device": "cuda" if cuda else "cpu", "precision": "bf16" if cuda else "fp32"}
    return parse_config(resolve_train_config(RECIPE, RUNG, overrides))


def planner_estimate(cfg: TrainConfig, cuda: bool, device_bytes: int | None = None) -> dict[str, Any]:
    """`memory_breakdown` of this model on one process (dp = ep = 1) at the config's micro-batch, its
    loss chunked as on a device of `device_bytes` (None: the CPU)."""
    layout = Layout(dp=1, ep=1, micro_batch_sequences=cfg.micro_batch_sequences, precision="bf16" if cuda else "fp32",
                    checkpointing=cfg.activation_checkpointing)
    return memory_breakdown(cfg.architecture(), layout, accumulation_steps=cfg.accumulation_steps,
                            lb_loss=cfg.lb_loss_coef > 0, z_loss=cfg.z_loss_coef > 0,
                            device_memory_bytes=device_bytes).to_dict()


def fit_layers(device_bytes: int, micro: int, accumulation: int, checkpointing: str = "none") -> int:
    """The most of L18's layers (at least 1) whose planned peak fits the device less the planner's headroom."""
    arch = train_config(False, 1, micro, accumulation, True, checkpointing).architecture()
    layout = Layout(dp=1, ep=1, micro_batch_sequences=micro, precision="bf16", checkpointing=checkpointing)
    fitted = 1
    for n in range(1, RUNG + 1):
        planned = memory_breakdown(dataclasses.replace(arch, n_layers=n), layout, accumulation_steps=accumulation,
                                   device_memory_bytes=device_bytes)
        if planned.total <= (1 - DEFAULT_HEADROOM) * device_bytes:
            fitted = n
    return fitted


@torch.no_grad()
def init_on_device(model: Transformer) -> None:
    """The model's init policy (`rungs.architecture.init_std`) drawn on the model's device; the buffers
    as the model sets them (`Transformer.init_buffers`)."""
    for name, p in model.named_parameters():
        std = init_std(name, model.cfg)
        if std is None:
            p.fill_(1.0)
        else:
            p.normal_(0.0, std)
    model.init_buffers()


def build_model(arch: ModelConfig, device: torch.device) -> Transformer:
    """The model of `arch` in training mode, built on the meta device and drawn on `device`."""
    with torch.device("meta"):
        model = Transformer(arch)
    model.to_empty(device=device)
    init_on_device(model)
    return model.train()


def build(cfg: TrainConfig, device: torch.device):
    """Model, optimizer and activation clipper as `TorchEngine.build` makes them (weights drawn on the device)."""
    model = build_model(cfg.architecture(), device)
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_lr=cfg.adam_lr,
                                muon_momentum=cfg.muon_momentum, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
                                adjust_lr=cfg.adjust_lr)
    settings = cfg.agc_settings()
    clipper = ActivationGradClipper(settings) if settings else None
    if clipper is not None:
        model.activation_clip = clipper
    return model, optimizer, clipper


def newton_schulz_flops(optimizer) -> float:
    """GEMM FLOPs of one Muon step's Newton-Schulz: per iteration and (m, n) matrix, s = min(m, n),
    l = max: X Xᵀ (2 s² l), A·A (2 s³), B X (2 s² l)."""
    total = 0.0
    for group in optimizer.muon.param_groups if optimizer.muon is not None else []:
        for p in group["params"]:
            m, n = p.shape[-2:]
            s, big = min(m, n), max(m, n)
            total += (p.shape[0] if p.ndim == 3 else 1) * group["ns_steps"] * (4.0 * s * s * big + 2.0 * s**3)
    return total


class _NoOptimizerStep:
    """The optimizer with its update left out: the profile of one micro-batch's forward and backward."""

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


class _SyncPlaces(HostSyncCounter):
    """HostSyncCounter that keeps every place (innermost frame outside torch: file, function, line)."""

    def __init__(self, accelerator_only: bool) -> None:
        super().__init__(accelerator_only=accelerator_only)
        self.places: list[tuple[str, str]] = []

    def _record(self, key: str) -> None:
        super()._record(key)
        frames = [f for f in traceback.extract_stack() if "/torch/" not in f.filename
                  and not f.filename.endswith(("host_sync.py", "gpu_rung.py"))]
        f = frames[-1] if frames else None
        self.places.append((key, f"{f.filename}:{f.name}:{f.lineno}" if f else "?"))


def _in_optimizer_step(where: str) -> bool:
    path, function, _ = where.rsplit(":", 2)
    return path.endswith("rungs/optim.py") and function == "step"


def run(quick: bool, *, layers: int | None = None, micro: int | None = None, accumulation: int | None = None,
        steps: int | None = None, gpu_memory_bytes: int | None = None, max_seconds: float = 480.0) -> Report:
    """`gpu_memory_bytes`: the memory the planner lays L18 out for (default: this device's);
    `max_seconds`: the timed steps stop early (after one) when the run would pass it."""
    deadline = time.perf_counter() + max_seconds
    cuda = torch.cuda.is_available() and not quick
    if not quick and not cuda:
        return Report("gpu_rung", {"ran": False, "reason": "no CUDA device: run `python -m benchmarks.gpu_rung "
                                   "--json` on a GPU machine (--quick runs reduced widths on the CPU)"})
    threads = torch.get_num_threads()
    layout: dict[str, Any] | None = None
    if cuda:
        device_bytes = torch.cuda.get_device_properties(0).total_memory
        layout = planned_layout(gpu_memory_bytes or device_bytes)
        own = planned_layout(device_bytes) if gpu_memory_bytes else layout
        layout["for_this_devices_memory"] = {k: own[k] for k in ("gpus", "dp", "ep", "micro_batch_sequences",
                                                                 "accumulation_steps", "checkpointing")}
        micro = micro or layout["micro_batch_sequences"]
        accumulation = accumulation or layout["accumulation_steps"]
        checkpointing = layout["checkpointing"]  # the layout's: on an 80 GB card the planner recomputes attention
        layers = layers or fit_layers(device_bytes, micro, accumulation, checkpointing)
    else:
        torch.set_num_threads(1)            # tiny CPU ops: idle-spinning workers only add noise
        micro, accumulation = micro or QUICK_MICRO_SEQUENCES, accumulation or QUICK_ACCUMULATION
        layers = layers or QUICK_WIDTHS["n_layers"]
        checkpointing = "none"
    out_of_memory_at: list[int] = []
    try:
        while True:
            try:
                report = _run(quick, cuda, layers, micro, accumulation, steps or (3 if cuda else 2), deadline,
                              checkpointing)
            except torch.OutOfMemoryError:
                # The estimate was short: one layer fewer (a one-shot GPU run should still report).
                if not cuda or layers <= 1 or len(out_of_memory_at) >= 3:
                    raise
                out_of_memory_at.append(layers)
                layers -= 1
            else:
                report.results["out_of_memory_at_layers"] = out_of_memory_at
                report.results["planned_layout"] = layout
                return report
            gc.collect()                    # outside the except block: the traceback no longer holds the model
            torch.cuda.empty_cache()
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool, cuda: bool, layers: int, micro: int, accumulation: int, steps: int, deadline: float,
         checkpointing: str = "none") -> Report:
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    cfg = train_config(quick, layers, micro, accumulation, cuda, checkpointing)
    tokens_per_micro = micro * cfg.seq_len
    tokens_per_step = tokens_per_micro * accumulation
    r: dict[str, Any] = {"ran": True, "quick": quick, "device": torch.cuda.get_device_name() if cuda else "cpu",
                         "recipe": RECIPE, "rung": RUNG, "precision": "bf16 autocast, fp32 master weights" if cuda
                         else "fp32", "n_layers": layers, "of_layers": RUNG, "micro_batch_sequences": micro,
                         "accumulation_steps": accumulation, "activation_checkpointing": cfg.activation_checkpointing,
                         "seq_len": cfg.seq_len, "tokens_per_step": tokens_per_step,
                         "d_model": cfg.d_model, "n_experts": cfg.n_experts, "top_k": cfg.top_k,
                         "vocab_size": cfg.vocab_size, "agc": cfg.agc, "grad_clip": cfg.grad_clip,
                         "loss_chunk_tokens": loss_chunk_tokens(tokens_per_micro, cfg.vocab_size, device),
                         "planner_estimate_bytes": planner_estimate(
                             cfg, cuda, torch.cuda.get_device_properties(0).total_memory if cuda else None)}
    if cuda:
        torch.set_float32_matmul_precision("high")              # TF32 for the fp32 GEMMs (the router's)
        r["device_memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        r["measured_bf16_flops"] = measured_peak_bf16_flops(GPU_PEAK_MATMUL_SIZE, device="cuda")
        # the loss's candidates first, while the device's memory is free; at most 150 s and 40% of the time
        # left, so the step's own timing still fits `max_seconds` (gpu_suite kills the run a little past it)
        loss_budget = min(LOSS_BUDGET_SECONDS, max(5.0, 0.4 * (deadline - time.perf_counter())))
        r["loss"] = loss_bench.measure(device, tokens_per_micro, cfg.d_model, cfg.vocab_size, repeats=5,
                                       budget_seconds=loss_budget)
        torch.cuda.empty_cache()
    model, optimizer, clipper = build(cfg, device)
    r["params"] = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(1)
    # host batches, as the sampler hands them to the step (which copies each micro-batch to the device)
    batches = [random_token_batch(torch.randint(0, cfg.vocab_size, (micro * accumulation, cfg.seq_len + 1),
                                                generator=gen)) for _ in range(2)]
    step_no = 0

    def device_step(step_cfg: TrainConfig = cfg, opt=optimizer) -> torch.Tensor:
        if clipper is not None:
            clipper.begin_step(step_no)
        return train_step_on_device(step_cfg, model, opt, batches[step_no % 2], clipper, None)

    def finish(stats: torch.Tensor) -> dict[str, float]:
        nonlocal step_no
        values = read_step_stats(stats)                 # the step's one host read, after it
        if clipper is not None:
            clipper.end_step()
            clipper.drain_events()
        if cfg.expert_bias:
            for block in model.layers:
                block.moe.router.update_bias()
        step_no += 1
        return values

    for _ in range(2 if cuda else 1):                   # optimizer state, compiled kernels, AGC history
        finish(device_step())
    counter = _SyncPlaces(accelerator_only=cuda)
    with counter:
        stats = device_step()
    finish(stats)
    # on the CPU the counter sees every read, AdamW's CPU step counters too (CPU tensors on a GPU as
    # well, where the counter does not count them): their reads come from inside MuonAdamW.step
    outside_adamw = [k for k, where in counter.places if cuda or not _in_optimizer_step(where)]
    r |= {"host_syncs_per_step": counter.total, "host_sync_places": sorted(set(w for _, w in counter.places)),
          "host_syncs_outside_adamw_step_counters": len(outside_adamw),
          "host_sync_uninspected": dict(counter.uninspected)}
    if cuda:
        holder: dict[str, torch.Tensor] = {}
        n_syncs, places = cuda_syncs(lambda: holder.setdefault("stats", device_step()))
        finish(holder["stats"])
        r |= {"cuda_syncs_per_step": n_syncs, "cuda_sync_places": places}
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    phases: list[dict[str, float]] = []
    for _ in range(steps):
        with PhaseClock(model, optimizer, cuda) as clock:
            stats = device_step()
        values = finish(stats)
        phases.append(clock.seconds())
        # the host clock only decides whether one more step fits the script's budget (2 steps: the profile's)
        if time.perf_counter() + 2 * phases[-1]["step"] > deadline:
            break
    r["final_loss"] = values["loss"]
    r["timed_steps"] = len(phases)
    r["phase_seconds"] = {k: sorted(p[k] for p in phases)[len(phases) // 2] for k in phases[0]}
    r["phase_seconds_per_micro_batch"] = {k: r["phase_seconds"][k] / accumulation
                                          for k in ("forward", "loss", "backward")}
    if cuda:
        r["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        r["peak_over_planner_estimate"] = r["peak_memory_bytes"] / r["planner_estimate_bytes"]["total"]
    # (on the CPU tests/ladder/plan/test_memory.py holds the planner to torch's MemTracker at small shapes)
    _utilisation(r, cfg, optimizer, device, tokens_per_step)
    one_micro = cfg.model_copy(update={"batch_sequences": micro})
    r["top_kernels_one_micro_batch"] = kernel_table(
        lambda: finish(device_step(one_micro, _NoOptimizerStep(optimizer))), cuda)
    return _checks(Report("gpu_rung", r, device=device.type), r, cuda)


def _utilisation(r: dict[str, Any], cfg: TrainConfig, optimizer, device: torch.device, tokens: int) -> None:
    ph = r["phase_seconds"]
    flops = cfg.flops_per_token * tokens
    peak = device_peak(device.type, cores=torch.get_num_threads())
    whole = utilisation(flops, ph["step"], devices=1, peak=peak)
    fb_seconds = ph["forward"] + ph["loss"] + ph["backward"]
    fb = utilisation(flops, fb_seconds, devices=1, peak=peak)
    rate = r.get("measured_bf16_flops")
    ns = newton_schulz_flops(optimizer)
    r |= {"model_flops_per_step": flops, "seconds_per_step": ph["step"], "tokens_per_second": tokens / ph["step"],
          "whole_step_mfu": whole.mfu, "forward_backward_mfu": fb.mfu, "mfu_capped": whole.mfu_capped or fb.mfu_capped,
          "achieved_tflops": whole.achieved_flops_per_device / 1e12, "peak_tflops": (peak.flops or math.nan) / 1e12,
          "peak_source": peak.source, "newton_schulz_flops": ns,
          "optimizer_share_of_step": ph["optimizer"] / ph["step"],
          "optimizer_over_newton_schulz_gemms": ph["optimizer"] / (ns / rate) if rate and ns else None}


def _checks(report: Report, r: dict[str, Any], cuda: bool) -> Report:
    report.check("host_syncs_per_step", r["host_syncs_outside_adamw_step_counters"], "==", 0)
    if not cuda:
        return report
    report.check("cuda_syncs_per_step", r["cuda_syncs_per_step"], "==", 0)
    for name in ("whole_step_mfu", "forward_backward_mfu"):
        report.check(name, r[name], ">=", TARGETS[name])
    loss_bench.loss_report(report, r["loss"])
    if r["optimizer_over_newton_schulz_gemms"] is not None:
        report.check("optimizer_over_newton_schulz_gemms", r["optimizer_over_newton_schulz_gemms"], "<=",
                     TARGETS["optimizer_over_newton_schulz_gemms"])
    report.check("optimizer_share_of_step", r["optimizer_share_of_step"], "<=", TARGETS["optimizer_share_of_step"])
    report.check("peak_memory_error_vs_planner", abs(r["peak_over_planner_estimate"] - 1), "<=",
                 TARGETS["peak_memory_error_vs_planner"])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_rung", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced widths on the CPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--layers", type=int, help="layers of L18 to build (default: as many as fit)")
    parser.add_argument("--micro-batch-sequences", type=int, help="sequences per micro-batch (default: the planner's)")
    parser.add_argument("--accumulation-steps", type=int, help="micro-batches per step (default: the planner's)")
    parser.add_argument("--steps", type=int, help="timed steps (default 3 on a GPU, 2 quick)")
    parser.add_argument("--gpu-memory", help="the GPU memory the planner lays L18 out for, e.g. 141GB "
                                             "(default: this device's)")
    parser.add_argument("--max-seconds", type=float, default=480.0, help="stop timing steps (after one) "
                                                                          "before this (default 480)")
    args = parser.parse_args(argv)
    for name in ("layers", "micro_batch_sequences", "accumulation_steps", "steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        gpu_memory = parse_bytes(args.gpu_memory) if args.gpu_memory is not None else None
    except LadderInputError as err:
        parser.error(str(err))
    report = run(args.quick, layers=args.layers, micro=args.micro_batch_sequences, accumulation=args.accumulation_steps,
                 steps=args.steps, gpu_memory_bytes=gpu_memory, max_seconds=args.max_seconds)
    print_report(report, quick=args.quick, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
