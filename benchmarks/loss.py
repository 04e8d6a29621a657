"""The LM head's loss at mai-base-2 L18's shapes: the project's chunked loss (`rungs.loss`) against
the time of its three GEMMs at the device's measured bf16 rate (the target: forward + backward
<= 1.25x), with the alternatives measured in the same run.

One micro-batch of the planner's L18 layout (8 x 4,096 = 32,768 tokens, d_model 1,536, vocabulary
131,072; 39.6 TFLOP of GEMMs) in bf16 compute over fp32 master weights, as the model calls it:

- `chunked_eager` / `chunked_compiled`: `linear_cross_entropy` with each chunk kernel at the
  device's default chunk (`rungs.loss_chunks`), and the compiled one at other chunk budgets;
- `plain`: `F.cross_entropy(F.linear(h, w).float(), t)`, the reference the loss is tested against
  (its (tokens x vocab) fp32 logits: ~60 GB at this size; out of memory is reported, not fatal);
- `liger_flce` (Liger Kernel's fused linear cross-entropy, fp32 weight-gradient accumulation) and
  `cut_cross_entropy` (Apple's CCE, with its default gradient filter and with none): GPU-only
  libraries that need Triton; tried when they import, reported as unavailable otherwise. They are
  optional: nothing of the project depends on them.

Per candidate: forward + backward seconds (CUDA events, median of `repeats` after a warm-up that
compiles), the peak memory it added, its loss and gradients against `chunked_eager`'s, and the time
over the three GEMMs' at the measured rate. Beside the timings, `traffic` counts what each path
asks of memory, op by op on the meta device at the full shapes (a CPU can check it): bytes moved
per logit by the ops on (tokens x vocab)-sized tensors, and GEMM FLOPs. `--quick` runs small shapes
on the CPU in fp32 (eager and plain only: compiling takes longer than the rest).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks.common import (GPU_PEAK_MATMUL_SIZE, Report, cuda_seconds, main_for, measured_peak_bf16_flops,
                               time_call)
from rungs.loss import linear_cross_entropy, loss_chunk_tokens

TOKENS, D_MODEL, VOCAB = 32_768, 1_536, 131_072
QUICK_SHAPE = (1_024, 64, 4_096)
LOSS_TARGET = 1.25          # forward + backward over the three GEMMs at the measured bf16 rate
CHUNK_BUDGETS_TOKENS = (1_024, 2_048, 8_192)   # the compiled chunk at these besides the default
LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def gemm_flops(tokens: int, d_model: int, vocab: int) -> float:
    """The loss's three GEMMs: logits, d hidden, d weight, 2·N·V·d FLOPs each."""
    return 6.0 * tokens * vocab * d_model


def _autocast(device_type: str):
    # bf16 compute on a GPU, as the job runs it; fp32 on the CPU (the CPU job's precision: a CPU
    # without bf16 units multiplies bf16 hundreds of times slower)
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=device_type == "cuda")


def _ours(kernel: str, chunk: int | None = None) -> LossFn:
    def fn(h, w, t):
        with _autocast(h.device.type):
            return linear_cross_entropy(h, w, t, kernel=kernel,
                                        logits_per_chunk=None if chunk is None else chunk * w.shape[0])
    return fn


def _plain(h, w, t):
    with _autocast(h.device.type):
        return F.cross_entropy(F.linear(h, w).float(), t)


def _liger(chunk_mem_const: int) -> LossFn:
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    def fn(h, w, t):
        # positional: (input, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
        # label_smoothing, reduction, softcap, return_z_loss, accum_dtype, token scaling, accuracy,
        # predicted tokens, ce_impl, ce_mode, chunk_mem_const)
        out = LigerFusedLinearCrossEntropyFunction.apply(h.bfloat16(), w.bfloat16(), t, None, None, -100, 0.0, 0.0,
                                                         "mean", None, False, torch.float32, False, False, False,
                                                         None, None, chunk_mem_const)
        return out[0] if isinstance(out, tuple) else out
    return fn


def _cce(filter_eps: str | None) -> LossFn:
    from cut_cross_entropy import linear_cross_entropy as cce

    def fn(h, w, t):
        return cce(h.bfloat16(), w.bfloat16(), t, filter_eps=filter_eps)
    return fn


def candidates(device: torch.device, tokens: int, vocab: int) -> list[tuple[str, Callable[[], LossFn]]]:
    """(name, a factory of the loss function): factories import lazily, so a missing library is a
    reported result, not an import error."""
    # on the CPU the default chunk would hold the whole quick micro-batch: chunks of a quarter of it
    quick_chunk = None if device.type == "cuda" else max(1, tokens // 4)
    out: list[tuple[str, Callable[[], LossFn]]] = [("chunked_eager", lambda: _ours("eager", quick_chunk))]
    if device.type == "cuda":
        out.append(("chunked_compiled", lambda: _ours("compiled")))
        default = loss_chunk_tokens(tokens, vocab, device)
        out += [(f"chunked_compiled_{c}", lambda c=c: _ours("compiled", c)) for c in CHUNK_BUDGETS_TOKENS
                if c != default and c < tokens]
    out.append(("plain", lambda: _plain))
    if device.type == "cuda":
        out += [("liger_flce", lambda: _liger(1)), ("liger_flce_chunk_x8", lambda: _liger(8)),
                ("cut_cross_entropy", lambda: _cce("high")), ("cut_cross_entropy_exact", lambda: _cce(None))]
    return out


def _timed(fn: LossFn, h, w, t, *, repeats: int) -> float:
    """Median seconds of forward + backward (CUDA events on a GPU; the host clock on the CPU)."""
    def step():
        h.grad = w.grad = None
        fn(h, w, t).backward()

    if h.device.type != "cuda":
        return time_call(step, repeats=repeats, warmup=1)
    return cuda_seconds(step, repeats=repeats, warmup=1)                # the warm-up compiles, autotunes


def _errors(h, w, loss: torch.Tensor, ref: dict[str, torch.Tensor]) -> dict[str, float]:
    def rel(a, b):
        return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
    return {"loss_abs_error": abs(float(loss.detach()) - float(ref["loss"])), "grad_hidden_rel_error": rel(h.grad, ref["h"]),
            "grad_weight_rel_error": rel(w.grad, ref["w"])}


def measure(device: torch.device, tokens: int, d_model: int, vocab: int, *, repeats: int,
            budget_seconds: float) -> dict[str, Any]:
    """Every candidate that runs within `budget_seconds` (the rest say so)."""
    g = torch.Generator(device=device).manual_seed(0)
    h = (torch.randn(tokens, d_model, device=device, generator=g)).requires_grad_()
    w = (torch.randn(vocab, d_model, device=device, generator=g) * d_model ** -0.5).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    cuda = device.type == "cuda"
    rate = measured_peak_bf16_flops(GPU_PEAK_MATMUL_SIZE, device="cuda") if cuda else None
    gemm_seconds = gemm_flops(tokens, d_model, vocab) / rate if rate else None
    out: dict[str, Any] = {"tokens": tokens, "d_model": d_model, "vocab": vocab,
                           "default_chunk_tokens": loss_chunk_tokens(tokens, vocab, device),
                           "gemm_flops": gemm_flops(tokens, d_model, vocab), "measured_bf16_flops": rate,
                           "three_gemms_seconds_at_measured_rate": gemm_seconds, "candidates": {}}
    ref: dict[str, torch.Tensor] = {}
    start = time.perf_counter()
    for name, factory in candidates(device, tokens, vocab):
        if time.perf_counter() - start > budget_seconds:
            out["candidates"][name] = {"ran": False, "reason": f"time budget of {budget_seconds:.0f} s spent"}
            continue
        try:
            fn = factory()
        except Exception as err:  # an optional library that is absent or does not import here
            out["candidates"][name] = {"ran": False, "reason": f"unavailable: {type(err).__name__}: {err}"[:300]}
            continue
        try:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            seconds = _timed(fn, h, w, t, repeats=repeats)
            h.grad = w.grad = None
            loss = fn(h, w, t)
            loss.backward()
            row: dict[str, Any] = {"ran": True, "seconds": seconds, "loss": float(loss.detach())}
            if cuda:
                row["peak_added_bytes"] = torch.cuda.max_memory_allocated(device) - base
            if gemm_seconds:
                row["over_three_gemms"] = seconds / gemm_seconds
            if name == "chunked_eager":
                ref = {"loss": loss.detach(), "h": h.grad.clone(), "w": w.grad.clone()}
            row |= _errors(h, w, loss, ref)
        except torch.OutOfMemoryError as err:
            row = {"ran": False, "reason": f"out of memory: {str(err)[:200]}"}
        except Exception as err:  # a library's kernel failing at these shapes is a result too
            row = {"ran": False, "reason": f"failed: {type(err).__name__}: {err}"[:300]}
        finally:
            h.grad = w.grad = None
            if cuda:
                torch.cuda.empty_cache()
        out["candidates"][name] = row
    out["seconds"] = time.perf_counter() - start
    return out


class _LogitTraffic(TorchDispatchMode):
    """Bytes the ops touching (tokens x vocab)-sized tensors read and write (each tensor once), and
    every GEMM's FLOPs: what a memory-bound pass over the logits costs, counted by op."""

    def __init__(self, logit_numel: int) -> None:
        super().__init__()
        self.logit_numel, self.bytes, self.gemm_flops, self.ops = logit_numel, 0, 0.0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        tensors = {id(x): x for x in tree_leaves((args, kwargs, out)) if isinstance(x, torch.Tensor)}
        if name in ("mm", "addmm"):
            a, b = (args[0], args[1]) if name == "mm" else (args[1], args[2])
            self.gemm_flops += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
        if getattr(func, "is_view", False) or name in ("detach", "empty", "empty_like", "empty_strided"):
            return out
        big = [x for x in tensors.values() if x.numel() >= self.logit_numel // 2]
        if big:
            self.ops += 1
            self.bytes += sum(x.numel() * x.element_size() for x in big)
        return out


def traffic(tokens: int = TOKENS, d_model: int = D_MODEL, vocab: int = VOCAB) -> dict[str, Any]:
    """Counted on the meta device (shapes only: any machine, at the full sizes): bytes per logit of
    the chunked eager path (the GPU's path: bf16 operands, fp32 GEMM outputs) and of the plain one."""
    out = {}
    for name, fn in (("chunked_eager", lambda h, w, t: linear_cross_entropy(h, w, t, kernel="eager",
                                                                            logits_per_chunk=4_096 * vocab)),
                     ("plain", lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t))):
        h = torch.empty(tokens, d_model, device="meta", dtype=torch.bfloat16, requires_grad=True)
        w = torch.empty(vocab, d_model, device="meta", dtype=torch.bfloat16, requires_grad=True)
        t = torch.empty(tokens, device="meta", dtype=torch.long)
        chunk = tokens if name == "plain" else min(tokens, 4_096)
        census = _LogitTraffic(chunk * vocab)
        with census:
            fn(h, w, t).backward()
        out[name] = {"bytes_per_logit": census.bytes / (tokens * vocab), "ops_on_logits": census.ops,
                     "gemm_flops": census.gemm_flops}
    return out


def run(quick: bool) -> Report:
    cuda = torch.cuda.is_available() and not quick
    device = torch.device("cuda" if cuda else "cpu")
    tokens, d_model, vocab = (TOKENS, D_MODEL, VOCAB) if cuda else QUICK_SHAPE
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        results = measure(device, tokens, d_model, vocab, repeats=5 if cuda else 3, budget_seconds=150.0)
    finally:
        torch.set_num_threads(threads)
    results["traffic"] = traffic()                       # the full shapes, on the meta device
    return loss_report(Report("loss", results, device=device.type), results)


def loss_report(report: Report, results: dict[str, Any], prefix: str = "") -> Report:
    """Checks of a `measure` result: on a GPU the default kernel (compiled) within LOSS_TARGET of its
    GEMMs; everywhere, the chunked loss equal to the plain one where both ran."""
    rows = results["candidates"]
    compiled = rows.get("chunked_compiled", {})
    default = compiled if compiled.get("ran") else rows["chunked_eager"]    # what the job runs on this device
    if results["measured_bf16_flops"]:           # a GPU run: a candidate that did not run fails the check
        report.check(f"{prefix}loss_over_three_gemms", default.get("over_three_gemms", math.nan), "<=", LOSS_TARGET)
    if rows["chunked_eager"].get("ran") and rows["plain"].get("ran"):
        report.check(f"{prefix}loss_chunked_minus_plain", rows["plain"]["loss_abs_error"], "<=", 1e-3)
    return report


if __name__ == "__main__":
    sys.exit(main_for("loss", run))
