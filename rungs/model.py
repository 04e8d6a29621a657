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
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from rungs import init_stream
from rungs.architecture import ModelConfig, init_std
from rungs.attention import causal_attention
from rungs.loss import linear_cross_entropy
from rungs.moe import RoutedExperts
from rungs.pointwise import fused, rope_rotate, swiglu
from rungs.router import Router, RouterOutput, recomputing

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
        return rms_norm(x, self.weight, self.eps, compute_dtype(x))


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the next GEMM computes x in: autocast's where it is on, x's own otherwise."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


@fused
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """Normalise in fp32 (bf16 mean-of-squares loses precision) and return in `dtype`: under autocast
    the compute dtype, so the GEMMs that read the norm (three in attention, four in the MoE) share
    one cast instead of making one each."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the rotary angles, each (seq_len, head_dim/2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_dim: int = -2) -> torch.Tensor:
    """Rotate channel pairs (2j, 2j+1) of x (B, h, T, hd), or (B, T, h, hd) with seq_dim=-3, by
    position-dependent angles."""
    T = x.shape[seq_dim]
    cos, sin = cos[:T], sin[:T]
    if seq_dim == -3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (T, 1, hd/2): one angle per position, all heads
    if x.device.type == "cuda":
        return rope_rotate(x, cos, sin)  # real arithmetic, one compiled kernel
    # One complex multiply per pair: (x_2j + i·x_2j+1)·(cos + i·sin); 3x faster on CPU than the
    # four real multiplies on strided halves.
    rot = torch.complex(cos, sin)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (..., hd/2) complex
    return torch.view_as_real(pairs * rot).flatten(-2).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention; global layers attend causally over the whole sequence, local ones
    over a sliding window (no mask tensor: `rungs.attention.causal_attention` picks the kernel).
    K/V heads are shared by n_heads / n_kv_heads query heads."""

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
        self.window_tokens: int | None = None if is_global else cfg.window_tokens

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # RoPE before the transpose, on the GEMMs' contiguous (B, T, heads, hd) outputs: no copy.
        q = apply_rope(self.wq(x).view(B, T, self.n_heads, self.head_dim), cos, sin, seq_dim=-3)
        k = apply_rope(self.wk(x).view(B, T, self.n_kv_heads, self.head_dim), cos, sin, seq_dim=-3)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, hd), (B, kv, T, hd)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, kv, T, hd)
        y = causal_attention(q, k, v, self.window_tokens)  # (B, H, T, hd)
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
        return self.w_down(swiglu(self.w_gate(x), self.w_up(x), None))


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
                                     capacity_per_expert=cfg.capacity_per_expert,
                                     capacity_factor=cfg.capacity_factor, group_size=cfg.group_size)

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


def _checkpoint_contexts():
    # Recomputation in backward runs the forward again: the routers must not count its tokens twice.
    return nullcontext(), recomputing()


class Block(nn.Module):
    """Attention and MoE sub-layers with their residuals. Activation checkpointing (a training-memory
    option, the same numbers): "selective" recomputes the attention sub-layer in backward instead of
    keeping its activations, "full" the whole block (only its input is kept)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.activation_checkpointing = cfg.activation_checkpointing
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, is_global=cfg.is_global_layer(layer))
        self.moe_norm = RMSNorm(cfg.d_model)
        self.moe = LatentMoE(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def _attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.attn(self.attn_norm(x), cos, sin))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                clip: ActivationClip) -> tuple[torch.Tensor, RouterOutput]:
        x = clip(x, self.layer, "residual")  # the residual stream entering the block
        if self.activation_checkpointing == "full" and torch.is_grad_enabled():
            return checkpoint(self._body, x, cos, sin, clip, use_reentrant=False, context_fn=_checkpoint_contexts)
        return self._body(x, cos, sin, clip)

    def _body(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              clip: ActivationClip) -> tuple[torch.Tensor, RouterOutput]:
        if self.activation_checkpointing == "selective" and torch.is_grad_enabled():
            x = x + checkpoint(self._attention, x, cos, sin, use_reentrant=False)
        else:
            x = x + self._attention(x, cos, sin)
        h = clip(self.moe_norm(x), self.layer, "moe_input")
        moe_out, route = self.moe(h)
        x = x + self.dropout(moe_out)
        return x, route


# (name, parameter) -> (whole shape, first row of the local part, the local tensor to fill)
LocalRows = Callable[[str, torch.Tensor], tuple[torch.Size, int, torch.Tensor]]

def _whole_tensor(name: str, p: torch.Tensor) -> tuple[torch.Size, int, torch.Tensor]:
    return p.shape, 0, p


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        """Built on the meta device (no constructor allocates or draws), then, unless the caller builds
        under `torch.device("meta")` itself (the sharded job, which shards first), materialised on the
        default device and initialised by `init_weights`, the one place initialisation happens."""
        super().__init__()
        self.cfg = cfg
        device = torch.get_default_device()
        with torch.device("meta"):
            # Shapes only, no values: init_weights sets them all. (A normal_ or cos on the meta device
            # draws nothing but imports torch._dynamo, ~3 s of CPU per process, hence the embedding
            # from an empty weight and the empty RoPE tables.)
            self.embed = nn.Embedding.from_pretrained(torch.empty(cfg.vocab_size, cfg.d_model), freeze=False)
            self.drop = nn.Dropout(cfg.dropout)
            self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
            self.final_norm = RMSNorm(cfg.d_model)
            self.lm_head = None if cfg.tied_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            self.register_buffer("rope_cos", torch.empty(cfg.seq_len, cfg.head_dim // 2), persistent=False)
            self.register_buffer("rope_sin", torch.empty(cfg.seq_len, cfg.head_dim // 2), persistent=False)
        self.activation_clip: ActivationClip = _no_clip
        if device.type != "meta":
            self.to_empty(device=device)
            self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None, local_rows: LocalRows | None = None) -> None:
        """Initialise every parameter and buffer: the model's one init policy, applied once.

        The policy is `rungs.architecture.init_std`, the rule the JAX parameters draw by too: GPT-2 style,
        N(0, init_std) everywhere, the projections into the residual stream scaled by 1/sqrt(2·n_layers),
        norm weights 1; RoPE tables computed, router bias and counts zero. Nothing else initialises the
        model: it is built on the meta device, where the modules' own standalone inits (nn.Linear's,
        the router's, the expert stacks') draw nothing, and this pass draws each parameter once, in
        state-dict order, from `generator` (default: torch's global CPU generator), always on the CPU,
        so a model has the same values on any device. Parameter i gets exactly what
        `torch.empty(shape).normal_(0, std, generator=generator)` would give at that point of the stream.

        `local_rows(name, param)` -> (whole shape, first row, local tensor): where this process's
        part of a sharded parameter sits in the whole tensor (`rungs.parallel.distributed.local_rows`).
        Each part gets exactly the values the whole tensor would get (`rungs.init_stream.normal_part`),
        one chunk of draws at a time: no process holds a whole parameter.
        """
        gen = torch.default_generator if generator is None else generator
        where = local_rows or _whole_tensor
        for name, p in self.named_parameters():
            shape, first_row, local = where(name, p)
            std = init_std(name, self.cfg)
            if std is None:
                local.fill_(1.0)
                continue
            direct = local.device.type == "cpu" and local.dtype == torch.float32 and local.is_contiguous()
            out = local if direct else torch.empty(local.shape)
            init_stream.normal_part(gen, shape.numel(), first_row * shape[1:].numel(), out, std=std)
            if not direct:
                local.copy_(out)
        self.init_buffers()

    def init_buffers(self) -> None:
        """The buffers' values (RoPE tables computed, router bias and counts zero): all a model needs
        besides a checkpoint's parameters when it is restored (`init_weights` calls it)."""
        for name, buf in self.named_buffers():
            if name in ("rope_cos", "rope_sin"):
                cos, sin = rope_tables(self.cfg.seq_len, self.cfg.head_dim, self.cfg.rope_theta)
                buf.copy_(cos if name == "rope_cos" else sin)
            elif name.endswith(("router.expert_bias", "router.pending_counts")):
                buf.zero_()
            else:
                raise ValueError(f"init_weights has no rule for buffer {name!r}: add one")

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, list[RouterOutput]]:
        """idx (B, T) token ids → logits (B, T, V) and each layer's routing (for the balancing losses).

        With targets (B, T), the first result is instead the mean cross-entropy (fp32 scalar), taken
        over token chunks (`rungs.loss`) so the (B·T, V) logits never exist; it is computed here,
        inside forward, so a sharded head is still gathered when it runs."""
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
        if targets is not None:
            return linear_cross_entropy(x.reshape(B * T, -1), head, targets.reshape(B * T)), routes
        logits = F.linear(x, head)  # (B, T, V)
        return logits, routes
