"""JAX parameters: the state-dict contract with ladder.plan.counting, the torch init rules, conversion."""

from __future__ import annotations

from dataclasses import asdict, replace

import jax
import numpy as np
import pytest
import torch

from rungs.architecture import parameter_shapes
from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.jaxjob import params as P
from rungs.model import ModelConfig, Transformer

torch.set_num_threads(1)


def config(L: int, **extra) -> ModelConfig:
    return ModelConfig(**asdict(plan_rung(load_recipe("cpu-demo"), L).arch), **extra)


CONFIGS = {"cpu-demo-L2": config(2), "cpu-demo-L4": config(4),
           "tied-no-latent-no-shared": replace(config(2), tied_embeddings=True, latent_dim=32, n_shared_experts=0)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_names_and_shapes_equal_the_counting_contract_and_the_torch_model(name):
    cfg = CONFIGS[name]
    params = P.init_params(cfg, jax.random.key(0))
    got = {n: tuple(a.shape) for n, a in params.items()}
    assert got == parameter_shapes(P.architecture(cfg))
    assert got == {n: tuple(p.shape) for n, p in Transformer(cfg).named_parameters()}
    assert set(P.init_buffers(cfg)) == {f"layers.{i}.moe.router.expert_bias" for i in range(cfg.n_layers)}


def test_init_statistics_follow_the_torch_rules_tensor_by_tensor():
    cfg = config(4)
    params = P.init_params(cfg, jax.random.key(0))
    torch.manual_seed(0)
    ref = dict(Transformer(cfg).named_parameters())
    out_std = 0.02 / (2 * cfg.n_layers) ** 0.5
    n_out = 0
    for name, a in params.items():
        a, t = np.asarray(a, np.float64), ref[name].detach().double().numpy()
        if name.endswith("norm.weight"):
            assert (a == 1).all() and (t == 1).all(), name
            continue
        want = P.init_std(name, cfg)
        n_out += want == out_std
        n = a.size
        # Sample mean and std of n normal draws: standard errors std/sqrt(n) and std/sqrt(2n).
        for sample in (a, t):
            assert abs(sample.mean()) < 6 * want / n ** 0.5, name
            assert abs(sample.std() - want) < 6 * want / (2 * n) ** 0.5, name
    # Per layer: attn.wo, shared w_down, expert w_down stack, latent_up carry the residual scaling.
    assert n_out == 4 * cfg.n_layers


def test_init_is_seeded_and_tensors_draw_independently():
    cfg = config(2)
    a, b = P.init_params(cfg, jax.random.key(3)), P.init_params(cfg, jax.random.key(3))
    c = P.init_params(cfg, jax.random.key(4))
    assert all((np.asarray(a[n]) == np.asarray(b[n])).all() for n in a)
    w = "layers.0.moe.experts.w_gate"
    assert not np.allclose(a[w], c[w])
    assert not np.allclose(np.asarray(a["layers.0.attn.wk.weight"]).ravel()[:64],
                           np.asarray(a["layers.0.attn.wv.weight"]).ravel()[:64])


def test_torch_state_dict_round_trips_exactly():
    cfg = config(2, expert_bias=True)
    torch.manual_seed(0)
    model = Transformer(cfg)
    model.layers[1].moe.router.expert_bias.fill_(0.25)
    params, buffers = P.from_torch_state_dict(model.state_dict(), cfg)
    assert float(buffers["layers.1.moe.router.expert_bias"][0]) == 0.25
    back = P.to_torch_state_dict(params, buffers)
    fresh = Transformer(cfg)
    fresh.load_state_dict(back, strict=True)
    for name, t in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], t), name


def test_a_state_dict_of_another_config_is_refused():
    torch.manual_seed(0)
    state = Transformer(config(2)).state_dict()
    with pytest.raises(ValueError, match="missing"):
        P.from_torch_state_dict(state, config(3))
    state["layers.0.attn.wq.weight"] = state["layers.0.attn.wq.weight"][:, :8]
    with pytest.raises(ValueError, match="layers.0.attn.wq.weight"):
        P.from_torch_state_dict(state, config(2))
