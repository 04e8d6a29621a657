"""JAX multi-round dropless MoE against rungs.moe.RoutedExperts: every path, skew, the round plan."""

from __future__ import annotations

from dataclasses import asdict
from functools import cache

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.jaxjob import model as M
from rungs.jaxjob import params as P
from rungs.jaxjob.expert_parallel import routed_experts
from rungs.jaxjob.moe import default_backend, dispatch_for, plan_rounds
from rungs.model import LatentMoE, ModelConfig
from rungs.moe import RoutedExperts
from rungs.moe import plan_rounds as torch_plan_rounds

torch.set_num_threads(1)

E, LATENT, HIDDEN, T = 4, 8, 16, 12
# (capacity, group_size): plain dropless, one slot per expert (many rounds), lending in pairs, one group.
SIZES = [(None, None), (1, 1), (2, 2), (3, E)]


def routing(kind: str, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "skewed":        # ~85% of first choices on expert 1, distinct experts per token
        first = torch.where(torch.rand(T, generator=g) < 0.85, 1, torch.randint(0, E, (T,), generator=g))
        rest = [(first + 1 + j) % E for j in range(k - 1)]
        return torch.stack([first, *rest], 1)
    if kind == "one_expert":    # every token, every slot on expert E-1
        return torch.full((T, k), E - 1)
    if kind == "random":
        return torch.randint(0, E, (T, k), generator=g)
    raise ValueError(kind)


@cache
def jax_step(capacity, group_size, backend, k):
    """One compiled value-and-grad per dispatch; every routing reuses it (fixed shapes)."""
    d = dispatch_for(T, k, E, capacity_per_expert=capacity, group_size=group_size, backend=backend, block_rows=16 if backend == "pallas" else 4)

    def f(x, gate, idx, wg, wu, wd, upstream):
        out = routed_experts(d, x, gate, idx, wg, wu, wd)
        return (out * upstream).sum(), out
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 3, 4, 5), has_aux=True))


def both(capacity, group_size, backend, idx):
    torch.manual_seed(0)
    module = RoutedExperts(E, LATENT, HIDDEN, capacity_per_expert=capacity, group_size=group_size)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, LATENT, generator=g, requires_grad=True)
    gate = torch.rand(idx.shape, generator=g, requires_grad=True)
    upstream = torch.randn(T, LATENT, generator=g)
    out = module(x, idx, gate)
    (out * upstream).sum().backward()
    want = [out, x.grad, gate.grad, module.w_gate.grad, module.w_up.grad, module.w_down.grad]
    j = lambda t: jnp.asarray(t.detach().numpy())  # noqa: E731
    (_, got_out), grads = jax_step(capacity, group_size, backend, idx.shape[1])(
        j(x), j(gate), j(idx).astype(jnp.int32), j(module.w_gate), j(module.w_up), j(module.w_down), j(upstream))
    return [got_out, *grads], want, module.last_stats["rounds"]


# The whole grid on the CPU's default path; on the others (ragged: a reference and benchmark candidate;
# pallas: interpreted here, a compile of its grid loops per case) the cases that exercise their
# layout, lending and many rounds.
CASES = [("blocks", c, g, kind, k) for c, g in SIZES
         for kind, k in [("skewed", 2), ("one_expert", 2), ("random", 1), ("one_expert", 1)]] + [
    (b, *case) for b in ("ragged", "pallas")
    for case in [(None, None, "skewed", 2), (1, 1, "one_expert", 2), (2, 2, "random", 1)]] + [
    ("ragged", 3, E, "one_expert", 1)]


@pytest.mark.parametrize("backend,capacity,group_size,kind,k", CASES)
def test_output_and_every_gradient_equal_the_torch_module(backend, capacity, group_size, kind, k):
    got, want, rounds = both(capacity, group_size, backend, routing(kind, k))
    for name, a, b in zip(["out", "d_x", "d_gate", "d_w_gate", "d_w_up", "d_w_down"], got, want):
        b = b.detach().numpy()
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5 * np.abs(b).max(), err_msg=name)
    if capacity == 1 and kind == "one_expert":
        assert rounds == T * k  # all-to-one with one slot: many rounds really ran


def test_one_compiled_program_serves_every_routing():
    step = jax_step(2, 2, "blocks", 2)
    for kind in ("skewed", "one_expert", "random"):
        both(2, 2, "blocks", routing(kind, 2))
    assert step._cache_size() == 1


# One compiled plan per dispatch, shared by every count vector and seed of that dispatch (59 dispatches
# for the 200 cases below): an eager scan, or a round count per case, would compile once per case.
# PLAN_ROUNDS leaves at least two all-zero rounds after the longest plan here (29 rounds).
PLAN_ROUNDS = 32
_jit_plan_rounds = jax.jit(plan_rounds, static_argnums=(1, 2))


@pytest.mark.parametrize("seed", range(4))
def test_round_plan_equals_the_torch_plan(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        n_experts = int(rng.choice([1, 2, 4, 6, 8]))
        group_size = int(rng.choice([g for g in (1, 2, 3, n_experts) if n_experts % g == 0]))
        capacity = int(rng.integers(1, 6))
        counts = rng.integers(0, 20, n_experts) * (rng.random(n_experts) < 0.7)
        if rng.random() < 0.2:  # all on one expert
            counts = np.eye(n_experts, dtype=int)[rng.integers(n_experts)] * int(rng.integers(1, 40))
        want = torch_plan_rounds(counts.tolist(), capacity, group_size)
        d = dispatch_for(64, 1, n_experts, capacity_per_expert=capacity, group_size=group_size)
        assert len(want) + 2 <= PLAN_ROUNDS, (counts, capacity, group_size)
        got = np.asarray(_jit_plan_rounds(jnp.asarray(counts, jnp.int32), d, PLAN_ROUNDS))
        assert got[: len(want)].tolist() == want, (counts, capacity, group_size)
        assert not got[len(want):].any()


def test_buffer_sizes_equal_the_torch_module():
    for n_tokens, k, capacity, group_size in [(12, 2, None, None), (12, 2, 1, 1), (5, 3, 2, 2), (100, 2, 7, E)]:
        module = RoutedExperts(E, LATENT, HIDDEN, capacity_per_expert=capacity, group_size=group_size)
        module(torch.randn(n_tokens, LATENT), torch.randint(0, E, (n_tokens, k)), torch.rand(n_tokens, k))
        d = dispatch_for(n_tokens, k, E, capacity_per_expert=capacity, group_size=group_size)
        assert (d.capacity, d.slab_rows, d.buffer_rows) == tuple(
            module.last_stats[key] for key in ("capacity_per_expert", "slab_rows", "buffer_rows"))


def test_default_backend_is_blocks_on_cpu():
    assert jax.default_backend() != "cpu" or default_backend() == "blocks"


@pytest.mark.parametrize("score,bias,top_k,capacity", [("sigmoid", True, 2, 3), ("softmax", True, 1, None),
                                                       ("softmax", False, 2, 1)])
def test_latent_moe_block_with_router_equals_torch(score, bias, top_k, capacity):
    arch = asdict(plan_rung(load_recipe("cpu-demo"), 2).arch) | {"top_k": top_k}
    cfg = ModelConfig(**arch, router_score=score, expert_bias=bias, capacity_per_expert=capacity, group_size=2)
    torch.manual_seed(0)
    block = LatentMoE(cfg)
    if bias:  # a strong bias towards expert 0: skewed selection the gates do not see
        block.router.expert_bias.copy_(torch.tensor([1.0] + [0.0] * (cfg.n_experts - 1)))
    x = torch.randn(2, 16, cfg.d_model, requires_grad=True)
    upstream = torch.randn(2, 16, cfg.d_model)
    y, route = block(x)
    (y * upstream).sum().backward()
    params = {"layers.0.moe." + n: jnp.asarray(p.detach().numpy()) for n, p in block.named_parameters()}
    bias_vec = jnp.asarray(block.router.expert_bias.numpy())

    def f(p, x):
        out, r = M.latent_moe(p, "layers.0.moe.", bias_vec, x, cfg)
        return (out * jnp.asarray(upstream.numpy())).sum(), (out, r)
    step = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))
    (_, (out, r)), (gp, gx) = step(params, jnp.asarray(x.detach().numpy()))
    assert np.asarray(r.expert_idx).tolist() == route.expert_idx.tolist()
    assert np.asarray(r.tokens_per_expert).tolist() == route.tokens_per_expert.tolist()
    assert int(r.rounds) == block.experts.last_stats["rounds"]
    if bias:
        assert int(r.tokens_per_expert[0]) == 2 * 16  # the bias really steers selection
    np.testing.assert_allclose(np.asarray(out), y.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gx), x.grad.numpy(), rtol=1e-5, atol=1e-6)
    # One absolute floor for all tensors, the largest gradient's scale
    scale = max(float(p.grad.abs().max()) for p in block.parameters())
    # top-1 gates are the scores themselves (normalised, each would be 1 and the task loss would not
    # reach the router: its gradient was zero up to rounding), in both engines
    assert float(block.router.weight.grad.abs().max()) > 1e-3 * scale
    for n, p in block.named_parameters():
        np.testing.assert_allclose(np.asarray(gp["layers.0.moe." + n]), p.grad.numpy(), rtol=1e-5,
                                   atol=1e-5 * scale, err_msg=n)
    assert set(P.shapes(cfg)) >= set(params)
