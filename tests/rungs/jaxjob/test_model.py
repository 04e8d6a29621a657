"""The JAX rung model against rungs.model.Transformer: logits, loss and every gradient at two
cpu-demo rungs; block-local attention against the full masked softmax; the bias update."""

from __future__ import annotations

from dataclasses import asdict

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.jaxjob import model as M
from rungs.jaxjob import params as P
from rungs.attention import attention_mask
from rungs.model import ModelConfig, Transformer
from rungs.router import Router, load_balancing_loss, z_loss

torch.set_num_threads(1)

LB, Z = 0.01, 1e-3
# L2: softmax router, one round. L3: sigmoid router with a planted expert bias and a capacity that
# forces several rounds per layer, lending in groups of two.
CASES = {"cpu-demo-L2": (2, {}),
         "cpu-demo-L3-sigmoid-bias-rounds": (3, dict(router_score="sigmoid", expert_bias=True,
                                                     capacity_per_expert=8, group_size=2))}


def config(L: int, **extra) -> ModelConfig:
    return ModelConfig(**asdict(plan_rung(load_recipe("cpu-demo"), L).arch), **extra)


def torch_run(model: Transformer, inputs, targets):
    """The torch job's objective (rungs.train._train_step): CE + LB·LBL + Z·z-loss, and its grads."""
    logits, routes = model(inputs)
    ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
    total = ce + LB * load_balancing_loss(routes, model.cfg.n_experts, model.cfg.top_k) + Z * z_loss(routes)
    total.backward()
    rounds = [block.moe.experts.last_stats["rounds"] for block in model.layers]
    return logits.detach().numpy(), float(total.detach()), rounds


@pytest.mark.parametrize("case", list(CASES))
def test_logits_loss_and_every_gradient_equal_torch(case):
    L, extra = CASES[case]
    cfg = config(L, **extra)
    torch.manual_seed(0)
    model = Transformer(cfg)
    if cfg.expert_bias:
        for block in model.layers:
            block.moe.router.expert_bias.normal_(0.0, 0.05)
    g = torch.Generator().manual_seed(1)
    inputs, targets = (torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g) for _ in range(2))
    want_logits, want_loss, want_rounds = torch_run(model, inputs, targets)

    params, buffers = P.from_torch_state_dict(model.state_dict(), cfg)
    inputs, targets = jnp.asarray(inputs.numpy()), jnp.asarray(targets.numpy())

    def step(p, b, x, y):
        (total, aux), grads = jax.value_and_grad(M.loss, has_aux=True)(p, b, x, y, cfg, LB, Z)
        logits, _ = M.forward(p, b, x, cfg)
        return total, aux, grads, logits
    total, aux, grads, logits = jax.jit(step)(params, buffers, inputs, targets)

    assert abs(float(total) - want_loss) <= 1e-5 * abs(want_loss)
    assert np.abs(np.asarray(logits) - want_logits).max() <= 1e-5 * np.abs(want_logits).max()
    assert np.asarray(aux["rounds"]).tolist() == want_rounds
    if cfg.capacity_per_expert:
        assert min(want_rounds) > 1  # the multi-round path really ran
    assert set(grads) == {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():
        ref = p.grad.numpy()
        err = np.abs(np.asarray(grads[name]) - ref).max()
        assert err <= 1e-5 * np.abs(ref).max(), f"{name}: max error {err:.3g}, scale {np.abs(ref).max():.3g}"


def dense_reference(q, k, v, window):
    """The full (T, T) masked softmax, as the torch model's attention_mask builds it; GQA by repeat."""
    T, H, kv = q.shape[1], q.shape[2], k.shape[2]
    k, v = (np.repeat(a, H // kv, axis=2) for a in (k, v))
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(attention_mask(T, window).numpy(), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", probs, v)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("T,window", [(24, 8), (29, 8), (7, 8), (16, 1), (24, None), (64, None)])
def test_attention_equals_the_full_masked_softmax(T, window, fused):
    """Heads-major block-local (and global) attention, and the fused-kernel path, against the dense
    float64 reference; the einsum path in float64 too, the fused one in fp32 (its softmax is fp32)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, T, 4, 8))                          # (B, T, H, hd), H = kv * g
    k, v = rng.standard_normal((2, 2, T, 2, 8))                    # (B, T, kv, hd)
    want = dense_reference(q, k, v, window)
    heads_major = (q.reshape(2, T, 2, 2, 8).transpose(0, 2, 3, 1, 4), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))
    dtype, tol = (jnp.float32, dict(rtol=1e-5, atol=2e-6)) if fused else (jnp.float64, dict(rtol=1e-12, atol=1e-12))
    with jax.enable_x64(True):
        got = M.attention_core(*(jnp.asarray(a, dtype) for a in heads_major), window, fused)
        got = np.asarray(got, np.float64).transpose(0, 3, 1, 2, 4).reshape(q.shape)
    np.testing.assert_allclose(got, want, **tol)


def _array_shapes(fn, *args) -> set[tuple[int, ...]]:
    """Shapes of every array fn's gradient computes, nested jaxprs (pjit, custom_vjp) included."""
    jaxpr = jax.make_jaxpr(jax.grad(lambda *a: fn(*a).sum(), argnums=len(args) - 1))(*args)
    out, todo = set(), [jaxpr.jaxpr]
    while todo:
        j = todo.pop()
        for eqn in j.eqns:
            out |= {tuple(v.aval.shape) for v in eqn.outvars}
            todo += list(jax.extend.core.jaxprs_in_params(eqn.params))
    return out


def _has_square(shapes, T):
    return any(len(s) >= 2 and s[-1] == T and s[-2] == T for s in shapes)


def test_no_layer_materialises_a_sequence_by_sequence_score_array():
    # The check can see a (T, T) score array: a global core over a length that does not split has one.
    q, k = jnp.ones((1, 1, 2, 30, 8)), jnp.ones((1, 1, 30, 8))
    assert _has_square(_array_shapes(lambda q: M.attention_core(q, k, k, None), q), 30)
    cfg = config(3)
    T = cfg.seq_len
    assert cfg.window_tokens < T and not cfg.is_global_layer(0) and cfg.is_global_layer(2)
    params = P.init_params(cfg, jax.random.key(0))
    x = jnp.ones((2, T, cfg.d_model))
    cos, sin = M.rope_tables(cfg.seq_len, cfg.head_dim, cfg.rope_theta)
    for layer in (0, 2):  # windowed: blocks of 2W keys; global: query chunks
        fn = lambda p, x, i=layer: M.attention(p, f"layers.{i}.attn.", x, cos, sin, cfg,  # noqa: E731
                                               cfg.is_global_layer(i), fused=False)
        assert not _has_square(_array_shapes(fn, params, x), T), layer


def test_activation_clip_points_equal_the_torch_model():
    cfg = config(2)
    seen = []

    def record(x, layer, point):
        seen.append((layer, point))
        return x
    jax.eval_shape(lambda p, t: M.forward(p, None, t, cfg, clip=record), P.init_params(cfg, jax.random.key(0)),
                   jnp.zeros((1, 8), jnp.int32))
    torch_seen = []
    torch.manual_seed(0)
    model = Transformer(cfg)
    model.activation_clip = lambda x, layer, point: torch_seen.append((layer, point)) or x
    model(torch.zeros(1, 8, dtype=torch.long))
    assert seen == torch_seen


def _count_primitives(jaxpr, names: tuple[str, ...]) -> int:
    """Equations of these primitives in a jaxpr and every jaxpr nested in its equations (jit, scan)."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name in names
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                count += _count_primitives(inner, names)
    return count


@pytest.mark.parametrize("mode,remats", [("none", 0), ("selective", 2), ("full", 2)])
def test_activation_checkpointing_recomputes_in_the_backward_with_the_same_gradients(mode, remats):
    """The option is not ignored (the traced gradient holds one jax.checkpoint per layer: the attention
    sub-layer, or the block) and changes no number: loss and gradients equal those kept in memory."""
    base, cfg = config(2), config(2, activation_checkpointing=mode)
    params = P.init_params(base, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 17), 0, base.vocab_size)

    def grad_fn(c):
        return jax.value_and_grad(lambda p: M.loss(p, None, tokens[:, :-1], tokens[:, 1:], c, LB, Z)[0])

    assert _count_primitives(jax.make_jaxpr(grad_fn(cfg))(params).jaxpr, ("checkpoint", "remat", "remat2")) == remats
    (want, want_grads), (got, got_grads) = (jax.jit(grad_fn(c))(params) for c in (base, cfg))
    assert abs(float(got) - float(want)) <= 1e-6 * abs(float(want))
    for name, ref in want_grads.items():
        ref = np.asarray(ref)
        assert np.abs(np.asarray(got_grads[name]) - ref).max() <= 1e-6 * np.abs(ref).max(), name


def test_expert_bias_update_equals_the_torch_router():
    cfg = config(2, expert_bias=True, bias_update_rate=0.01)
    counts = torch.tensor([[5, 0, 3, 3, 9, 1, 3, 0], [2, 2, 2, 2, 2, 2, 2, 2]])
    buffers = M.update_expert_bias(P.init_buffers(cfg), jnp.asarray(counts.numpy()), cfg.bias_update_rate)
    buffers = M.update_expert_bias(buffers, jnp.asarray(counts.numpy()[::-1].copy()), cfg.bias_update_rate)
    for layer in range(2):
        router = Router(cfg.d_model, cfg.n_experts, cfg.top_k, expert_bias=True, bias_update_rate=0.01)
        router.update_bias(counts[layer])
        router.update_bias(counts[1 - layer])
        np.testing.assert_allclose(np.asarray(buffers[P.bias_name(layer)]), router.expert_bias.numpy(), atol=1e-7)


def test_dropout_is_refused():
    cfg = config(2, dropout=0.1)
    with pytest.raises(ValueError, match="dropout"):
        jax.eval_shape(lambda p, t: M.forward(p, None, t, cfg), P.init_params(cfg, jax.random.key(0)),
                       jnp.zeros((1, 8), jnp.int32))
