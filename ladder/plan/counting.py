"""Exact parameter and FLOP counts of one rung's architecture, from the tensor shapes it builds.

`parameter_shapes` (in `rungs.architecture`, beside the architecture it reads) lists every
trainable tensor under the name the torch and JAX models give it, so the plan's counts can be checked tensor by tensor against a
built model. FLOPs count every matmul a token passes through (2 FLOPs per multiply-add) plus
attention scores and values over the real causal/sliding-window context; elementwise work
(norms, activations, softmax) is left out, as in every MFU convention we know of.

Attention is counted over the (query, key) pairs the causal and window rules allow
(`attention_context_mean`), not over what a kernel executes: kernels work in tiles and compute a
whole tile whenever the rule allows any pair in it. `attention_executed_context_mean` gives the
executed count of each kernel `rungs.attention` runs; at mai-base-2's seq 4096 and window 1024 with
128-token tiles the executed count is 1.125× the planned one on a window layer (FlexAttention on
CUDA), 1.031× on a global one (causal FlashAttention), and 2.29× on a window layer on CPU
(block-local chunks). The plan keeps the allowed-pair count: it is part of every trial's identity
(`flops_per_token`) and is the convention MFU is reported in.
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


def attention_executed_context_mean(seq_len: int, window: int | None, kernel: str, *, block_tokens: int = 128) -> float:
    """Mean number of keys per query the attention kernel actually computes scores for.

    kernel: "flex" (CUDA; FlexAttention on window layers, FlashAttention's causal kernel on global
    ones, both modelled as skipping only the block_tokens × block_tokens tiles the rule leaves
    wholly empty; FlashAttention's real tiles are 64–128 × 64–176 by version and head size, so its
    count is approximate), "block_local" (CPU window layers: chunks of `window` queries against
    their own and the previous chunk, 2·window keys per query, padded to whole chunks) or "dense"
    (a full (T, T) mask: every key, the model of older versions).
    """
    T = seq_len
    windowed = window is not None and window < T
    if kernel == "dense":
        return float(T)
    if kernel == "block_local":
        if windowed:
            n_chunks = -(-T // window)
            return n_chunks * window * 2 * window / T
        kernel = "flex"  # global layers: causal SDPA, tiled like the CUDA kernels
    if kernel != "flex":
        raise ValueError(f"kernel must be 'flex', 'block_local' or 'dense', got {kernel!r}")
    b = block_tokens
    n = -(-T // b)
    reach = T if not windowed else window  # a query sees keys q - reach < k <= q
    tiles = 0
    for row in range(n):
        # Key tiles holding any allowed pair for query rows [row·b, row·b + b - 1].
        first = max(0, (row * b - reach + 1) // b)
        tiles += row - first + 1
    return tiles * b * b / T


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
