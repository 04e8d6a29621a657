"""Causal attention without a dense (T, T) mask: the kernels behind `rungs.model.Attention`.

A global layer is plain causal SDPA (`is_causal=True`): FlashAttention on CUDA, the fused flash
kernel on CPU, both of which skip the key blocks above the diagonal. A sliding-window layer
(query i sees keys i - window < j <= i, `ladder.plan.counting.attention_context_mean`'s convention)
runs, by device:

- CUDA: FlexAttention, compiled, with a block mask built once per (seq_len, window, device) and
  cached. It computes only the (128 × 128) blocks the mask touches, see
  `ladder.plan.counting.attention_executed_context_mean` for the exact count. A ragged length (an
  eval batch of short documents) is padded to one of a few lengths, so the compiled kernel is not
  recompiled for every width (dynamo gives up after 8 and falls back to the unfused kernel).
- CPU: FlexAttention has no backward on CPU (torch 2.13: "FlexAttention does not support backward
  on CPU", eager and compiled), so queries are cut into chunks of `window` and each chunk attends,
  through SDPA with a small (window × 2·window) mask, to its own chunk and the one before: 2·window
  scores per query instead of T. `benchmarks/attention.py` measures it against the dense mask.

All three take grouped-query inputs as SDPA does (q: (B, H, T, hd); k, v: (B, kv, T, hd), H a
multiple of kv) and return (B, H, T, hd). `attention_mask` is the dense reference they are tested
against.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["FLEX_BLOCK_TOKENS", "attention_mask", "causal_attention", "sliding_window_block_mask"]

# FlexAttention's default block (queries × keys): the unit in which it skips or computes.
FLEX_BLOCK_TOKENS = 128


def attention_mask(seq_len: int, window_tokens: int | None) -> torch.Tensor:
    """Boolean (T, T) mask, True where query i may attend key j: causal, and within the window.

    A local query sees itself and the window_tokens - 1 keys before it, the convention
    `ladder.plan.counting.attention_context_mean` counts FLOPs with. The reference the kernels
    below are tested against; no layer builds it any more.
    """
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    mask = j <= i
    if window_tokens is not None:
        mask &= (i - j) < window_tokens
    return mask


def _sliding_window_rule(window_tokens: int) -> Callable:
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window_tokens)
    return mask_mod


@functools.lru_cache(maxsize=16)
def sliding_window_block_mask(seq_len: int, window_tokens: int, device: str):
    """FlexAttention's BlockMask of the sliding-window rule, built once per (seq_len, window, device)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_sliding_window_rule(window_tokens), None, None, seq_len, seq_len, device=device,
                             BLOCK_SIZE=FLEX_BLOCK_TOKENS)


@functools.cache
def _compiled_flex_attention() -> Callable:
    # Uncompiled, flex_attention falls back to a reference that materialises every score.
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_padded_tokens(seq_len: int) -> int:
    """The length FlexAttention runs a sequence of seq_len at: the next power of two or the next
    multiple of 1024, whichever is shorter, at least one block (7 lengths up to 4096)."""
    power_of_two = 1 << max(seq_len - 1, 1).bit_length()
    return max(FLEX_BLOCK_TOKENS, min(power_of_two, -(-seq_len // 1024) * 1024))


def _flex_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_tokens: int,
                           flex: Callable | None = None) -> torch.Tensor:
    T = q.shape[-2]
    padded = flex_padded_tokens(T)
    if padded != T:  # padded keys lie after every real query (causal); padded queries are dropped
        q, k, v = (F.pad(t, (0, 0, 0, padded - T)) for t in (q, k, v))
    block_mask = sliding_window_block_mask(padded, window_tokens, str(q.device))
    flex = flex or _compiled_flex_attention()
    return flex(q, k, v, block_mask=block_mask, enable_gqa=True)[:, :, :T]


@functools.lru_cache(maxsize=16)
def _chunk_masks(n_chunks: int, window_tokens: int, device: torch.device) -> torch.Tensor:
    """(n_chunks, 1, W, 2W) boolean: query i of chunk c (position cW + i) against key j of the
    previous-plus-own chunk pair (position (c-1)W + j); the first chunk's previous chunk is padding."""
    W = window_tokens
    i = torch.arange(W, device=device)[:, None]
    j = torch.arange(2 * W, device=device)[None, :]
    lag = W + i - j  # query position minus key position
    rule = (lag >= 0) & (lag < W)  # (W, 2W)
    masks = rule.expand(n_chunks, W, 2 * W).clone()
    masks[0, :, :W] = False
    return masks[:, None]


def _block_local_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  window_tokens: int) -> torch.Tensor:
    B, H, T, hd = q.shape
    kv = k.shape[1]
    W = window_tokens
    n = math.ceil(T / W)
    pad = n * W - T  # padded queries are dropped; padded keys lie after every real query (causal)
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))

    def pairs(t: torch.Tensor) -> torch.Tensor:
        chunks = t.view(B, kv, n, W, hd)
        previous = F.pad(chunks, (0, 0, 0, 0, 1, 0))[:, :, :n]  # chunk c-1 beside chunk c (zeros for c = 0)
        both = torch.cat([previous, chunks], dim=3)  # (B, kv, n, 2W, hd)
        return both.transpose(1, 2).reshape(B * n, kv, 2 * W, hd)

    qc = q.view(B, H, n, W, hd).transpose(1, 2).reshape(B * n, H, W, hd)  # (B·n, H, W, hd)
    masks = _chunk_masks(n, W, q.device).repeat(B, 1, 1, 1)  # (B·n, 1, W, 2W)
    y = F.scaled_dot_product_attention(qc, pairs(k), pairs(v), attn_mask=masks, enable_gqa=True)
    y = y.view(B, n, H, W, hd).transpose(1, 2).reshape(B, H, n * W, hd)
    return y[:, :, :T]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_tokens: int | None) -> torch.Tensor:
    """Causal GQA attention, optionally within a sliding window; (B, H, T, hd) out."""
    T = q.shape[-2]
    if window_tokens is None or window_tokens >= T:  # the window covers every causal key
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if q.device.type == "cuda":
        return _flex_window_attention(q, k, v, window_tokens)
    return _block_local_window_attention(q, k, v, window_tokens)
