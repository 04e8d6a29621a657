"""Cross-entropy of the LM head without the (tokens × vocab) fp32 logits.

At a 131,072-token vocabulary one micro-batch of 16k tokens would hold 8.6 GB of fp32 logits, twice
(the logits and their gradient). `linear_cross_entropy` runs the head and the loss over chunks of
tokens: each chunk's logits are made, reduced to its loss and, when a gradient is wanted, to its
gradients with respect to the hidden states and the head's weight, then freed (Liger-Kernel's fused
linear cross-entropy, in plain torch). The gradients are computed in the forward pass, so backward
only scales them by the incoming gradient: the matmuls are the three of the plain path (logits,
grad of hidden, grad of weight), none recomputed; what stays alive is one (chunk × vocab) block plus
the (tokens × d) and (vocab × d) gradients.

Under autocast the chunk matmuls run in the autocast dtype and the softmax in fp32, as the plain
`F.cross_entropy(F.linear(h, w).float(), t)` does; the weight's gradient is accumulated over chunks
in fp32. When all the logits fit in one chunk (every cpu-demo rung: 2,688 tokens × 512) the plain
path runs: `benchmarks/block_kernels.py` measured the one-chunk Function 1.13× slower there, and
2,048 tokens × a 32,768 vocabulary (268 MB of fp32 logits, two chunks) at 0.70× the plain time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["LOGITS_PER_CHUNK", "linear_cross_entropy"]

# Logit elements per chunk: 2^25 fp32 = 128 MiB, i.e. 256 tokens at a 131,072 vocabulary; a
# cpu-demo micro-batch (2,688 tokens × 512) fits in one chunk.
LOGITS_PER_CHUNK = 1 << 25


def _compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_tokens: int) -> torch.Tensor:
        n_tokens = hidden.shape[0]
        dtype = _compute_dtype(hidden.device.type, hidden.dtype)
        want_hidden_grad, want_weight_grad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            loss = torch.zeros((), dtype=torch.float64, device=hidden.device)  # summed over chunks exactly
            grad_hidden = torch.empty_like(hidden) if want_hidden_grad else None
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight_grad else None
            for start in range(0, n_tokens, chunk_tokens):
                rows = slice(start, start + chunk_tokens)
                h = hidden[rows].to(dtype)
                logits = F.linear(h, w).float()  # (n, V): the only (tokens × vocab) tensor, one chunk of it
                t = targets[rows]
                lse = torch.logsumexp(logits, dim=-1)  # (n,)
                loss += (lse - logits.gather(-1, t[:, None]).squeeze(-1)).double().sum()
                if not (want_hidden_grad or want_weight_grad):
                    continue
                # d(mean loss)/d logits = (softmax - onehot) / N, made in place in the logits' memory.
                grad_logits = logits.sub_(lse[:, None]).exp_()
                grad_logits[torch.arange(t.shape[0], device=t.device), t] -= 1.0
                grad_logits = grad_logits.div_(n_tokens).to(dtype)
                if want_hidden_grad:
                    grad_hidden[rows] = (grad_logits @ w).to(hidden.dtype)
                if want_weight_grad:
                    grad_weight += (grad_logits.T @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return (loss / n_tokens).float()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = grad_hidden * grad_loss.to(grad_hidden.dtype) if grad_hidden is not None else None
        dw = (grad_weight * grad_loss).to(ctx.weight_dtype) if grad_weight is not None else None
        return dh, dw, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         logits_per_chunk: int = LOGITS_PER_CHUNK) -> torch.Tensor:
    """mean_t CE(hidden_t · weightᵀ, targets_t) in fp32, over chunks of tokens.

    hidden (N, d), weight (V, d), targets (N,) int in [0, V): the value and gradients equal
    `F.cross_entropy(F.linear(hidden, weight).float(), targets)`'s (no ignore_index, no smoothing).
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden (N, d) and weight (V, d) expected, got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be ({hidden.shape[0]},), got {tuple(targets.shape)}")
    if hidden.shape[0] == 0:
        raise ValueError("no tokens to take the loss over")
    if logits_per_chunk < 1:
        raise ValueError(f"logits_per_chunk must be >= 1, got {logits_per_chunk}")
    chunk_tokens = max(1, logits_per_chunk // weight.shape[0])
    if hidden.shape[0] <= chunk_tokens:
        return F.cross_entropy(F.linear(hidden, weight).float(), targets)
    return _LinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens)
