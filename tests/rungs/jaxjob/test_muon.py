"""JAX Muon against the PyTorch ones: Newton-Schulz bit for bit in bf16 (also under jit), and 10
optimizer steps on matrices and expert stacks within 1e-5 of rungs.muon.Muon and torch.optim.Muon."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from rungs.jaxjob.muon import (MuonConfigError, muon, narrow_products_native, newton_schulz, scale_by_muon,
                               update_scale)
from rungs.muon import Muon
from rungs.muon import adjust_lr as torch_adjust_lr
from rungs.muon import newton_schulz as torch_newton_schulz

torch.set_num_threads(1)

# Leaves sharing an (out, in) up to a transpose go through one batched Newton-Schulz: "wide", "tall",
# "wide_again" and "wide_stack" (and "stack" with "tall_stack") exercise the grouping, the transposes
# and the split back, each leaf with its own update scale.
SHAPES = {"wide": (16, 32), "tall": (32, 16), "square": (24, 24), "stack": (4, 8, 24), "tall_stack": (3, 24, 8),
          "wide_again": (16, 32), "wide_stack": (2, 16, 32)}


def _run_both(shapes, torch_opt_factory, jax_tx, steps=10, seed=0):
    rng = np.random.default_rng(seed)
    init = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    tparams = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in init.items()}
    topt = torch_opt_factory(list(tparams.values()))
    params = {k: jnp.asarray(v) for k, v in init.items()}
    state = jax_tx.init(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = jax_tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(steps):
        grads = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        for k, p in tparams.items():
            p.grad = torch.from_numpy(grads[k].copy())
        topt.step()
        params, state = step(params, state, {k: jnp.asarray(v) for k, v in grads.items()})
    return {k: p.detach().numpy() for k, p in tparams.items()}, {k: np.asarray(v) for k, v in params.items()}


BF16_ULP_AT_ONE = 2.0 ** -7  # bf16 spacing in [1, 2); Newton-Schulz outputs stay below 1.5


@pytest.mark.parametrize("native", [True, False], ids=["native", "emulated"])
@pytest.mark.parametrize(("shape", "preset"), [(s, "simple") for s in SHAPES.values()]
                         + [((96, 96), "quintic"), ((8, 96, 48), "polar_express")])
def test_newton_schulz_bf16_matches_torch_to_bf16_rounding_eager_and_jitted(shape, preset, native):
    """bf16 results are not bit for bit: the two matmul libraries sum in different orders, and a
    one-ulp flip carries through the iterations. Every element stays within one bf16 ulp at 1.
    Under jit XLA may skip a float32 -> bf16 -> float32 rounding (excess precision); the explicit
    reduce_precision keeps each rounding torch does, so jit is held to the same bound. Both paths
    on every host: bf16 operands (torch's native path) and float32 operands holding bf16 values
    (its CPU emulation), each against torch's own same path."""
    G = np.random.default_rng(1).standard_normal(shape).astype(np.float32) * 3.0
    want = torch_newton_schulz(torch.from_numpy(G), coefficients=preset, emulate=not native).float().numpy()
    eager = newton_schulz(jnp.asarray(G), coefficients=preset, native=native)
    jitted = jax.jit(lambda g: newton_schulz(g, coefficients=preset, native=native))(jnp.asarray(G))
    assert eager.dtype == jitted.dtype == jnp.bfloat16
    for got in (eager, jitted):
        diff = np.abs(np.asarray(got.astype(jnp.float32)) - want)
        assert diff.max() <= BF16_ULP_AT_ONE
        assert diff.mean() < 1e-3


def test_newton_schulz_default_path_is_the_hosts_and_the_paths_agree():
    """The default takes bf16 operands where they multiply natively (a GPU, a CPU with bf16 units;
    the probe rungs.muon uses) and is then that path exactly; the two paths differ only in the
    order of float32 sums, so within one bf16 ulp."""
    G = jnp.asarray(np.random.default_rng(3).standard_normal((5, 48, 96)).astype(np.float32))
    auto = jax.jit(lambda g: newton_schulz(g))(G)
    native = jax.jit(lambda g: newton_schulz(g, native=True))(G)
    emulated = jax.jit(lambda g: newton_schulz(g, native=False))(G)
    same = native if narrow_products_native() else emulated
    assert np.array_equal(np.asarray(auto.astype(jnp.float32)), np.asarray(same.astype(jnp.float32)))
    diff = np.abs(np.asarray(native.astype(jnp.float32)) - np.asarray(emulated.astype(jnp.float32)))
    assert diff.max() <= BF16_ULP_AT_ONE
    if jax.default_backend() == "cpu":
        from rungs.cpu_bf16 import cpu_has_bf16_units

        assert narrow_products_native() == cpu_has_bf16_units()


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_newton_schulz_fp32_and_tiny_inputs_match_torch(shape):
    G = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    for scale in (1.0, 1e-30):  # the power-of-two prescale keeps a tiny update's direction
        want = torch_newton_schulz(torch.from_numpy(G * scale), dtype=torch.float32).numpy()
        got = np.asarray(jax.jit(lambda g: newton_schulz(g, dtype=jnp.float32))(jnp.asarray(G * scale)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("nesterov", "adjust_lr"), [(True, "match_rms_adamw"), (False, "original")])
def test_ten_steps_on_matrices_and_expert_stacks_match_rungs_muon_fp32(nesterov, adjust_lr):
    kw = dict(momentum=0.9, nesterov=nesterov, adjust_lr=adjust_lr)
    want, got = _run_both(SHAPES, lambda ps: Muon(ps, lr=0.02, weight_decay=0.1, ns_dtype=torch.float32, **kw),
                          muon(0.02, 0.1, ns_dtype=jnp.float32, **kw))
    for k in SHAPES:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)


def _assert_within_bf16_flips(got, want, shapes):
    """bf16 Newton-Schulz flips an occasional ulp (see above): each flip moves a weight by about
    lr * scale * 2^-8 (< 1e-4 here); the mean difference shows the trajectories are the same."""
    for k in shapes:
        diff = np.abs(got[k] - want[k])
        assert diff.max() < 5e-4, k
        assert diff.mean() < 1e-5, k


def test_ten_steps_match_rungs_muon_in_its_default_bf16():
    want, got = _run_both(SHAPES, lambda ps: Muon(ps, lr=0.02, weight_decay=0.1), muon(0.02, 0.1))
    _assert_within_bf16_flips(got, want, SHAPES)


@pytest.mark.parametrize("adjust_lr", ["match_rms_adamw", "original"])
def test_ten_steps_on_matrices_match_torch_optim_muon(adjust_lr):
    """torch.optim.Muon: 2-D only, Newton-Schulz in bf16 (its only dtype)."""
    shapes = {k: s for k, s in SHAPES.items() if len(s) == 2}
    want, got = _run_both(shapes, lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.1, momentum=0.95,
                                                              adjust_lr_fn=adjust_lr),
                          muon(0.02, 0.1, momentum=0.95, adjust_lr=adjust_lr))
    _assert_within_bf16_flips(got, want, shapes)


def test_decay_mask_and_traced_learning_rate():
    """Masked-out leaves are not decayed; a learning rate passed as a traced array is the same as a float."""
    shapes = {"decayed": (8, 16), "kept": (8, 16)}
    rng = np.random.default_rng(3)
    params = {k: jnp.asarray(rng.standard_normal(s).astype(np.float32)) for k, s in shapes.items()}
    grads = {k: jnp.zeros(s) for k, s in shapes.items()}
    tx = muon(0.1, 0.5, weight_decay_mask={"decayed": True, "kept": False})
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["decayed"]), -0.05 * np.asarray(params["decayed"]), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(updates["kept"]), 0.0)

    def apply(lr, params, grads):
        t = muon(lr, 0.5)
        return t.update(grads, t.init(params), params)[0]

    grads = {k: jnp.asarray(rng.standard_normal(s).astype(np.float32)) for k, s in shapes.items()}
    traced = jax.jit(apply)(jnp.float32(0.1), params, grads)
    plain = apply(0.1, params, grads)
    for k in shapes:
        np.testing.assert_allclose(np.asarray(traced[k]), np.asarray(plain[k]), rtol=1e-6, atol=1e-7)


def test_update_scale_is_rungs_muon_formula_and_errors_are_typed():
    for shape in [(8, 24), (24, 8), (3, 96, 48)]:
        for mode in ("match_rms_adamw", "original"):
            assert update_scale(shape, mode) == torch_adjust_lr(1.0, shape, mode)
    with pytest.raises(MuonConfigError, match="2-D"):
        scale_by_muon().init({"norm": jnp.ones(4)})
    with pytest.raises(MuonConfigError, match="preset"):
        scale_by_muon(ns_coefficients="cubic")
    with pytest.raises(MuonConfigError, match="adjust_lr"):
        scale_by_muon(adjust_lr="spectral")
    with pytest.raises(MuonConfigError, match="momentum"):
        scale_by_muon(momentum=1.0)


def test_stacks_over_one_chunk_are_orthogonalised_a_chunk_at_a_time_with_the_same_result(monkeypatch):
    import rungs.jaxjob.muon as jmuon

    rng = np.random.default_rng(3)
    grads = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in SHAPES.items()}
    tx = scale_by_muon(ns_dtype=jnp.float32)

    def updates():
        return jax.jit(lambda g: tx.update(g, tx.init(g))[0])(grads)
    whole = updates()
    loops = jax.jit(lambda g: tx.update(g, tx.init(g))[0]).lower(grads).as_text().count("stablehlo.while")
    # 3 matrices of 24 x 8 (or 8 x 24) per chunk: "stack" (4) and "tall_stack" (3) take 2 and 1
    # steps of lax.map (the first padded), the 16 x 32 group (1 + 1 + 2) 2 steps of 2
    monkeypatch.setattr(jmuon, "NS_CHUNK_BYTES", 3 * 4 * 24 * 8)
    hlo = jax.jit(lambda g: tx.update(g, tx.init(g))[0]).lower(grads).as_text()
    assert hlo.count("stablehlo.while") > loops        # the chunks' loops around the Newton-Schulz ones
    for name, got in updates().items():
        np.testing.assert_allclose(np.asarray(got), np.asarray(whole[name]), rtol=1e-6, atol=1e-6, err_msg=name)
