"""Muon optimizer step: against torch.optim.Muon, and as a share of the training step.

Model: the largest cpu-demo rung (`ladder.plan.plan_rung`), built with `rungs.model.Transformer`.
1. Muon alone on that model's Muon parameters (hidden matrices and per-expert stacks) vs
   torch.optim.Muon on the same matrices (each expert stack handed over as E separate 2-D
   parameters, since torch.optim.Muon takes 2-D only), same settings; fixed random gradients.
2. The whole optimizer step (`rungs.optim.build_optimizer`: Muon + AdamW) vs one training step of
   the rung (bf16 autocast forward + backward of one batch of `batch_tokens` tokens, plus that
   optimizer step). Target: optimizer share <= 5%.
3. Our Muon's two bf16 Newton-Schulz paths on the same matrices: emulated (float32 arithmetic rounded
   to bf16 where torch rounds, `ns_emulate=True`) and native bf16 matmuls (`ns_emulate=False`, the
   GPU's path and torch.optim.Muon's). The default (`ns_emulate=None`, "ours" above) is the emulated
   path on CPUs without bf16 units, where the native one is 15-17x slower, and the native path on CPUs
   with AVX512-BF16 or AMX (`rungs.cpu_bf16`), where it is 2.2-2.9x faster than the emulated one
   (`emulated_over_native_muon_step`, reported, not a target; `default_newton_schulz` says which).
Timing: median process CPU seconds on one thread, the compared calls interleaved (robust to other
processes on a shared machine).
4. mai-base-2 L18's optimizer step, counted without running it (`rungs.op_census` on fake tensors,
   one layer's Muon matrices, native bf16 Newton-Schulz, an H200's chunk budget): bytes and kernels
   by kind and a roofline time at an H200's rates, against its Newton-Schulz GEMMs alone at the
   measured matmul rate (the target: <= 1.5x).
5. On CUDA (the full mode on a GPU machine), the same step run: L18's Muon matrices and AdamW tensors
   of `--layers` layers (7 by default, what fits one H200 with the rung's activations), random
   gradients; Muon's step and AdamW's (fused, foreach) timed with CUDA events; its Newton-Schulz
   GEMMs' FLOPs (`rungs.muon.ns_flops`) at this device's measured bf16 matmul rate (8192^3) and at
   the rate of the step's own batched GEMM (768^3 x 1,536); the optimizer's share of a whole
   optimizer step of the planner's L18 layout (16 micro-batches of 8 x 4096 tokens) were the rest
   of that step at the 0.30 MFU target. Targets: step <= 1.5x its GEMMs, share <= 5%.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import Report, cuda_seconds, measured_peak_bf16_flops, print_report
from benchmarks.moe import interleaved_cpu_seconds, tune_glibc_malloc
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.cpu_bf16 import cpu_has_bf16_units
from ladder.plan.counting import count_flops_per_token
from rungs.architecture import parameter_shapes
from rungs.metrics import device_peak
from rungs.model import ModelConfig, Transformer
from rungs.muon import NS_DEVICE_MEMORY_SHARE, Muon, ns_flops
from rungs.op_census import count_fake
from rungs.optim import MUON_ROLES, adamw_implementation, build_optimizer, param_role

# An H200's measured bf16 8192^3 matmul and streaming rate (../shared/measurements/h200-2026-12-04),
# a few microseconds a kernel, its memory (141 GB) for the chunk budget: the census's roofline.
H200_GEMM_FLOPS, H200_BYTES_PER_SECOND, SECONDS_PER_KERNEL, H200_BYTES = 805e12, 4.0e12, 3e-6, 141e9
L18_LAYERS_ON_ONE_GPU = 7
L18_ACCUMULATION, L18_MICRO_BATCH_TOKENS = 16, 8 * 4096
MFU_TARGET, STEP_OVER_GEMMS_TARGET, SHARE_TARGET = 0.30, 1.5, 0.05


def largest_demo_rung():
    recipe = load_recipe("cpu-demo")
    spec = plan_rung(recipe, max(recipe.ladder_rungs))
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    arch = {k: v for k, v in dataclasses.asdict(spec.arch).items() if k in fields}
    return spec, ModelConfig(**arch)


def l18_shapes(n_layers: int):
    """(architecture, Muon shapes, AdamW shapes) of mai-base-2 L18 cut to `n_layers` layers."""
    arch = dataclasses.replace(plan_rung(load_recipe("mai-base-2"), 18).arch, n_layers=n_layers)
    muon, adamw = [], []
    for name, shape in parameter_shapes(arch).items():
        role = param_role(name, torch.empty(shape, device="meta"))
        (muon if role in MUON_ROLES else adamw).append(shape)
    return arch, muon, adamw


def _with_grads(shapes, device) -> list[torch.nn.Parameter]:
    params = [torch.nn.Parameter(torch.randn(shape, device=device) * 0.02) for shape in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def census_l18_muon_step() -> dict:
    """One L18 layer's Muon step counted on fake tensors (native bf16 Newton-Schulz, an H200's budget)."""
    _, shapes, _ = l18_shapes(1)

    def setup():
        params = _with_grads(shapes, "cpu")
        opt = Muon(params, lr=1e-3, weight_decay=0.1, ns_emulate=False,
                   ns_chunk_bytes=int(NS_DEVICE_MEMORY_SHARE * H200_BYTES))
        for p in params:
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        return opt

    census = count_fake(setup, lambda opt: opt.step())
    summary = census.summary(H200_GEMM_FLOPS, H200_BYTES_PER_SECOND, SECONDS_PER_KERNEL)
    flops = sum(ns_flops(shape, 5) for shape in shapes)
    modelled = summary["modelled_seconds"]
    return {"layers": 1, "ns_gemm_flops": flops, "census_gemm_flops": summary["gemm_flops"],
            "kernels": summary["kernels"], "bytes_between_gemms": summary["bytes_between_gemms"],
            "by_category": summary["by_category"], "modelled_seconds": modelled,
            "top_ops_by_bytes": dict(list(census.by_op().items())[:10]),
            "modelled_step_over_ns_gemms": modelled["total"] / (flops / H200_GEMM_FLOPS)}


def _bmm_rate(batch: int, size: int, repeats: int) -> float:
    a = torch.randn(batch, size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(batch, size, size, device="cuda", dtype=torch.bfloat16)
    return 2.0 * batch * size**3 / cuda_seconds(lambda: torch.bmm(a, b), repeats=repeats, warmup=2)


def gpu_l18_optimizer_step(n_layers: int, repeats: int) -> dict:
    """L18's optimizer step of `n_layers` layers on this GPU (module docstring, item 5)."""
    t0 = time.perf_counter()
    arch, muon_shapes, adamw_shapes = l18_shapes(n_layers)
    rate = measured_peak_bf16_flops(8192, repeats, device="cuda")
    rate_768 = _bmm_rate(1536, 768, repeats)
    muon_params = _with_grads(muon_shapes, "cuda")
    muon = Muon(muon_params, lr=1e-3, weight_decay=0.1)
    muon_seconds = cuda_seconds(muon.step, repeats=repeats, warmup=1)
    shapes = len({tuple(p.shape[-2:]) for p in muon_params})
    del muon, muon_params
    torch.cuda.empty_cache()
    adamw = {}
    adam_params = _with_grads(adamw_shapes, "cuda")
    for kind, kwargs in (("fused", adamw_implementation(adam_params)), ("foreach", {"foreach": True})):
        opt = torch.optim.AdamW(adam_params, lr=1e-3, weight_decay=0.0, **kwargs)
        adamw[kind] = cuda_seconds(opt.step, repeats=repeats, warmup=1)
        del opt
    flops = sum(ns_flops(shape, 5) for shape in muon_shapes)
    peak = device_peak("cuda").flops
    tokens = L18_ACCUMULATION * L18_MICRO_BATCH_TOKENS
    rest_at_target = count_flops_per_token(arch).training * tokens / (MFU_TARGET * peak) if peak else float("nan")
    optimizer = muon_seconds + adamw["fused"]
    return {"device": torch.cuda.get_device_name(), "layers": n_layers, "muon_matrix_shapes": shapes,
            "bf16_matmul_8192_flops_per_second": rate, "bf16_bmm_1536x768_flops_per_second": rate_768,
            "ns_gemm_flops": flops, "muon_step_seconds": muon_seconds,
            "ns_gemm_seconds_at_8192_rate": flops / rate, "ns_gemm_seconds_at_768_rate": flops / rate_768,
            "muon_step_over_ns_gemms": muon_seconds / (flops / rate),
            "muon_step_over_ns_gemms_at_768_rate": muon_seconds / (flops / rate_768),
            "adamw_fused_seconds": adamw["fused"], "adamw_foreach_seconds": adamw["foreach"],
            "adamw_values": sum(math.prod(s) for s in adamw_shapes),
            "step_tokens": tokens, "rest_of_step_seconds_at_mfu_target": rest_at_target,
            "optimizer_share_of_step_at_mfu_target": optimizer / (optimizer + rest_at_target),
            "wall_seconds": time.perf_counter() - t0}


def run_gpu(layers: int, repeats: int) -> Report:
    results = {"census_l18": census_l18_muon_step(), "gpu_l18": gpu_l18_optimizer_step(layers, repeats)}
    report = Report("muon", results, device="cuda")  # the reference matmul on the GPU, not the host CPU
    gpu = results["gpu_l18"]
    report.check("l18_muon_step_over_ns_gemms", gpu["muon_step_over_ns_gemms"], "<=", STEP_OVER_GEMMS_TARGET)
    report.check("l18_optimizer_share_of_step_at_mfu_target", gpu["optimizer_share_of_step_at_mfu_target"], "<=",
                 SHARE_TARGET)
    return report


def run(quick: bool) -> Report:
    """On a CUDA machine the full mode is the L18 step on the GPU (items 4-5, about a minute on an
    H200); --quick, and any machine without CUDA, the CPU measurements (items 1-4)."""
    if torch.cuda.is_available() and not quick:
        return run_gpu(L18_LAYERS_ON_ONE_GPU, repeats=5)
    return run_cpu(quick)


def run_cpu(quick: bool) -> Report:
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # --quick is the smoke run make test makes (tests/benchmarks/test_gpu_suite.py): medians of 3, not 11
    repeats = 3 if quick else 11
    spec, cfg = largest_demo_rung()
    model = Transformer(cfg)
    results: dict = {"rung": spec.arch.n_layers, "d_model": cfg.d_model, "params_total": spec.params_total,
                     "batch_tokens": spec.batch_tokens, "torch_threads": 1,
                     "timing": "median process CPU seconds, interleaved"}

    # 1. our Muon vs torch.optim.Muon on the same matrices ------------------------------------
    muon_params = [p for n, p in model.named_parameters() if param_role(n, p) in MUON_ROLES]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in muon_params]
    theirs = [torch.nn.Parameter(m.detach().clone()) for p in muon_params for m in (p if p.ndim == 3 else [p])]
    for p in ours:
        p.grad = torch.randn_like(p)
    grads_2d = [m for p in ours for m in (p.grad if p.ndim == 3 else [p.grad])]
    for p, g in zip(theirs, grads_2d):
        p.grad = g.clone()
    native, emulated = ([torch.nn.Parameter(p.detach().clone()) for p in muon_params] for _ in range(2))
    for p, e, q in zip(native, emulated, ours):
        p.grad, e.grad = q.grad.clone(), q.grad.clone()
    opt_ours = Muon(ours, lr=1e-3, weight_decay=0.1)
    opt_native = Muon(native, lr=1e-3, weight_decay=0.1, ns_emulate=False)
    opt_emulated = Muon(emulated, lr=1e-3, weight_decay=0.1, ns_emulate=True)
    opt_torch = torch.optim.Muon(theirs, lr=1e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    seconds = interleaved_cpu_seconds({"ours": opt_ours.step, "native": opt_native.step,
                                       "emulated": opt_emulated.step, "torch": opt_torch.step}, repeats)
    results["muon_step_seconds"] = seconds["ours"]
    results["default_newton_schulz"] = "native" if cpu_has_bf16_units() else "emulated"
    results["native_bf16_muon_step_seconds"] = seconds["native"]
    results["emulated_bf16_muon_step_seconds"] = seconds["emulated"]
    results["emulated_over_native_muon_step"] = seconds["emulated"] / seconds["native"]
    results["torch_muon_step_seconds"] = seconds["torch"]
    results["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    results["muon_matrices"] = len(theirs)
    results["muon_parameters"] = len(ours)

    # 2. optimizer step share of the training step ----------------------------------------------
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    results["convention"] = optimizer.convention
    n_seq = spec.batch_tokens // cfg.seq_len
    tokens = torch.randint(0, cfg.vocab_size, (n_seq, cfg.seq_len + 1))

    def forward_backward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = model(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()

    forward_backward()                                  # grads exist for every parameter from here on
    tune_glibc_malloc()                                 # as a CPU training process would
    parts = interleaved_cpu_seconds({"forward_backward": forward_backward, "optimizer_step": optimizer.step},
                                    repeats)
    results.update({f"{k}_seconds": v for k, v in parts.items()})
    share = parts["optimizer_step"] / (parts["optimizer_step"] + parts["forward_backward"])
    results["optimizer_share_of_train_step"] = share
    torch.set_num_threads(threads)

    results["census_l18"] = census_l18_muon_step()
    report = Report("muon", results)
    report.check("muon_optimizer_share_of_train_step", share, "<=", 0.05)
    report.check("muon_step_over_torch_optim_muon", seconds["ours"] / seconds["torch"], "<=", 1.0)
    report.check("l18_muon_modelled_step_over_ns_gemms", results["census_l18"]["modelled_step_over_ns_gemms"],
                 "<=", STEP_OVER_GEMMS_TARGET)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.muon")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--layers", type=int, default=L18_LAYERS_ON_ONE_GPU)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if torch.cuda.is_available() and not args.quick:
        report = run_gpu(args.layers, args.repeats)
    else:
        report = run_cpu(args.quick)
    print_report(report, quick=args.quick, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
