"""Exact parameter and FLOP counts of one rung's architecture, from the tensor shapes it builds.

`parameter_shapes` (in `rungs.architecture`, beside the architecture it reads) lists every
trainable tensor under the name the torch and JAX models give it, so the plan's counts can be checked tensor by tensor against a
built model. FLOPs count every matmul a token passes through (2 FLOPs per multiply-add) plus
attention scores and values over the real causal/sliding-window context; elementwise work
(norms, activations, softmax) is left out, as in every MFU convention we know of.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from rungs.architecture import Architecture, layer_shapes, parameter_shapes

__all__ = ["Architecture", "count_flops_per_token", "count_parameters", "layer_shapes", "parameter_shapes"]


@dataclass(frozen=True)
class ParamCounts:
    total: int
    active: int  # touched by one token: everything but the unrouted (n_experts - top_k) experts
    embedding: int  # input embedding table (+ LM head when untied)
    nonembedding_total: int
    nonembedding_active: int


def _is_embedding(name: str) -> bool:
    return name in ("embed.weight", "lm_head.weight")


def count_parameters(arch: Architecture) -> ParamCounts:
    total = active = embedding = 0
    routed_fraction_num, routed_fraction_den = arch.top_k, arch.n_experts
    for name, shape in parameter_shapes(arch).items():
        n = prod(shape)
        total += n
        if _is_embedding(name):
            embedding += n
        if ".moe.experts." in name:
            # Each expert is an equal slice of the stack; a token uses top_k of them.
            active += n * routed_fraction_num // routed_fraction_den
        else:
            active += n
    return ParamCounts(
        total=total,
        active=active,
        embedding=embedding,
        nonembedding_total=total - embedding,
        nonembedding_active=active - embedding,
    )


def attention_context_mean(seq_len: int, window: int | None) -> float:
    """Mean number of keys a query attends to in a causal sequence (optionally windowed)."""
    if window is None or window >= seq_len:
        return (seq_len + 1) / 2
    # Positions t < window see t+1 keys; the rest see `window` keys.
    total = window * (window + 1) / 2 + (seq_len - window) * window
    return total / seq_len


@dataclass(frozen=True)
class FlopCounts:
    """Forward FLOPs per token by component; training is 3× forward (backward = 2× forward)."""

    attention_projections: float
    attention_scores: float
    router: float
    shared_experts: float
    latent_projections: float
    routed_experts: float
    lm_head: float

    @property
    def forward(self) -> float:
        return (
            self.attention_projections
            + self.attention_scores
            + self.router
            + self.shared_experts
            + self.latent_projections
            + self.routed_experts
            + self.lm_head
        )

    @property
    def training(self) -> float:
        return 3.0 * self.forward


def count_flops_per_token(arch: Architecture) -> FlopCounts:
    d, hd = arch.d_model, arch.head_dim
    q = arch.n_heads * hd
    proj = scores = 0.0
    for layer in range(arch.n_layers):
        is_global = arch.is_global_layer(layer)
        kv = (arch.n_kv_heads_global if is_global else arch.n_kv_heads_local) * hd
        proj += 2.0 * d * (2 * q + 2 * kv)
        ctx = attention_context_mean(arch.seq_len, None if is_global else arch.window_tokens)
        # QK^T and AV: each 2·head_dim FLOPs per (query head, key) pair.
        scores += 4.0 * arch.n_heads * hd * ctx
    n = arch.n_layers
    lat, h = arch.latent_dim, arch.expert_hidden
    return FlopCounts(
        attention_projections=proj,
        attention_scores=scores,
        router=n * 2.0 * d * arch.n_experts,
        shared_experts=n * 2.0 * 3 * d * arch.shared_hidden * arch.n_shared_experts,
        latent_projections=n * 2.0 * 2 * d * lat if arch.has_latent_projection else 0.0,
        routed_experts=n * 2.0 * 3 * lat * h * arch.top_k,
        lm_head=2.0 * d * arch.vocab_size,
    )
