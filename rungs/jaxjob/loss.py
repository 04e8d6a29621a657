"""Cross-entropy of the LM head without the (tokens × vocab) fp32 logits: `rungs.loss` in JAX.

At L18's 131,072-token vocabulary 8,192 tokens make 4 GiB of fp32 logits, and autodiff of the plain
`logsumexp(h @ wᵀ)` keeps several arrays of that size alive at once (the logits, their exponent,
their gradient: 14 GiB of the 37 GiB a 2-layer L18 gradient step held in temporaries before this,
`benchmarks/jax_memory.py`). `linear_cross_entropy` runs the head and the loss over chunks of tokens
in a scan: each chunk's logits are made, reduced to its loss and to its gradients with respect to
the hidden states and the head's weight, then dropped. The gradients are made in the forward
pass (three matmuls per chunk, none recomputed), so backward only scales them; what stays alive is
one chunk's logits plus the (tokens × d) and (vocab × d) gradients. As in the torch job, the
matmuls run in the hidden states' dtype, the softmax in fp32, and the weight's gradient is summed
over chunks in fp32.

When all the logits fit in one chunk (every cpu-demo rung) the plain expression runs, so the small
rungs' programs are the ones they were.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["LOGITS_PER_CHUNK", "linear_cross_entropy"]

# Logit elements per chunk: 2^27 fp32 = 512 MiB, 1,024 tokens at a 131,072 vocabulary (8 chunks for
# 8,192 tokens). Larger than the torch job's 2^25: a scan step is one kernel launch sequence, and the
# fp32 weight-gradient accumulator (vocab × d) is read and written once per chunk.
LOGITS_PER_CHUNK = 1 << 27


def _logits(h: jax.Array, w: jax.Array) -> jax.Array:
    # the product in the inputs' dtype, then fp32 (XLA:CPU has no bf16 x bf16 -> f32 dot)
    return (h @ w.T).astype(jnp.float32)


def _plain(h, w, targets):
    logits = _logits(h, w.astype(h.dtype))
    lse = jax.nn.logsumexp(logits, -1)
    return (lse - jnp.take_along_axis(logits, targets[:, None], -1)[:, 0]).mean()


def linear_cross_entropy(h: jax.Array, w: jax.Array, targets: jax.Array, *,
                         logits_per_chunk: int = LOGITS_PER_CHUNK) -> jax.Array:
    """mean_t CE(h_t · wᵀ, targets_t) in fp32: h (N, d) in the compute dtype, w (V, d) (cast to h's
    dtype for the products; its gradient comes back in w's dtype), targets (N,) int in [0, V)."""
    if h.ndim != 2 or w.ndim != 2 or h.shape[1] != w.shape[1]:
        raise ValueError(f"hidden (N, d) and weight (V, d) expected, got {h.shape} and {w.shape}")
    if targets.shape != h.shape[:1]:
        raise ValueError(f"targets must be ({h.shape[0]},), got {targets.shape}")
    if logits_per_chunk < 1:
        raise ValueError(f"logits_per_chunk must be >= 1, got {logits_per_chunk}")
    chunk = max(1, logits_per_chunk // w.shape[0])
    if h.shape[0] <= chunk:
        return _plain(h, w, targets)
    return _chunked(chunk, h, w, targets)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunked(chunk: int, h, w, targets):
    return _chunked_fwd(chunk, h, w, targets)[0]


def _chunked_fwd(chunk, h, w, targets):
    n, d = h.shape
    n_chunks = -(-n // chunk)
    pad = n_chunks * chunk - n
    wc = w.astype(h.dtype)
    hs = jnp.pad(h, ((0, pad), (0, 0))).reshape(n_chunks, chunk, d)
    ts = jnp.pad(targets, (0, pad)).reshape(n_chunks, chunk)
    live = (jnp.arange(n_chunks * chunk) < n).reshape(n_chunks, chunk)    # padded tokens weigh 0

    def step(carry, xs):
        total, dw = carry
        hc, tc, keep = xs
        logits = _logits(hc, wc)                                            # (chunk, V) fp32
        lse = jax.nn.logsumexp(logits, -1)
        target = jnp.take_along_axis(logits, tc[:, None], -1)[:, 0]
        total = total + jnp.sum(jnp.where(keep, lse - target, 0.0))
        # d(mean loss)/d logits = (softmax - onehot) / N
        g = jnp.exp(logits - lse[:, None]).at[jnp.arange(chunk), tc].add(-1.0)
        g = (jnp.where(keep[:, None], g, 0.0) / n).astype(h.dtype)
        dh = g @ wc                                                         # (chunk, d)
        dw = dw + (g.T @ hc).astype(jnp.float32)                            # (V, d) fp32
        return (total, dw), dh

    (total, dw), dh = jax.lax.scan(step, (jnp.zeros((), jnp.float32), jnp.zeros(w.shape, jnp.float32)),
                                   (hs, ts, live))
    dh = dh.reshape(n_chunks * chunk, d)[:n].astype(h.dtype)
    return total / n, (dh, dw.astype(w.dtype), targets)


def _chunked_bwd(chunk, res, g):
    dh, dw, targets = res
    return (dh * g.astype(dh.dtype), dw * g.astype(dw.dtype), np.zeros(targets.shape, jax.dtypes.float0))


_chunked.defvjp(_chunked_fwd, _chunked_bwd)
