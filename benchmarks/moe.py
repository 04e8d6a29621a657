"""Multi-round dropless MoE vs a naive per-expert loop vs capacity-padded dispatch.

Shapes of the largest cpu-demo rung's MoE layer (E=8, top-2, latent 48, expert hidden 96, one
micro-batch of 2688 tokens), bf16 autocast as in training; forward + backward of one layer.
Routing: balanced (every expert T*k/E pairs) and the worst skew for groups of 2 (every token picks
experts 0 and 1, so group 0 gets all T*k pairs). Capacity: calibrated with
`rungs.moe.calibrate_capacity` from random near-balanced routings, so balanced steps take one round.

Methods: multi-round (default: a one-round step keeps its activations), multi-round with
recompute="always" (backward recomputes even a single round), the naive loop, the padded dispatch.
Measured per method and routing: median process CPU seconds of forward+backward (one thread, the
methods interleaved, so other processes on a shared machine do not bias the ratio), peak live bytes (torch
profiler memory timeline, CREATE/DESTROY events of every CPU allocation inside the step) and bytes
saved for backward (`saved_tensors_hooks`). The padded dispatch is made dropless by padding every
expert to the largest expert's load, the only way a capacity-padded layout drops nothing.
Checks: peak memory and saved bytes skew/balanced <= 1.1 (multi-round), multi-round/naive time at
balanced <= 1.0 with glibc malloc tuned as for CPU training (the default-allocator ratio is reported
next to it: large temporaries page-fault on every allocation by default, see tune_glibc_malloc).
"""

from __future__ import annotations

import ctypes
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action

from benchmarks.common import Report, main_for
from rungs.moe import RoutedExperts, calibrate_capacity


def naive_loop(x, expert_idx, gate, w_gate, w_up, w_down):
    """Per-expert loop in plain autograd: gather the expert's pairs, SwiGLU, scatter-add gated."""
    out = None
    n_tokens, k = expert_idx.shape
    flat = expert_idx.reshape(-1)
    for e in range(w_gate.shape[0]):
        pairs = torch.nonzero(flat == e).squeeze(1)
        if pairs.numel() == 0:
            continue
        tokens = pairs // k
        xe = x[tokens]
        y = (F.silu(xe @ w_gate[e].T) * (xe @ w_up[e].T)) @ w_down[e].T
        out = x.new_zeros(x.shape, dtype=y.dtype) if out is None else out
        out = out.index_add(0, tokens, y * gate.reshape(-1)[pairs].unsqueeze(1).to(y.dtype))
    return x.new_zeros(x.shape) if out is None else out


def padded_dispatch(x, expert_idx, gate, w_gate, w_up, w_down):
    """Capacity-padded (E, C, d) layout with C = the largest expert load (dropless), batched bmm."""
    n_experts = w_gate.shape[0]
    n_tokens, k = expert_idx.shape
    flat = expert_idx.reshape(-1)
    counts = torch.bincount(flat, minlength=n_experts)
    capacity = int(counts.max())
    order = torch.argsort(flat, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(flat.numel()) - starts[flat[order]]                 # position within expert
    dest = flat[order] * capacity + slot                                    # row in the (E*C) buffer
    buf = x.new_zeros(n_experts * capacity, x.shape[1]).index_copy(0, dest, x[order // k])
    buf = buf.view(n_experts, capacity, -1)
    h = F.silu(torch.bmm(buf, w_gate.mT)) * torch.bmm(buf, w_up.mT)
    y = torch.bmm(h, w_down.mT).reshape(n_experts * capacity, -1)[dest]       # (T*k, d) in `order`
    y_pairs = torch.empty_like(y).index_copy(0, order, y)
    return torch.bmm(gate.to(y.dtype).unsqueeze(1), y_pairs.view(n_tokens, k, -1)).squeeze(1)


def peak_live_bytes(fn) -> int:
    """Peak of live CPU allocations made inside fn, from the profiler's memory timeline."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    live = peak = 0
    for _, action, _, size in prof._memory_profile().timeline:
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak


def saved_bytes(fn) -> int:
    """Bytes of every tensor autograd saves for backward while fn runs (parameters included)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def routings(n_tokens: int, n_experts: int, k: int) -> dict[str, torch.Tensor]:
    balanced = (torch.arange(n_tokens * k) % n_experts).view(n_tokens, k)
    worst = torch.arange(k).repeat(n_tokens, 1)                              # everyone picks experts 0..k-1
    return {"balanced": balanced, "worst_skew": worst}


def interleaved_cpu_seconds(fns: dict, repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median process CPU seconds of each fn, the fns run round-robin so that load from other
    processes on a shared machine hits them alike (CPU time, unlike wall time, ignores waiting)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            samples[name].append(time.process_time() - t0)
    return {name: sorted(v)[len(v) // 2] for name, v in samples.items()}


def tune_glibc_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds (32 MiB, 1 GiB), as CPU training set-ups do (or use
    jemalloc/tcmalloc): by default every tensor over ~128 KiB is a fresh mmap whose pages fault in
    again on each allocation, and that sys time, not FLOPs, dominates a MoE layer built from
    (T*k, hidden) temporaries. Returns False where glibc's mallopt is unavailable."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def run(quick: bool) -> Report:
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # CPU-time ratios are only meaningful without idle-spinning workers
    n_experts, k, latent, hidden, group_size = 8, 2, 48, 96, 2
    n_tokens = 1024 if quick else 2688
    repeats = 7 if quick else 15
    g = torch.Generator().manual_seed(0)
    samples = torch.stack([torch.bincount(torch.randint(0, n_experts, (n_tokens * k,), generator=g), minlength=n_experts)
                           for _ in range(200)])
    capacity = calibrate_capacity(samples, group_size, quantile=0.99)
    module = RoutedExperts(n_experts, latent, hidden, capacity_per_expert=capacity, group_size=group_size)
    weights = (module.w_gate, module.w_up, module.w_down)
    x = torch.randn(n_tokens, latent, requires_grad=True)
    gate = torch.rand(n_tokens, k, requires_grad=True)
    upstream = torch.randn(n_tokens, latent)

    always = RoutedExperts(n_experts, latent, hidden, capacity_per_expert=capacity, group_size=group_size,
                           recompute="always")
    always.load_state_dict(module.state_dict())
    weights_always = (always.w_gate, always.w_up, always.w_down)
    methods = {
        "multi_round": lambda idx: module(x, idx, gate),
        "multi_round_recompute_always": lambda idx: always(x, idx, gate),
        "naive_loop": lambda idx: naive_loop(x, idx, gate, *weights),
        "padded_dispatch": lambda idx: padded_dispatch(x, idx, gate, *weights),
    }
    results: dict = {"n_tokens": n_tokens, "top_k": k, "n_experts": n_experts, "latent_dim": latent,
                     "expert_hidden": hidden, "group_size": group_size, "capacity_per_expert": capacity,
                     "dtype": "bf16 autocast", "torch_threads": 1,
                     "timing": "median process CPU seconds of forward+backward, methods interleaved; the check "
                               "uses the tuned-malloc timings (see tune_glibc_malloc), default-malloc ones reported"}
    def clear():
        for t in (x, gate, *weights, *weights_always):
            t.grad = None

    all_steps: dict[str, dict] = {}
    for route_name, idx in routings(n_tokens, n_experts, k).items():
        steps = {}
        for name, forward in methods.items():
            def step(forward=forward, idx=idx):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = forward(idx)
                (out.float() * upstream).sum().backward()
            steps[name] = step
        all_steps[route_name] = {name: (lambda step=step: (clear(), step())) for name, step in steps.items()}
        for name, step in steps.items():
            # gradients freed outside the measured region: a free of memory allocated before the
            # profiler started would lower the measured peak
            clear()
            step()
            clear()
            entry = {"peak_live_bytes": peak_live_bytes(step)}
            clear()
            entry["saved_bytes"] = saved_bytes(step)
            clear()
            if name.startswith("multi_round"):   # the group plan's count (EP's) and the rounds computed
                entry["rounds"] = module.last_stats["rounds"]
                entry["computed_rounds"] = module.last_stats["computed_rounds"]
            results[f"{name}/{route_name}"] = entry
    # Timings: first with the default allocator, then with glibc malloc tuned for CPU training.
    for allocator in ("default_malloc", "tuned_malloc"):
        if allocator == "tuned_malloc":
            results["tuned_malloc_applied"] = tune_glibc_malloc()
        for route_name, steps in all_steps.items():
            for name, seconds in interleaved_cpu_seconds(steps, repeats).items():
                results[f"{name}/{route_name}"][f"cpu_seconds_{allocator}"] = seconds
    torch.set_num_threads(threads)

    report = Report("moe", results)
    mr_bal, mr_skew = results["multi_round/balanced"], results["multi_round/worst_skew"]
    report.check("moe_peak_memory_skew_over_balanced", mr_skew["peak_live_bytes"] / mr_bal["peak_live_bytes"], "<=", 1.1)
    report.check("moe_saved_bytes_skew_over_balanced", mr_skew["saved_bytes"] / mr_bal["saved_bytes"], "<=", 1.1)
    naive_bal = results["naive_loop/balanced"]
    results["time_multi_round_over_naive_balanced_default_malloc"] = (
        mr_bal["cpu_seconds_default_malloc"] / naive_bal["cpu_seconds_default_malloc"])
    report.check("moe_time_multi_round_over_naive_balanced",
                 mr_bal["cpu_seconds_tuned_malloc"] / naive_bal["cpu_seconds_tuned_malloc"], "<=", 1.0)
    for name in ("naive_loop", "padded_dispatch"):
        results[f"{name}_peak_memory_skew_over_balanced"] = (
            results[f"{name}/worst_skew"]["peak_live_bytes"] / results[f"{name}/balanced"]["peak_live_bytes"])
    return report


if __name__ == "__main__":
    sys.exit(main_for("moe", run))
