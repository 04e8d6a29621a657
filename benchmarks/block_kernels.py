"""The kernels of issue #21 against what they replaced, measured in the same run on this machine:

- attention: a window layer's forward+backward by the CPU block-local path vs the dense (T, T) mask
  the model used before; a global layer's `is_causal` SDPA vs the dense causal mask;
- cross-entropy: `rungs.loss.linear_cross_entropy` vs the plain
  `F.cross_entropy(F.linear(h, w).float(), t)` at cpu-demo's vocabulary (all logits in one chunk,
  so the plain path runs) and at a 32,768 vocabulary (two chunks, gradients made in forward),
  forward+backward;
- torch.compile of one cpu-demo block (forward+backward), eager vs compiled, after warm-up; the
  compile wall seconds beside (full mode only: compiling takes minutes on a loaded 2-core machine).

Shapes: the largest cpu-demo rung (its micro-batch), plus one longer sequence for attention.
Timed in process CPU seconds with one thread, interleaved, median of repeats. Targets: at cpu-demo
shapes the new attention within noise of the dense mask (≤ 1.25×), at T=1024, window 128 the
window path ≤ 0.7× the dense mask, and the chunked loss no slower than the plain one (≤ 1.1×).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import Report, main_for
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from ladder.plan.resolve import resolve_train_config
from rungs.attention import attention_mask, causal_attention
from rungs.config import parse_config
from rungs.loss import linear_cross_entropy
from rungs.model import Block, rope_tables


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


def run(quick: bool) -> Report:
    report = Report("block_kernels")
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
    report.results = results
    report.check("window_attention_over_dense_mask", results["attention_window_cpu_demo"]["new_over_dense"], "<=", 1.25)
    report.check("causal_attention_over_dense_mask", results["attention_global_cpu_demo"]["new_over_dense"], "<=", 1.25)
    report.check("window_attention_T1024_over_dense_mask", results["attention_window_T1024_W128"]["new_over_dense"],
                 "<=", 0.7)
    report.check("chunked_loss_over_plain_vocab_32768", results["loss_vocab_32768"]["chunked_over_plain"], "<=", 1.1)
    return report


if __name__ == "__main__":
    sys.exit(main_for("block_kernels", run))
