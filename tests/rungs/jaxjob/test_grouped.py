"""rungs.jaxjob.grouped: the grouped matmul over expert blocks, xla and Pallas (interpreted here),
against a float64 per-block reference; its gradients; the xla path in bounded steps; and the
Pallas kernels lowered for a CUDA GPU (Triton), which this machine can do without one."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rungs.jaxjob import grouped
from rungs.jaxjob.grouped import GroupedMatmulError, gmm

B = 16  # rows per block (the Pallas kernels' smallest)
# 9 blocks over 5 experts: expert 2 has none, expert 3 three, two unused blocks (E) at the end
BLOCK_EXPERT = np.array([0, 0, 1, 3, 3, 3, 4, 5, 5], np.int32)
E, N, K = 5, 40, 24  # neither N nor K a multiple of 16: the Pallas path pads them


def _operands(seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = BLOCK_EXPERT.size * B
    a = rng.standard_normal((rows, K)).astype(np.float32)
    a[BLOCK_EXPERT.repeat(B) == E] = 0.0          # unused blocks hold zero rows, as row_layout leaves them
    w = rng.standard_normal((E, N, K)).astype(np.float32)
    up = rng.standard_normal((rows, N)).astype(np.float32)
    return a, w, up


def _reference(a, w, up):
    """float64: out, d(sum(out * up))/da, /dw, block by block."""
    a, w, up = (x.astype(np.float64) for x in (a, w, up))
    out, da, dw = np.zeros((a.shape[0], N)), np.zeros_like(a), np.zeros_like(w)
    for b, e in enumerate(BLOCK_EXPERT):
        rows = slice(b * B, (b + 1) * B)
        if e == E:
            continue
        out[rows] = a[rows] @ w[e].T
        da[rows] = up[rows] @ w[e]
        dw[e] += up[rows].T @ a[rows]
    return out, da, dw


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_product_and_gradients_equal_a_float64_per_block_reference(impl):
    a, w, up = _operands()
    want = _reference(a, w, up)

    def f(a, w):
        out = gmm(a, w, jnp.asarray(BLOCK_EXPERT), block_rows=B, impl=impl)
        return (out * up).sum(), out
    (_, out), (da, dw) = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(a, w)
    for name, got, ref in zip(("out", "d_a", "d_w"), (out, da, dw), want):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=name)
    assert not np.asarray(out)[BLOCK_EXPERT.repeat(B) == E].any()   # unused blocks: zero rows
    assert not np.asarray(dw)[2].any()                                # an expert with no block: zero gradient


def test_the_xla_path_in_bounded_steps_equals_one_step(monkeypatch):
    a, w, up = _operands(1)
    def grads():
        f = lambda a, w: (gmm(a, w, jnp.asarray(BLOCK_EXPERT), block_rows=B, impl="xla") * up).sum()  # noqa: E731
        return jax.jit(jax.grad(f, argnums=(0, 1)))(a, w)
    whole = grads()
    monkeypatch.setattr(grouped, "_GATHERED_ELEMENTS", 2 * N * K)    # two blocks' weights a step: 5 steps
    assert grouped._chunks(BLOCK_EXPERT.size, N, K) == 2
    for got, ref in zip(grads(), whole):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-6, atol=1e-6)


def test_the_pallas_kernels_lower_to_triton_for_a_cuda_gpu_at_l18_expert_shapes():
    # forward and both gradients of one projection of L18's experts (512 x 768 x 768, bf16,
    # 1,408 blocks of 64 rows: one round of 2 x 4,096 tokens), lowered, not run
    experts, width, blocks = 512, 768, 1408
    def f(a, w, be):
        return (gmm(a, w, be, block_rows=64, impl="pallas", interpret=False).astype(jnp.float32) ** 2).sum()
    args = (jax.ShapeDtypeStruct((blocks * 64, width), jnp.bfloat16),
            jax.ShapeDtypeStruct((experts, width, width), jnp.bfloat16), jax.ShapeDtypeStruct((blocks,), jnp.int32))
    text = jax.jit(jax.grad(f, argnums=(0, 1))).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    kernels = [name for name in ("grouped_matmul\"", "grouped_matmul_t", "grouped_matmul_dw") if name in text]
    assert text.count("__gpu$xla.gpu.triton") == 3 and len(kernels) == 3, kernels


def test_bad_sizes_are_refused_with_a_typed_error():
    a, w, _ = _operands()
    be = jnp.asarray(BLOCK_EXPERT)
    with pytest.raises(GroupedMatmulError, match="power of two"):
        gmm(a[: 9 * 8], w, be, block_rows=8, impl="pallas")
    with pytest.raises(GroupedMatmulError, match="whole blocks"):
        gmm(a[:-1], w, be, block_rows=B)
    with pytest.raises(GroupedMatmulError, match=r"\(E, N, 24\)"):
        gmm(a, w[:, :, :-1], be, block_rows=B)
    with pytest.raises(GroupedMatmulError, match="impl"):
        partial(gmm, impl="cuda")(a, w, be, block_rows=B)


def _in_shard_map(fn, interpret: bool):
    """fn = gmm inside shard_map on a (1, 1) mesh: the operands vary over the mesh axes, as under
    expert parallelism (the stacks cast to varying over data, as `expert_parallel` does)."""
    from jax.sharding import PartitionSpec as P

    from rungs.jaxjob.sharding import make_mesh

    def body(a, w, be):
        w = jax.lax.pcast(w, ("data",), to="varying")
        return fn(a, w, be, block_rows=B, impl="pallas", interpret=interpret)
    rows = P(("data", "expert"))
    return jax.shard_map(body, mesh=make_mesh(1, 1), in_specs=(rows, P("expert"), rows), out_specs=rows)


def test_under_shard_map_the_kernels_lower_for_a_gpu_and_run_as_the_xla_path_off_one():
    a, w, up = _operands(2)
    be = jnp.asarray(BLOCK_EXPERT)

    def loss(f):
        return lambda a, w: ((f(a, w, be) * up) ** 2).sum()   # squared: the backward needs the forward
    got = jax.jit(jax.grad(loss(_in_shard_map(gmm, interpret=True)), argnums=(0, 1)))(a, w)
    want = jax.grad(loss(partial(gmm, block_rows=B, impl="xla")), argnums=(0, 1))(a, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-6, atol=1e-6)
    lowered = jax.jit(jax.grad(loss(_in_shard_map(gmm, interpret=False)), argnums=(0, 1))).trace(a, w).lower(
        lowering_platforms=("cuda",))
    assert lowered.as_text().count("__gpu$xla.gpu.triton") == 3
