"""The two engines' initial weights, each drawn from its own seeds as its job draws them, against the
policy the model states (`rungs.architecture.init_std`: N(0, 0.02), the projections into the residual
stream / sqrt(2·n_layers), norms 1) and against each other, tensor by tensor, at cpu-demo L3.

The torch job draws `Transformer(cfg)` after `torch.manual_seed(seed)` (a Box-Muller stream of
mt19937), the JAX job `init_params(cfg, PRNGKey(seed))` (threefry, inverse-erf normals): different
generators, one distribution. Per tensor, pooled over SEEDS: mean and standard deviation within
5 standard errors of the stated ones, and a Kolmogorov-Smirnov test against N(0, std) and between the
engines (shape and tails, not only moments); per engine, the fraction beyond 3 and 4 std, and
lag correlations of the stream (of values and of squares: Box-Muller pairs share a radius) within
5 standard errors of zero; row means with the variance of independent draws; RoPE tables, norm
weights and router buffers exact. Each check is shown to fail on a tensor that breaks it.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import torch
from scipy import stats

from ladder.plan.resolve import resolve_train_config
from rungs.architecture import ModelConfig, init_std
from rungs.config import parse_config
from rungs.jaxjob.model import rope_tables
from rungs.jaxjob.params import init_buffers, init_params
from rungs.model import Transformer
from rungs.router import Router

SEEDS = (0, 1, 2, 3)
Z = 5.0  # standard errors allowed: ~120 tensor checks per engine stay far from a chance failure
P_MIN = 1e-5  # Kolmogorov-Smirnov p-value floor, for the same reason
LAGS = (1, 2, 7, 8, 9, 16)  # 8: torch's Box-Muller pairs element j with j + 8 of each 16-block


def _cfg() -> ModelConfig:
    return parse_config(resolve_train_config("cpu-demo", 3, {"tracking_uri": None})).architecture()


CFG = _cfg()


def torch_draws(seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    torch.manual_seed(seed)  # as `rungs.torch_engine` seeds before it builds the model
    model = Transformer(CFG)
    return ({n: p.detach().double().numpy() for n, p in model.named_parameters()},
            {n: b.double().numpy() for n, b in model.named_buffers()})


def jax_draws(seed: int) -> dict[str, np.ndarray]:
    return {n: np.asarray(a, np.float64) for n, a in init_params(CFG, jax.random.PRNGKey(seed)).items()}


@pytest.fixture(scope="module")
def draws() -> dict[str, list[dict[str, np.ndarray]]]:
    return {"torch": [torch_draws(s)[0] for s in SEEDS], "jax": [jax_draws(s) for s in SEEDS]}


def tensor_failures(name: str, x: np.ndarray, std: float) -> list[str]:
    """What departs from N(0, std) i.i.d. in one tensor's draws (x: the values of one or more draws)."""
    x = np.asarray(x, np.float64).ravel()
    n, out = x.size, []
    if abs(x.mean()) > Z * std / math.sqrt(n):
        out.append(f"{name}: mean {x.mean():.3g}, stated 0 (se {std / math.sqrt(n):.2g})")
    se_std = std / math.sqrt(2 * n)
    if abs(x.std() - std) > Z * se_std:
        out.append(f"{name}: std {x.std():.4g}, stated {std:.4g} (se {se_std:.2g})")
    p = stats.kstest(x, stats.norm(0.0, std).cdf).pvalue
    if p < P_MIN:
        out.append(f"{name}: not N(0, {std:.3g}) by Kolmogorov-Smirnov, p = {p:.2g}")
    return out


def stream_failures(engine: str, z: np.ndarray) -> list[str]:
    """Tails and dependence of a standardised stream z (every tensor of one draw, concatenated)."""
    n, out = z.size, []
    for k in (3.0, 4.0):
        expected = 2 * stats.norm.sf(k)
        got = float((np.abs(z) > k).mean())
        if abs(got - expected) > Z * math.sqrt(expected * (1 - expected) / n):
            out.append(f"{engine}: {got:.3g} of the draws beyond {k:g} std, a normal has {expected:.3g}")
    sq = z * z
    for lag in LAGS:
        for what, v in (("values", z), ("squares", sq)):
            r = float(np.corrcoef(v[:-lag], v[lag:])[0, 1])
            if abs(r) > Z / math.sqrt(n - lag):
                out.append(f"{engine}: lag-{lag} correlation of {what} {r:.3g} (se {1 / math.sqrt(n - lag):.2g})")
    return out


def row_mean_failures(name: str, x: np.ndarray, std: float) -> list[str]:
    """Rows of a (rows, cols) matrix: the variance of their means is std²/cols for independent draws."""
    x = x.reshape(-1, x.shape[-1])
    rows, cols = x.shape
    ratio = float(x.mean(axis=1).var() * cols / std**2)
    if abs(ratio - 1) > Z * math.sqrt(2 / rows):
        out = f"{name}: variance of row means {ratio:.3g}x that of independent draws (se {math.sqrt(2 / rows):.2g})"
        return [out]
    return []


def _standardised(draw: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([(a / init_std(n, CFG)).ravel() for n, a in draw.items() if init_std(n, CFG)])


@pytest.mark.parametrize("engine", ["torch", "jax"])
def test_every_tensor_is_the_stated_normal_in_moments_shape_and_tails(draws, engine):
    failures = []
    for name in draws[engine][0]:
        std = init_std(name, CFG)
        pooled = np.stack([d[name] for d in draws[engine]])
        if std is None:
            assert (pooled == 1).all(), name
            continue
        failures += tensor_failures(name, pooled, std)
        if pooled.ndim >= 3:  # matrices and expert stacks: (seeds, [experts,] rows, cols)
            failures += row_mean_failures(name, pooled, std)
    for d in draws[engine]:
        failures += stream_failures(engine, _standardised(d))
    assert not failures, "\n".join(failures)


def test_the_engines_draw_one_distribution_tensor_by_tensor(draws):
    assert draws["torch"][0].keys() == draws["jax"][0].keys()
    low = {}
    for name in draws["torch"][0]:
        if init_std(name, CFG) is None:
            continue
        t, j = (np.concatenate([d[name].ravel() for d in draws[e]]) for e in ("torch", "jax"))
        assert t.shape == j.shape, name
        p = stats.ks_2samp(t, j).pvalue
        if p < P_MIN:
            low[name] = p
    assert not low, low
    # and the router and expert stacks, the tensors whose own inits the model replaces, at the policy's std
    for name in ("layers.0.moe.router.weight", "layers.2.moe.experts.w_gate", "layers.2.moe.experts.w_down"):
        for engine in ("torch", "jax"):
            got = float(np.std([d[name] for d in draws[engine]]))
            assert abs(got / init_std(name, CFG) - 1) < 0.05, (engine, name, got)


def test_rope_tables_norms_and_router_buffers_are_the_same_in_both_engines():
    _, buffers = torch_draws(0)
    inv_freq = 1.0 / CFG.rope_theta ** (np.arange(0, CFG.head_dim, 2) / CFG.head_dim)
    angles = np.outer(np.arange(CFG.seq_len), inv_freq)  # float64 reference
    cos, sin = rope_tables(CFG.seq_len, CFG.head_dim, CFG.rope_theta)
    for got in (buffers["rope_cos"], np.asarray(cos, np.float64)):
        np.testing.assert_allclose(got, np.cos(angles), atol=1e-7, rtol=0)
    for got in (buffers["rope_sin"], np.asarray(sin, np.float64)):
        np.testing.assert_allclose(got, np.sin(angles), atol=1e-7, rtol=0)
    jax_buffers = init_buffers(CFG)
    for i in range(CFG.n_layers):
        name = f"layers.{i}.moe.router.expert_bias"
        assert (buffers[name] == 0).all() and (np.asarray(jax_buffers[name]) == 0).all()
        assert (buffers[f"layers.{i}.moe.router.pending_counts"] == 0).all()
    assert set(jax_buffers) == {n for n in buffers if n.endswith("expert_bias")}


def test_each_check_fails_on_a_tensor_that_breaks_it():
    std, rng = 0.02, np.random.default_rng(0)
    torch.manual_seed(0)
    # the router's standalone init (N(0, 1/d_model)), were it to survive into the model
    standalone = Router(CFG.d_model, CFG.n_experts, CFG.top_k).weight.detach().double().numpy()
    assert any("std" in f for f in tensor_failures("router", standalone, std))
    # right mean and std, wrong shape: uniform draws (no tails) fail Kolmogorov-Smirnov and the tail count
    uniform = rng.uniform(-1, 1, 200_000) * std * math.sqrt(3)
    assert any("Kolmogorov" in f for f in tensor_failures("uniform", uniform, std))
    assert any("beyond 3 std" in f for f in stream_failures("uniform", uniform / std))
    # Box-Muller gone wrong: element j + 8 of each 16-block repeats element j's radius with a fresh sign
    z = rng.standard_normal((20_000, 16))
    z[:, 8:] = np.abs(z[:, :8]) * rng.choice([-1.0, 1.0], (20_000, 8))
    assert any("lag-8 correlation of squares" in f for f in stream_failures("paired", z.ravel()))
    # rows sharing an offset: matrices whose draws are not independent along a row
    rows = rng.standard_normal((256, 48)) * std * 0.9 + rng.standard_normal((256, 1)) * std * 0.44
    assert row_mean_failures("rows", rows, std)
