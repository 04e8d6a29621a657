"""Cross-entropy of the LM head without the (tokens × vocab) fp32 logits, at the device's matmul rate.

At a 131,072-token vocabulary one micro-batch of 32k tokens would hold 17 GB of fp32 logits, twice
(the logits and their gradient). `linear_cross_entropy` runs the head and the loss over chunks of
tokens: each chunk's logits are made, reduced to its loss and, when a gradient is wanted, to its
gradients with respect to the hidden states and the head's weight, then freed (Liger-Kernel's fused
linear cross-entropy, in plain torch). The gradients are computed in the forward pass, so backward
only scales them by the incoming gradient: the matmuls are the three of the plain path (logits,
grad of hidden, grad of weight), none recomputed.

Where the time goes, per logit (V = vocabulary, d = model width; the three GEMMs cost 6·d FLOPs per
logit, 9,216 at d = 1,536: 11.4 ps on an H200 at its measured 805 TFLOP/s; bytes at ~4 TB/s):

- the chunk's elementwise work, memory-bound. The eager path (`_softmax_grad`) has the GEMM write
  fp32 logits (4 B; on CUDA bf16 operands with an fp32 output, `out_dtype`), log-softmax read them
  and write fp32 log-probabilities (≈ 16 B: its passes over a 512-KB row), and one `exp` write the
  gradient in bf16 (6 B): ≈ 26 B, 6.5 ps, against ≈ 62 B for the code before (a bf16 copy to fp32,
  logsumexp's temporaries, four in-place passes, a cast). The compiled path (`torch.compile` of
  `_softmax_grad_fused`, CUDA's default) reads the bf16 logits in one reduction and one pointwise
  pass that writes the bf16 gradient: ≈ 8 B, 2 ps (by this count the loss at ≈ 1.2× its GEMMs);
- per chunk, the fp32 (V × d) weight gradient: accumulated inside its GEMM (`addmm` with beta = 1;
  on CUDA with bf16 operands, `out_dtype`), never a bf16 (V × d) temporary, its copy to fp32 and an
  add (2.4 GB moved per 256-token chunk at L18 before: 146 ms of a 297-ms loss on an H200). Its read
  and write are fixed per chunk, so chunks are large on a GPU (`rungs.loss_chunks`: a share of the
  device's memory; 4,096 tokens on an H200 at V = 131,072), and the 1/N scale rides in the GEMMs'
  alpha instead of a pass over the logits.

Softmax statistics are fp32 in every path; the loss is summed over chunks in float64. Under autocast
the chunk matmuls run in the autocast dtype and the value and gradients equal the plain
`F.cross_entropy(F.linear(h, w).float(), t)`'s within bf16 rounding (fp32 rounding in fp32). When all
the logits fit in one chunk (every cpu-demo rung: 2,688 tokens × 512) the plain path runs:
`benchmarks/block_kernels.py` measured the one-chunk Function 1.13× slower there.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from rungs.loss_chunks import LOGITS_PER_CHUNK, chunk_tokens

__all__ = ["KERNELS", "LOGITS_PER_CHUNK", "linear_cross_entropy", "loss_chunk_tokens"]

log = logging.getLogger(__name__)

# How a chunk's softmax and gradient are computed: "eager" (stock kernels) or "compiled"
# (torch.compile of the same math, fused); None picks compiled on CUDA, eager elsewhere.
KERNELS = ("eager", "compiled")

# Device types whose GEMMs take bf16 operands into an fp32 output (`torch.addmm(..., out_dtype=)`);
# filled on first use (CUDA since torch 2.8; not the CPU in 2.13).
_OUT_DTYPE_GEMM: dict[str, bool] = {}
_COMPILE_FAILED: set[str] = set()


def _compute_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


def _autocast_off(device_type: str):
    # the meta device (shape-only runs of the loss) has no autocast to turn off
    available = torch.amp.is_autocast_available(device_type)
    return torch.autocast(device_type, enabled=False) if available else contextlib.nullcontext()


@functools.lru_cache(maxsize=8)
def _device_memory_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return None


def loss_chunk_tokens(n_tokens: int, vocab: int, device: torch.device, logits_per_chunk: int | None = None) -> int:
    """Tokens per chunk for `n_tokens` rows on `device` (`rungs.loss_chunks.chunk_tokens` with the
    device's memory: large chunks on a GPU, `LOGITS_PER_CHUNK` logits on the CPU)."""
    return chunk_tokens(n_tokens, vocab, _device_memory_bytes(device), logits_per_chunk=logits_per_chunk)


def _out_dtype_gemm(device_type: str) -> bool:
    return _OUT_DTYPE_GEMM.get(device_type, device_type != "cpu")


def _gemm_failed(device_type: str, err: Exception) -> None:
    _OUT_DTYPE_GEMM[device_type] = False
    log.info("no out_dtype GEMM on %s (%s): widening operands", device_type, err)


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # fp32 for bf16 and fp32 chunks, float64 for float64


def _wide_logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(n, V) logits h @ wᵀ in fp32 straight from the GEMM where the device can (bf16 operands); else
    in the operands' dtype (log-softmax then widens them, as the plain path's `.float()` does)."""
    if _stats_dtype(h.dtype) != h.dtype and _out_dtype_gemm(h.device.type):
        try:
            out = torch.mm(h, w.T, out_dtype=torch.float32)
            _OUT_DTYPE_GEMM[h.device.type] = True
            return out
        except (RuntimeError, NotImplementedError, TypeError) as err:
            _gemm_failed(h.device.type, err)
    return h @ w.T


def _softmax_grad(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
                  want_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk from stock kernels: per-token loss (n,) fp32 and d(sum of losses)/d logits =
    softmax - onehot in h's dtype (None without `want_grad`). Passes over the (n, V) block: the
    fp32 logits, fp32 log-softmax, and its exp written once in the gradient's dtype."""
    logp = torch.log_softmax(_wide_logits(h, w), dim=-1, dtype=_stats_dtype(h.dtype))  # fp32 statistics
    target_logp = logp.gather(-1, targets[:, None]).squeeze(-1)
    if not want_grad:
        return -target_logp, None
    grad = logp if h.dtype == logp.dtype else torch.empty(logp.shape, dtype=h.dtype, device=logp.device)
    torch.exp(logp, out=grad)
    del logp
    # the targets' entries p - 1 from the fp32 probability, one rounding as every other entry
    grad[torch.arange(targets.shape[0], device=targets.device), targets] = (target_logp.exp() - 1.0).to(grad.dtype)
    return -target_logp, grad


def _softmax_grad_fused(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_softmax_grad` from the chunk's logits, written as whole-tensor math for `torch.compile` to
    fuse into a reduction and one pointwise pass over the logits in their dtype (each op here, run
    eagerly, would be a pass of its own)."""
    z = logits.to(_stats_dtype(logits.dtype))
    lse = torch.logsumexp(z, dim=-1, keepdim=True)                           # (n, 1) fp32
    loss = (lse - z.gather(-1, targets[:, None])).squeeze(-1)
    is_target = torch.arange(z.shape[-1], device=z.device)[None, :] == targets[:, None]
    grad = torch.exp(z - lse) - is_target.to(z.dtype)
    return loss, grad.to(logits.dtype)


@functools.cache
def _compiled_softmax_grad() -> Callable:
    return torch.compile(_softmax_grad_fused, dynamic=None)


def _chunk_loss_and_grad(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, kernel: str,
                         want_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token loss (n,) and, with `want_grad`, the (n, V) gradient of the summed loss, in h's dtype."""
    device_type = h.device.type
    if kernel == "compiled" and want_grad and device_type not in _COMPILE_FAILED:
        try:
            return _compiled_softmax_grad()(h @ w.T, targets)
        except Exception as err:  # no Triton or compiler on the machine: the eager kernels, once said
            _COMPILE_FAILED.add(device_type)
            log.warning("compiled loss chunk failed on %s (%s); using the eager kernels", device_type, err)
    return _softmax_grad(h, w, targets, want_grad)


def _gemm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, accumulate: bool, alpha: float,
               widen: bool) -> None:
    """out = alpha · a @ b (+ out when `accumulate`), accumulated in `out`'s dtype inside the GEMM.

    Operands narrower than `out` (bf16 into fp32): on devices with the `out_dtype` GEMM, in one call;
    elsewhere either the operands are widened (`widen`: never a temporary the size of `out`, for the
    (V × d) weight gradient) or the product is made in the operands' dtype and copied into `out` (a
    small (tokens × d) block)."""
    beta = 1 if accumulate else 0
    if a.dtype == out.dtype:
        torch.addmm(out, a, b, beta=beta, alpha=alpha, out=out)
        return
    if _out_dtype_gemm(out.device.type):
        try:
            torch.addmm(out, a, b, out_dtype=out.dtype, beta=beta, alpha=alpha, out=out)
            _OUT_DTYPE_GEMM[out.device.type] = True
            return
        except (RuntimeError, NotImplementedError, TypeError) as err:
            _gemm_failed(out.device.type, err)
    if widen:
        torch.addmm(out, a.to(out.dtype), b.to(out.dtype), beta=beta, alpha=alpha, out=out)
    elif accumulate:
        out.add_(torch.mm(a, b), alpha=alpha)
    else:
        out.copy_(torch.mm(a, b).mul_(alpha))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int, kernel: str) -> torch.Tensor:
        n_tokens = hidden.shape[0]
        dtype = _compute_dtype(hidden.device.type, hidden.dtype)
        want_hidden_grad, want_weight_grad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_grad = want_hidden_grad or want_weight_grad
        with _autocast_off(hidden.device.type):
            w = weight.to(dtype)                                                   # (V, d), once
            losses = []
            grad_hidden = torch.empty_like(hidden) if want_hidden_grad else None
            # fp32 (V, d), written by the first chunk's GEMM, accumulated into by the others'
            grad_weight = torch.empty(weight.shape, dtype=torch.float32, device=weight.device) if want_weight_grad else None
            for i, start in enumerate(range(0, n_tokens, chunk)):
                rows = slice(start, start + chunk)
                h = hidden[rows].to(dtype)                                         # (n, d)
                # the only (tokens × vocab) tensors are this chunk's: its logits and their gradient
                loss, grad = _chunk_loss_and_grad(h, w, targets[rows], kernel, want_grad)
                losses.append(loss.double().sum())
                if want_hidden_grad:
                    _gemm_into(grad_hidden[rows], grad, w, accumulate=False, alpha=1.0 / n_tokens, widen=False)
                if want_weight_grad:
                    _gemm_into(grad_weight, grad.T, h, accumulate=i > 0, alpha=1.0 / n_tokens, widen=True)
                del grad
            loss = torch.stack(losses).sum()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return (loss / n_tokens).float()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = grad_hidden * grad_loss.to(grad_hidden.dtype) if grad_hidden is not None else None
        dw = (grad_weight * grad_loss).to(ctx.weight_dtype) if grad_weight is not None else None
        return dh, dw, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         logits_per_chunk: int | None = None, kernel: str | None = None) -> torch.Tensor:
    """mean_t CE(hidden_t · weightᵀ, targets_t) in fp32, over chunks of tokens.

    hidden (N, d), weight (V, d), targets (N,) int in [0, V): the value and gradients equal
    `F.cross_entropy(F.linear(hidden, weight).float(), targets)`'s (no ignore_index, no smoothing).
    `logits_per_chunk`: the chunk's logits (default: by the device's memory, `loss_chunk_tokens`);
    `kernel`: one of `KERNELS` (default: compiled on CUDA, eager elsewhere).
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden (N, d) and weight (V, d) expected, got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be ({hidden.shape[0]},), got {tuple(targets.shape)}")
    if hidden.shape[0] == 0:
        raise ValueError("no tokens to take the loss over")
    if logits_per_chunk is not None and logits_per_chunk < 1:
        raise ValueError(f"logits_per_chunk must be >= 1, got {logits_per_chunk}")
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or None, got {kernel!r}")
    chunk = loss_chunk_tokens(hidden.shape[0], weight.shape[0], hidden.device, logits_per_chunk)
    if hidden.shape[0] <= chunk:
        return F.cross_entropy(F.linear(hidden, weight).float(), targets)
    kernel = kernel or ("compiled" if hidden.device.type == "cuda" else "eager")
    return _LinearCrossEntropy.apply(hidden, weight, targets, chunk, kernel)
