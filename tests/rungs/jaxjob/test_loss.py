"""rungs.jaxjob.loss.linear_cross_entropy: over token chunks (a padded last chunk) it equals the
plain cross-entropy, value and gradients, in fp32 and in bf16, and holds no (tokens x vocab) array."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rungs.jaxjob.loss import linear_cross_entropy

N, V, D = 50, 64, 8


def _operands(dtype):
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.standard_normal((N, D)), dtype)
    w = jnp.asarray(rng.standard_normal((V, D)) * 0.5, jnp.float32)     # fp32 master, as the model passes it
    t = jnp.asarray(rng.integers(0, V, N), jnp.int32)
    return h, w, t


def _reference(h, w, t):
    """float64: the mean loss and its gradients, (softmax - onehot) / N through the head."""
    h, w, t = np.asarray(h, np.float64), np.asarray(w, np.float64), np.asarray(t)
    logits = h @ w.T
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    g = np.exp(logits - lse[:, None])
    g[np.arange(N), t] -= 1.0
    g /= N
    return (lse - logits[np.arange(N), t]).mean(), g @ w, g.T @ h


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_chunks_equal_the_plain_loss_and_gradients(dtype, tol):
    h, w, t = _operands(dtype)
    want, dh, dw = _reference(h, w, t)
    chunked = jax.jit(jax.value_and_grad(lambda h, w: linear_cross_entropy(h, w, t, logits_per_chunk=16 * V),
                                         argnums=(0, 1)))                 # 16 tokens a chunk: 4 chunks
    got, (gh, gw) = chunked(h, w)
    assert gh.dtype == h.dtype and gw.dtype == jnp.float32
    np.testing.assert_allclose(float(got), float(want), rtol=tol)
    for a, b in ((gh, dh), (gw, dw)):
        b = np.asarray(b, np.float64)
        np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=tol, atol=tol * np.abs(b).max())


def test_no_array_of_all_the_logits_is_made():
    h, w, t = _operands(jnp.float32)
    hlo = jax.jit(jax.grad(lambda h, w: linear_cross_entropy(h, w, t, logits_per_chunk=16 * V), argnums=(0, 1))
                  ).lower(h, w).compile().as_text()
    assert f"[{N},{V}]" not in hlo and f"[16,{V}]" in hlo


def test_bad_shapes_are_refused():
    h, w, t = _operands(jnp.float32)
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(h, w, t[:-1])
    with pytest.raises(ValueError, match="weight"):
        linear_cross_entropy(h, w[:, :-1], t)
