"""The JAX Muon+AdamW against rungs.optim: roles and decay masks for every cpu-demo parameter name,
10 steps of schedule + clipping + both optimizers within 1e-5, and one compiled step for any LR/WD."""

from __future__ import annotations

from dataclasses import asdict

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from rungs.architecture import parameter_shapes
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.jaxjob.optim import (OptimConfigError, Schedule, build_optimizer, clip_by_global_norm, decay_mask,
                                hyperparams, lr_multiplier, param_roles, with_hyperparams)
from rungs.model import ModelConfig, Transformer
from rungs.optim import build_optimizer as torch_build_optimizer
from rungs.optim import clip_grad_norm_, lr_at

torch.set_num_threads(1)


def _arch(L):
    return plan_rung(load_recipe("cpu-demo"), L).arch


def _torch_roles_and_decay(model, **kw):
    opt = torch_build_optimizer(model, lr=0.01, weight_decay=0.1, **kw)
    by_id = {id(p): (g["role"], g["weight_decay"] > 0) for g in opt.param_groups for p in g["params"]}
    return {n: by_id[id(p)] for n, p in model.named_parameters()}


@pytest.mark.parametrize("L", [2, 3, 4, 5, 6])
def test_roles_and_decay_masks_equal_rungs_optim_for_every_cpu_demo_name(L):
    shapes = parameter_shapes(_arch(L))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**asdict(_arch(L))))
    for kw in ({}, {"no_decay_roles": ("embedding", "bias")}):
        want = _torch_roles_and_decay(model, **kw)
        roles = param_roles(shapes)                                    # from shapes alone
        assert roles == param_roles({n: jnp.zeros(s) for n, s in shapes.items()})
        mask = decay_mask(roles, **kw)
        assert set(roles) == set(want)
        assert {n: (roles[n], mask[n]) for n in roles} == want


SCHEDULES = [Schedule(total_steps=10, warmup_steps=3), Schedule(10, 0, "cosine", 0.0),
             Schedule(10, 2, "wsd", 0.1, 0.5), Schedule(7, 7, "wsd"), Schedule(1000, 50, "wsd", 0.05, 0.2)]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_lr_multiplier_equals_lr_at_at_every_step(schedule):
    steps = np.arange(schedule.total_steps + 3)
    got = np.asarray(jax.jit(lambda s: lr_multiplier(s, schedule))(jnp.asarray(steps)))
    want = [lr_at(int(s), **schedule._asdict()) for s in steps]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_invalid_schedule_and_hyperparameters_are_refused():
    params = {"embed.weight": jnp.zeros((4, 2))}
    with pytest.raises(OptimConfigError, match="schedule"):
        build_optimizer(params, lr=0.1, weight_decay=0.0, schedule=Schedule(10, 1, "linear"))
    with pytest.raises(OptimConfigError, match="warmup_steps"):
        build_optimizer(params, lr=0.1, weight_decay=0.0, schedule=Schedule(10, 11))
    with pytest.raises(OptimConfigError, match="no optimizer role"):
        build_optimizer({"mystery.weight": jnp.zeros((4, 2))}, lr=0.1, weight_decay=0.0, schedule=Schedule(10, 1))
    with pytest.raises(OptimConfigError, match="unknown roles"):
        decay_mask({"embed.weight": "embedding"}, no_decay_roles=("embeddings",))
    state = build_optimizer(params, lr=0.1, weight_decay=0.0, schedule=Schedule(10, 1)).init(params)
    with pytest.raises(OptimConfigError, match="momentum"):
        with_hyperparams(state, momentum=0.9)


def test_clip_by_global_norm_is_clip_grad_norm_():
    rng = np.random.default_rng(0)
    grads = {"a": rng.standard_normal((5, 3)).astype(np.float32), "b": rng.standard_normal(7).astype(np.float32)}
    for max_norm in (0.5, 100.0):
        params = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads.values()]
        for p, g in zip(params, grads.values()):
            p.grad = torch.from_numpy(g.copy())
        want_norm = clip_grad_norm_(params, max_norm)
        got, norm = jax.jit(clip_by_global_norm)({k: jnp.asarray(v) for k, v in grads.items()}, max_norm)
        assert float(norm) == pytest.approx(want_norm, rel=1e-6)
        for p, k in zip(params, grads):
            np.testing.assert_allclose(np.asarray(got[k]), p.grad.numpy(), rtol=1e-6, atol=1e-7)
    grads["b"][0] = np.inf                                              # non-finite: left as is
    got, norm = clip_by_global_norm({k: jnp.asarray(v) for k, v in grads.items()}, 0.5)
    assert not np.isfinite(float(norm))
    np.testing.assert_array_equal(np.asarray(got["a"]), grads["a"])


def _step_fn(tx, max_norm):
    @jax.jit
    def step(params, state, grads):
        grads, norm = clip_by_global_norm(grads, max_norm)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, norm

    return step


@pytest.mark.parametrize(("schedule", "no_decay_roles"), [
    (Schedule(10, 3, "cosine"), ("embedding", "lm_head", "norm", "router", "bias")),   # the default
    (Schedule(10, 2, "wsd", 0.1, 0.5), ("embedding",)),                                 # AdamW roles decayed too
])
def test_ten_steps_of_a_cpu_demo_rung_match_the_torch_optimizer(schedule, no_decay_roles):
    """rungs.optim.build_optimizer (Muon with fp32 Newton-Schulz + torch AdamW), lr_at and
    clip_grad_norm_ as rungs.train drives them, against the JAX transformation: every weight of
    cpu-demo L2 within 1e-5 after 10 steps, gradient norms within 1e-6 relative."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**asdict(_arch(2))))
    kw = dict(lr=0.02, weight_decay=0.1, adam_lr=0.01, no_decay_roles=no_decay_roles)
    topt = torch_build_optimizer(model, **kw)
    topt.muon.ns_dtype = torch.float32
    params = {n: jnp.asarray(p.detach().numpy().copy()) for n, p in model.named_parameters()}
    tx = build_optimizer(params, schedule=schedule, ns_dtype=jnp.float32, **kw)
    state = tx.init(params)
    step = _step_fn(tx, 1.0)
    rng = np.random.default_rng(0)
    for i in range(10):
        scale = 0.3 if i % 3 else 0.01                              # clipped on most steps, not all
        grads = {n: (rng.standard_normal(p.shape) * scale).astype(np.float32) for n, p in model.named_parameters()}
        topt.set_lr_multiplier(lr_at(i, **schedule._asdict()))
        for n, p in model.named_parameters():
            p.grad = torch.from_numpy(grads[n].copy())
        want_norm = clip_grad_norm_(model, 1.0)
        topt.step()
        params, state, norm = step(params, state, {k: jnp.asarray(v) for k, v in grads.items()})
        assert float(norm) == pytest.approx(want_norm, rel=1e-6)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(params[n]), p.detach().numpy(), rtol=1e-5, atol=1e-5, err_msg=n)


def test_changing_lr_and_wd_reuses_the_compiled_step_and_takes_effect():
    shapes = parameter_shapes(_arch(2))
    rng = np.random.default_rng(0)
    params0 = {n: jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.1) for n, s in shapes.items()}
    grads = {n: jnp.asarray(rng.standard_normal(s).astype(np.float32)) for n, s in shapes.items()}
    schedule = Schedule(10, 2)

    def run(step, tx, **hp):
        state = tx.init(params0)
        if hp:
            state = with_hyperparams(state, **hp)
        params = params0
        for _ in range(2):
            params, state, _ = step(params, state, grads)
        return params, state

    tx = build_optimizer(params0, lr=0.02, weight_decay=0.1, schedule=schedule, ns_dtype=jnp.float32)
    step = _step_fn(tx, 1.0)
    base, _ = run(step, tx)
    assert step._cache_size() == 1
    swept, state = run(step, tx, lr=0.005, weight_decay=0.3, adam_lr=0.001)
    assert step._cache_size() == 1                                    # no recompilation
    assert {k: float(v) for k, v in hyperparams(state).items()} == pytest.approx(
        {"lr": 0.005, "weight_decay": 0.3, "adam_lr": 0.001})
    # The swept values are the ones used: equal to an optimizer built with them, unlike the base run.
    fresh_tx = build_optimizer(params0, lr=0.005, weight_decay=0.3, adam_lr=0.001, schedule=schedule,
                               ns_dtype=jnp.float32)
    fresh, _ = run(_step_fn(fresh_tx, 1.0), fresh_tx)
    for n in ("layers.0.attn.wq.weight", "embed.weight"):
        np.testing.assert_allclose(np.asarray(swept[n]), np.asarray(fresh[n]), rtol=1e-6, atol=1e-7)
        assert not np.allclose(np.asarray(swept[n]), np.asarray(base[n]))
