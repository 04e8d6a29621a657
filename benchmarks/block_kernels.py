"""The block kernels against what they replaced, measured in the same run on this machine:

- attention: a window layer's forward+backward by the CPU block-local path vs the dense (T, T) mask
  the model used before; a global layer's `is_causal` SDPA vs the dense causal mask;
- cross-entropy: `rungs.loss.linear_cross_entropy` vs the plain
  `F.cross_entropy(F.linear(h, w).float(), t)` at cpu-demo's vocabulary (all logits in one chunk,
  so the plain path runs) and at a 32,768 vocabulary (two chunks, gradients made in forward),
  forward+backward;
- torch.compile of one cpu-demo block (forward+backward), eager vs compiled, after warm-up; the
  compile wall seconds beside (full mode only: compiling takes minutes on a loaded 2-core machine);
- the kernels of one mai-base-2 L18 block at its real widths (a micro-batch of 8 x 4096 tokens,
  forward+backward under bf16 autocast), counted without running them (`rungs.op_census` under
  FakeTensorMode): kernels, bytes moved between the GEMMs by kind, GEMM FLOPs and a roofline
  time at an H200's rates; eagerly (as on a CPU) and with the `rungs.pointwise` chains counted as
  the one kernel each compiles to on a GPU. The global layer is counted (its attention is the same
  SDPA on every device; a window layer's differs between the CPU path and FlexAttention), the MoE
  sub-layer alone beside it. Check: the fused block's roofline MFU (the planner's FLOPs of one
  layer over the roofline time, against the H200's 989 TFLOP/s spec) at the
  forward+backward target, 0.35;
- on CUDA (the full mode on a GPU machine, instead of the CPU timings above): L18 blocks timed
  with CUDA events, forward+backward of 8 x 4096 tokens under bf16 autocast, for a window layer
  and the global one: eager (`rungs.pointwise.set_compiled(False)`), with the pointwise chains
  compiled (the default), and the window block under `torch.compile` (regional: the block alone),
  with its compile seconds; MFU of each against the spec peak. About 2 minutes on an H200.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import Report, cuda_seconds, main_for
from ladder.plan.counting import count_flops_per_token
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from ladder.plan.resolve import resolve_train_config
from rungs.attention import attention_mask, causal_attention
from rungs.config import parse_config
from rungs.loss import linear_cross_entropy
from rungs.model import Block, ModelConfig, rope_tables
from rungs.held_weights import held_expert_weights
from rungs.op_census import count_fake
from rungs.pointwise import set_compiled

# Roofline rates of the census: an H200's measured bf16 8192^3 matmul (805 TFLOP/s,
# ../shared/measurements/h200-2026-12-04), ~83% of its 4.8 TB/s HBM for a streaming kernel, and a
# few microseconds a kernel.
H200_GEMM_FLOPS, H200_BYTES_PER_SECOND, SECONDS_PER_KERNEL = 805e12, 4.0e12, 3e-6
H200_SPEC_FLOPS = 989e12
L18_MICRO_BATCH_SEQUENCES = 8
FORWARD_BACKWARD_MFU_TARGET = 0.35
GPU_SECONDS_BUDGET = 100.0        # the CUDA cases stop starting new ones past this


def _median_seconds(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Interleaved process-CPU timings of each fn (one warm-up call each)."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            samples[name].append(time.process_time() - t0)
    return {name: sorted(s)[len(s) // 2] for name, s in samples.items()}


def _attention_case(B: int, H: int, kv: int, T: int, hd: int, window: int | None, repeats: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, T, hd, generator=g, requires_grad=True) for n in (H, kv, kv))
    mask = attention_mask(T, window)

    def new():
        causal_attention(q, k, v, window).sum().backward()

    def dense():
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).sum().backward()

    t = _median_seconds({"new": new, "dense": dense}, repeats)
    return {"new_seconds": t["new"], "dense_mask_seconds": t["dense"], "new_over_dense": t["new"] / t["dense"]}


def _loss_case(n_tokens: int, d: int, vocab: int, repeats: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n_tokens, d, generator=g, requires_grad=True)
    w = (torch.randn(vocab, d, generator=g) * d**-0.5).requires_grad_()
    t = torch.randint(0, vocab, (n_tokens,), generator=g)

    def chunked():
        linear_cross_entropy(h, w, t).backward()

    def plain():
        F.cross_entropy(F.linear(h, w).float(), t).backward()

    s = _median_seconds({"chunked": chunked, "plain": plain}, repeats)
    return {"chunked_seconds": s["chunked"], "plain_seconds": s["plain"], "chunked_over_plain": s["chunked"] / s["plain"]}


def _compile_case(cfg, B: int, repeats: int) -> dict[str, float]:
    arch = cfg.architecture()
    torch.manual_seed(0)
    block = Block(arch, 0)
    compiled = torch.compile(block)
    cos, sin = rope_tables(arch.seq_len, arch.head_dim, arch.rope_theta)
    x = torch.randn(B, arch.seq_len, arch.d_model, requires_grad=True)

    def step(module):
        def run():
            y, route = module(x, cos, sin, lambda t, layer, point: t)
            y.sum().backward()
        return run

    t0 = time.perf_counter()
    step(compiled)()
    compile_seconds = time.perf_counter() - t0
    s = _median_seconds({"eager": step(block), "compiled": step(compiled)}, repeats)
    return {"compile_wall_seconds": compile_seconds, "eager_seconds": s["eager"], "compiled_seconds": s["compiled"],
            "compiled_over_eager": s["compiled"] / s["eager"]}


def l18_config() -> ModelConfig:
    return ModelConfig(**dataclasses.asdict(plan_rung(load_recipe("mai-base-2"), 18).arch))


def _block_work(arch: ModelConfig, layer: int, sequences: int, moe_only: bool, accumulating: str | None = None):
    """Build a block and run (count) one micro-batch's forward+backward. `accumulating`: the micro-batch
    is a later one of a step, run after a first (not counted) that left the gradients in .grad, with
    the stacks held across them ("held": `rungs.held_weights.held_expert_weights`, as the job accumulates
    under bf16) or not ("plain")."""
    def micro_batch(block, x, cos, sin):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            if moe_only:
                y, _ = block.moe(block.moe_norm(x))
            else:
                y, _ = block(x, cos, sin, lambda t, layer, point: t)
        y.backward(torch.ones_like(y))

    def setup():
        block = Block(arch, layer)
        x = torch.randn(sequences, arch.seq_len, arch.d_model, requires_grad=True)
        cos, sin = rope_tables(arch.seq_len, arch.head_dim, arch.rope_theta)
        hold = contextlib.ExitStack()
        if accumulating == "held":
            hold.enter_context(held_expert_weights(block))
        if accumulating is not None:
            micro_batch(block, x, cos, sin)
        return block, x, cos, sin, hold

    def work(state):
        *tensors, hold = state
        with hold:
            micro_batch(*tensors)
    return setup, work


def census_case(arch: ModelConfig, layer: int, sequences: int, moe_only: bool = False,
                fuse_pointwise: bool = True, accumulating: str | None = None) -> dict[str, object]:
    """The census of one block's (or its MoE sub-layer's) forward+backward, per kind of kernel;
    fuse_pointwise: the `rungs.pointwise` chains counted as the one kernel each compiles to on CUDA;
    accumulating: a later micro-batch of a step ("plain" or "held", `_block_work`)."""
    census = count_fake(*_block_work(arch, layer, sequences, moe_only, accumulating), fuse_pointwise=fuse_pointwise)
    summary = census.summary(H200_GEMM_FLOPS, H200_BYTES_PER_SECOND, SECONDS_PER_KERNEL)
    weight_sized = {(arch.n_experts, arch.expert_hidden, arch.latent_dim), (arch.n_experts, arch.latent_dim,
                                                                          arch.expert_hidden)}
    weights = [r for r in census.records if r.category not in ("gemm", "attention") and r.shapes
               and r.shapes[0] in weight_sized | {(arch.n_experts, 2 * arch.expert_hidden, arch.latent_dim)}]
    summary["expert_weight_bytes_between_gemms"] = sum(r.bytes for r in weights)
    summary["expert_weight_kernels_between_gemms"] = len(weights)
    summary["top_ops_by_bytes"] = dict(list(census.by_op().items())[:12])
    modelled = summary["modelled_seconds"]
    summary["modelled_non_gemm_over_gemm"] = (modelled["total"] - modelled["gemm"]) / modelled["gemm"]
    if not moe_only:
        summary["modelled_mfu"] = block_flops(arch, layer, sequences) / modelled["total"] / H200_SPEC_FLOPS
    return summary


def block_flops(arch: ModelConfig, layer: int, sequences: int) -> float:
    """The planner's training FLOPs of one block (layer `layer`) over `sequences` sequences."""
    one = dataclasses.replace(arch, n_layers=1, global_every=1 if arch.is_global_layer(layer) else arch.n_layers + 1)
    counts = count_flops_per_token(one)
    return 3.0 * (counts.forward - counts.lm_head) * sequences * arch.seq_len


def _gpu_block_case(arch: ModelConfig, layer: int, sequences: int, repeats: int, compile_block: bool,
                    deadline: float) -> dict:
    """Forward+backward of one L18 block on CUDA, seconds by CUDA events, three ways (the regional
    compile only if it can start before `deadline`, a perf_counter time)."""
    with torch.device("cuda"):
        torch.manual_seed(0)
        block = Block(arch, layer)
        x = torch.randn(sequences, arch.seq_len, arch.d_model, requires_grad=True)
        cos, sin = (t.cuda() for t in rope_tables(arch.seq_len, arch.head_dim, arch.rope_theta))

    def step(module):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y, _ = module(x, cos, sin, lambda t, layer, point: t)
            y.backward(torch.ones_like(y))
        return run

    flops = block_flops(arch, layer, sequences)
    out: dict[str, object] = {"layer": layer, "global": arch.is_global_layer(layer), "flops": flops}
    previous = set_compiled(False)
    try:
        out["eager_seconds"] = cuda_seconds(step(block), repeats=repeats, warmup=2)
    finally:
        set_compiled(previous)
    t0 = time.perf_counter()
    step(block)()
    torch.cuda.synchronize()
    out["pointwise_compile_wall_seconds"] = time.perf_counter() - t0
    out["fused_pointwise_seconds"] = cuda_seconds(step(block), repeats=repeats, warmup=1)
    if compile_block and time.perf_counter() > deadline:
        out["block_compile_error"] = "skipped: the time budget was spent"
    elif compile_block:
        compiled = torch.compile(block)
        t0 = time.perf_counter()
        try:
            step(compiled)()
            torch.cuda.synchronize()
        except Exception as err:  # a measurement, not a requirement: say why and go on
            out["block_compile_error"] = f"{type(err).__name__}: {err}"[:500]
        else:
            out["block_compile_wall_seconds"] = time.perf_counter() - t0
            out["compiled_block_seconds"] = cuda_seconds(step(compiled), repeats=repeats, warmup=1)
            out["compiled_block_over_fused_pointwise"] = out["compiled_block_seconds"] / out["fused_pointwise_seconds"]
    for key in ("eager", "fused_pointwise", "compiled_block"):
        if f"{key}_seconds" in out:
            out[f"{key}_mfu"] = flops / out[f"{key}_seconds"] / H200_SPEC_FLOPS
    out["fused_pointwise_over_eager"] = out["fused_pointwise_seconds"] / out["eager_seconds"]
    return out


def run_gpu(repeats: int = 5) -> dict:
    """The CUDA cases (module docstring), within GPU_SECONDS_BUDGET of wall time."""
    l18, start = l18_config(), time.perf_counter()
    cases = [(0, True), (l18.global_every - 1, False)]   # a window layer (and the regional compile), the global one
    results: dict[str, object] = {"device": torch.cuda.get_device_name(), "micro_batch_sequences": L18_MICRO_BATCH_SEQUENCES,
                                  "peak_flops": H200_SPEC_FLOPS, "skipped": []}
    for layer, compile_block in cases:
        name = f"layer_{layer}"
        if time.perf_counter() - start > GPU_SECONDS_BUDGET:
            results["skipped"].append(name)
            continue
        results[name] = _gpu_block_case(l18, layer, L18_MICRO_BATCH_SEQUENCES, repeats, compile_block,
                                        deadline=start + GPU_SECONDS_BUDGET)
        torch.cuda.empty_cache()
    results["wall_seconds"] = time.perf_counter() - start
    return results


def census_l18() -> dict[str, object]:
    l18 = l18_config()
    layer = l18.global_every - 1
    census: dict[str, object] = {
        "rates": {"gemm_flops_per_second": H200_GEMM_FLOPS, "bytes_per_second": H200_BYTES_PER_SECOND,
                  "seconds_per_kernel": SECONDS_PER_KERNEL, "spec_flops": H200_SPEC_FLOPS},
        "micro_batch_sequences": L18_MICRO_BATCH_SEQUENCES, "layer": layer}
    for fuse in (False, True):
        mode = "fused" if fuse else "eager"
        census[f"block_{mode}"] = census_case(l18, layer, L18_MICRO_BATCH_SEQUENCES, fuse_pointwise=fuse)
        census[f"moe_{mode}"] = census_case(l18, layer, L18_MICRO_BATCH_SEQUENCES, moe_only=True, fuse_pointwise=fuse)
    # a later micro-batch of an accumulating step (gradients in .grad), the stacks cast per micro-batch
    # or held for the step as the single-process job does under bf16
    for how in ("plain", "held"):
        census[f"block_fused_accumulating_{how}"] = census_case(l18, layer, L18_MICRO_BATCH_SEQUENCES,
                                                                 accumulating=how)
    return census


def run(quick: bool) -> Report:
    report = Report("block_kernels")
    results: dict[str, object] = {"census_l18": census_l18()}
    if torch.cuda.is_available() and not quick:
        results["gpu_l18"] = run_gpu()
        report.device = "cuda"  # the machine's reference matmul is timed on the GPU, not the host CPU
    else:
        results.update(_cpu_cases(quick, report))
    report.results = results
    report.check("l18_block_modelled_mfu_fused", results["census_l18"]["block_fused"]["modelled_mfu"], ">=",
                 FORWARD_BACKWARD_MFU_TARGET)
    gpu = results.get("gpu_l18", {})
    if "layer_0" in gpu:
        report.check("l18_window_block_mfu_fused_pointwise", gpu["layer_0"]["fused_pointwise_mfu"], ">=",
                     FORWARD_BACKWARD_MFU_TARGET)
    return report


def _cpu_cases(quick: bool, report: Report) -> dict[str, object]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    recipe = load_recipe("cpu-demo")
    L = max(recipe.ladder_rungs)
    cfg = parse_config(resolve_train_config("cpu-demo", L, {"tracking_uri": None}))
    arch = plan_rung(recipe, L).arch
    B = cfg.micro_batch_sequences or cfg.batch_sequences
    repeats = 3 if quick else 7
    H, hd, T, W = arch.n_heads, arch.head_dim, arch.seq_len, arch.window_tokens
    results: dict[str, object] = {"rung": L, "micro_batch_sequences": B, "threads": 1, "clock": "process_time"}
    results["attention_window_cpu_demo"] = _attention_case(B, H, arch.n_kv_heads_local, T, hd, W, repeats)
    results["attention_global_cpu_demo"] = _attention_case(B, H, arch.n_kv_heads_global, T, hd, None, repeats)
    results["attention_window_T1024_W128"] = _attention_case(1 if quick else 2, 4, 2, 1024, 32, 128, repeats)
    results["loss_cpu_demo"] = _loss_case(B * T, arch.d_model, arch.vocab_size, repeats)
    results["loss_vocab_32768"] = _loss_case(2048, 64 if quick else 256, 32768, repeats)
    if not quick:
        results["compile_block_cpu_demo"] = _compile_case(cfg, B, repeats)
    torch.set_num_threads(threads)
    report.check("window_attention_over_dense_mask", results["attention_window_cpu_demo"]["new_over_dense"], "<=", 1.25)
    report.check("causal_attention_over_dense_mask", results["attention_global_cpu_demo"]["new_over_dense"], "<=", 1.25)
    report.check("window_attention_T1024_over_dense_mask", results["attention_window_T1024_W128"]["new_over_dense"],
                 "<=", 0.7)
    report.check("chunked_loss_over_plain_vocab_32768", results["loss_vocab_32768"]["chunked_over_plain"], "<=", 1.1)
    return results


if __name__ == "__main__":
    sys.exit(main_for("block_kernels", run))
