"""The rung model: a decoder-only latent-MoE transformer, plain nn.Module code, readable top to bottom.

Data flows: token embedding → n_layers × [RMSNorm → GQA attention (RoPE; a global layer every
`global_every`-th layer with few KV heads, sliding-window local layers with more KV heads) →
residual, RMSNorm → MoE (router on d_model, one shared SwiGLU expert in d_model, routed SwiGLU
experts in the latent space) → residual] → RMSNorm → untied LM head.

No parallelism lives here (torchtitan's rule): sharding is applied from outside. State-dict names
and shapes are the contract with `ladder.plan.counting.parameter_shapes`, tested tensor by tensor.
Activation gradient clipping hooks in through `activation_clip` (identity unless the trainer
installs a clipper), at the points named in `rungs.agc.POINTS`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from rungs.architecture import ModelConfig
from rungs.moe import RoutedExperts
from rungs.router import Router, RouterOutput

# (x, layer, point) -> x; the identity unless activation gradient clipping is on.
ActivationClip = Callable[[torch.Tensor, int, str], torch.Tensor]


def _no_clip(x: torch.Tensor, layer: int, point: str) -> torch.Tensor:
    return x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (bf16 mean-of-squares loses precision), return in the input dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the rotary angles, each (seq_len, head_dim/2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (2j, 2j+1) of x (B, h, T, hd) by position-dependent angles."""
    T = x.shape[-2]
    # One complex multiply per pair: (x_2j + i·x_2j+1)·(cos + i·sin); 3x faster on CPU than the
    # four real multiplies on strided halves.
    rot = torch.complex(cos[:T], sin[:T])  # (T, hd/2)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, h, T, hd/2)
    return torch.view_as_real(pairs * rot).flatten(-2).to(x.dtype)  # (B, h, T, hd)


def attention_mask(seq_len: int, window_tokens: int | None) -> torch.Tensor:
    """Boolean (T, T) mask, True where query i may attend key j: causal, and within the window.

    A local query sees itself and the window_tokens - 1 keys before it, the convention
    `ladder.plan.counting.attention_context_mean` counts FLOPs with.
    """
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    mask = j <= i
    if window_tokens is not None:
        mask &= (i - j) < window_tokens
    return mask


class Attention(nn.Module):
    """Grouped-query attention; global layers attend causally over the whole sequence, local ones
    over a sliding window. K/V heads are shared by n_heads / n_kv_heads query heads."""

    def __init__(self, cfg: ModelConfig, *, is_global: bool) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.n_kv_heads = cfg.n_kv_heads_global if is_global else cfg.n_kv_heads_local
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        self.wq = nn.Linear(cfg.d_model, self.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, self.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.register_buffer("mask", attention_mask(cfg.seq_len, None if is_global else cfg.window_tokens), persistent=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, kv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, kv, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask[:T, :T], enable_gqa=True)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, H*hd)
        return self.wo(y)


class SwiGLU(nn.Module):
    """The shared expert: a dense SwiGLU MLP in d_model."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class LatentMoE(nn.Module):
    """Router and shared expert see d_model; routed experts work in latent_dim (LatentMoE): tokens
    are projected down once before dispatch and the combined expert output projected back up."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.router = Router(cfg.d_model, cfg.n_experts, cfg.top_k, score=cfg.router_score,
                             expert_bias=cfg.expert_bias, bias_update_rate=cfg.bias_update_rate)
        self.shared = SwiGLU(cfg.d_model, cfg.n_shared_experts * cfg.shared_hidden) if cfg.n_shared_experts else None
        if cfg.latent_dim != cfg.d_model:
            self.latent_down = nn.Linear(cfg.d_model, cfg.latent_dim, bias=False)
            self.latent_up = nn.Linear(cfg.latent_dim, cfg.d_model, bias=False)
        else:
            self.latent_down = self.latent_up = None
        self.experts = RoutedExperts(cfg.n_experts, cfg.latent_dim, cfg.expert_hidden,
                                     capacity_per_expert=cfg.capacity_per_expert, group_size=cfg.group_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, RouterOutput]:
        B, T, d = x.shape
        flat = x.reshape(B * T, d)  # (N, d), N = B*T tokens
        route = self.router(flat)  # expert_idx, gate: (N, k)
        h = self.latent_down(flat) if self.latent_down is not None else flat  # (N, latent)
        y = self.experts(h, route.expert_idx, route.gate)  # (N, latent), gate-weighted sum over k
        y = self.latent_up(y) if self.latent_up is not None else y  # (N, d)
        if self.shared is not None:
            y = y + self.shared(flat)
        return y.view(B, T, d), route


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, is_global=cfg.is_global_layer(layer))
        self.moe_norm = RMSNorm(cfg.d_model)
        self.moe = LatentMoE(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                clip: ActivationClip) -> tuple[torch.Tensor, RouterOutput]:
        x = clip(x, self.layer, "residual")  # the residual stream entering the block
        x = x + self.dropout(self.attn(self.attn_norm(x), cos, sin))
        h = clip(self.moe_norm(x), self.layer, "moe_input")
        moe_out, route = self.moe(h)
        x = x + self.dropout(moe_out)
        return x, route


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = RMSNorm(cfg.d_model)
        self.lm_head = None if cfg.tied_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.activation_clip: ActivationClip = _no_clip
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 style: N(0, 0.02) everywhere, output projections scaled by 1/sqrt(2·n_layers)."""
        std = self.cfg.init_std
        out_std = std / (2 * self.cfg.n_layers) ** 0.5
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("attn.wo.weight", "w_down.weight", "experts.w_down", "latent_up.weight")):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, list[RouterOutput]]:
        """idx (B, T) token ids → logits (B, T, V) and each layer's routing (for the balancing losses)."""
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens exceeds the model's seq_len {self.cfg.seq_len}")
        x = self.drop(self.embed(idx))  # (B, T, d)
        routes: list[RouterOutput] = []
        for block in self.layers:
            x, route = block(x, self.rope_cos, self.rope_sin, self.activation_clip)
            routes.append(route)
        x = self.final_norm(x)
        head = self.embed.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, head)  # (B, T, V)
        return logits, routes
