"""Training-step throughput of the largest cpu-demo rung vs a plain dense transformer with the same
active FLOPs per token, measured in the same run.

The MoE step is the real one (`rungs.train._train_step`: Transformer, router + load-balancing loss,
multi-round experts, activation gradient clipping, Muon+AdamW, grad clipping). The dense reference
is a minimal PyTorch transformer (same attention, SwiGLU MLP widened until its FLOPs per token
equal the MoE layer's router + shared + latent projections + top-k routed experts) trained with
AdamW. FLOP rates use each model's own analytic FLOPs per token (training = 3 × forward).
Targets: MoE FLOP rate ≥ 0.7 × dense; MoE MFU ≥ 30% of the measured bf16 matmul peak.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import Report, main_for, random_token_batch, torch_train_step
from ladder.plan.counting import count_flops_per_token
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from ladder.plan.resolve import resolve_train_config
from rungs.agc import ActivationGradClipper
from rungs.attention import causal_attention
from rungs.config import parse_config
from rungs.model import RMSNorm, Transformer, apply_rope, rope_tables
from rungs.optim import build_optimizer
from rungs.train import _pick_threads


class DenseBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, head_dim: int, n_kv: int, hidden: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.n_kv = n_heads, head_dim, n_kv
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.wq = nn.Linear(d, n_heads * head_dim, bias=False)
        self.wkv = nn.Linear(d, 2 * n_kv * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, d, bias=False)
        self.w_gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.w_down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin, window):
        B, T, _ = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.wkv(h).view(B, T, 2, self.n_kv, self.head_dim).permute(2, 0, 3, 1, 4)
        y = causal_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, window)  # the model's kernels
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        gate, up = self.w_gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.w_down(F.silu(gate) * up)


class DenseModel(nn.Module):
    def __init__(self, arch, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(arch.vocab_size, arch.d_model)
        self.blocks = nn.ModuleList(
            DenseBlock(arch.d_model, arch.n_heads, arch.head_dim,
                       arch.n_kv_heads_global if arch.is_global_layer(i) else arch.n_kv_heads_local, hidden)
            for i in range(arch.n_layers))
        self.norm = RMSNorm(arch.d_model)
        self.head = nn.Linear(arch.d_model, arch.vocab_size, bias=False)
        cos, sin = rope_tables(arch.seq_len, arch.head_dim, 10_000.0)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.windows = [None if arch.is_global_layer(n) else arch.window_tokens for n in range(arch.n_layers)]

    def forward(self, idx):
        x = self.embed(idx)
        for block, window in zip(self.blocks, self.windows):
            x = block(x, self.cos, self.sin, window)
        return self.head(self.norm(x))


def dense_hidden_for(arch) -> tuple[int, float]:
    """Dense MLP width with the MoE layer's FLOPs (router + shared + latent + routed), and the dense
    model's training FLOPs per token."""
    f = count_flops_per_token(arch)
    moe_per_layer = (f.router + f.shared_experts + f.latent_projections + f.routed_experts) / arch.n_layers
    hidden = max(1, round(moe_per_layer / (2.0 * 3 * arch.d_model)))
    dense_forward = (f.attention_projections + f.attention_scores + f.lm_head
                     + arch.n_layers * 2.0 * 3 * arch.d_model * hidden)
    return hidden, 3.0 * dense_forward


def _timed(fn, clock) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def run(quick: bool) -> Report:
    report = Report("train_step")
    recipe = load_recipe("cpu-demo")
    L = max(recipe.ladder_rungs)
    cfg = parse_config(resolve_train_config("cpu-demo", L, {"tracking_uri": None}))
    spec = plan_rung(recipe, L)
    threads = _pick_threads(cfg)
    torch.set_num_threads(threads)
    repeats = 3 if quick else 10
    torch.manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (cfg.batch_sequences, cfg.seq_len + 1))
    batch_tokens = cfg.batch_sequences * cfg.seq_len
    batch = random_token_batch(tokens)

    model = Transformer(cfg.architecture())
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay)
    clipper = ActivationGradClipper(cfg.agc_settings())
    model.activation_clip = clipper

    def moe_step():
        torch_train_step(cfg, model, optimizer, batch, clipper)

    hidden, dense_flops_per_token = dense_hidden_for(spec.arch)
    dense = DenseModel(spec.arch, hidden)
    dense_opt = torch.optim.AdamW(dense.parameters(), lr=1e-3)

    def dense_step():
        logits = dense(batch.inputs)
        F.cross_entropy(logits.view(-1, logits.size(-1)), batch.targets.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(dense.parameters(), 1.0)
        dense_opt.step()
        dense_opt.zero_grad(set_to_none=True)

    # Interleaved, and timed in process CPU seconds with one thread, so other jobs on the shared
    # machine change neither side's number (with 1 thread, CPU time is the compute time).
    clock = time.process_time if threads == 1 else time.perf_counter
    moe_step()
    dense_step()
    moe_times, dense_times = [], []
    for _ in range(repeats):
        moe_times.append(_timed(moe_step, clock))
        dense_times.append(_timed(dense_step, clock))
    moe_s, dense_s = sorted(moe_times)[len(moe_times) // 2], sorted(dense_times)[len(dense_times) // 2]
    a16 = torch.randn(2048, 2048, dtype=torch.bfloat16)
    a32 = torch.randn(2048, 2048)
    a16 @ a16, a32 @ a32
    peak = 2.0 * 2048**3 / min(_timed(lambda: a16 @ a16, clock) for _ in range(3))
    peak_fp32 = 2.0 * 2048**3 / min(_timed(lambda: a32 @ a32, clock) for _ in range(3))
    moe_rate = spec.flops_per_token * batch_tokens / moe_s
    dense_rate = dense_flops_per_token * batch_tokens / dense_s
    precision = "bf16" if cfg.bf16_on(next(model.parameters()).device.type) else "fp32"  # as _train_step decides
    report.results = {
        "rung": L, "threads": threads, "clock": clock.__name__, "precision": precision,
        "batch_tokens": batch_tokens, "moe_flops_per_token": spec.flops_per_token,
        "dense_flops_per_token": dense_flops_per_token, "dense_hidden": hidden,
        "moe_step_seconds": moe_s, "dense_step_seconds": dense_s,
        "moe_tokens_per_second": batch_tokens / moe_s, "dense_tokens_per_second": batch_tokens / dense_s,
        "moe_flops_per_second": moe_rate, "dense_flops_per_second": dense_rate,
        "peak_bf16_flops": peak, "moe_mfu": moe_rate / peak, "dense_mfu": dense_rate / peak,
        # The CPU job computes in fp32 (precision "auto"); its own matmul peak bounds MFU-vs-bf16 at
        # peak_fp32 / peak_bf16.
        "peak_fp32_flops": peak_fp32, "moe_fraction_of_fp32_peak": moe_rate / peak_fp32,
    }
    report.check("moe_over_dense_flop_rate", moe_rate / dense_rate, ">=", 0.7)
    report.check("moe_mfu_vs_measured_bf16_peak", moe_rate / peak, ">=", 0.30)
    return report


if __name__ == "__main__":
    sys.exit(main_for("train_step", run))
