"""`Transformer.init_weights`, the model's one initialisation, applied once: bit-identical to the plain
procedure its docstring states (every parameter in state-dict order gets `normal_(0, std)` of the
policy, nothing drawn before or between), for every seed and shape, including tensors below normal_'s
16-element block, tied embeddings, no shared expert and no latent projection; and the policy's stds
against GPT-2's rule written out here."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from ladder.plan.resolve import resolve_train_config
from rungs.config import parse_config
from rungs.architecture import init_std, parameter_shapes
from rungs.model import ModelConfig, Transformer

SMALL = ModelConfig(n_layers=2, d_model=16, n_heads=2, head_dim=8, n_kv_heads_global=1, n_kv_heads_local=2,
                    global_every=2, window_tokens=4, seq_len=8, n_experts=4, top_k=2, n_shared_experts=1,
                    latent_dim=8, expert_hidden=12, shared_hidden=12, vocab_size=48)
# router (2 x 4) and several other tensors are under 16 elements; tied head; no shared expert; no latent projection
TINY = ModelConfig(n_layers=3, d_model=4, n_heads=2, head_dim=2, n_kv_heads_global=1, n_kv_heads_local=2,
                   global_every=3, window_tokens=2, seq_len=4, n_experts=2, top_k=1, n_shared_experts=0,
                   latent_dim=4, expert_hidden=3, shared_hidden=3, vocab_size=5, tied_embeddings=True)


def _golden() -> ModelConfig:
    return parse_config(resolve_train_config("cpu-demo", 3, {"seq_len": 64, "tracking_uri": None})).architecture()


def drawn_whole(cfg: ModelConfig, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The policy drawn the plain way: whole tensors, one `normal_` each, in state-dict order, from a
    freshly seeded global generator; norms 1. Shapes from the counting contract (`parameter_shapes`)."""
    shapes = parameter_shapes(cfg)
    with torch.device("meta"):
        names = [n for n, _ in Transformer(cfg).named_parameters()]  # the order only: meta draws nothing
    assert set(names) == set(shapes)
    torch.manual_seed(seed)
    out = {}
    for name in names:
        shape = shapes[name]
        std = reference_std(name, cfg)
        out[name] = torch.ones(shape) if std is None else torch.empty(shape).normal_(0.0, std)
    return out, torch.get_rng_state()


def reference_std(name: str, cfg: ModelConfig) -> float | None:
    """GPT-2's rule: norms 1, the projections into the residual stream (attention out, shared and
    routed experts' down, latent up) N(0, init_std / sqrt(2 n_layers)), every other matrix N(0, init_std)."""
    if name.endswith("norm.weight"):
        return None
    residual = name.endswith(("attn.wo.weight", "w_down.weight", "experts.w_down", "latent_up.weight"))
    return cfg.init_std / (2 * cfg.n_layers) ** 0.5 if residual else cfg.init_std


@pytest.mark.parametrize("cfg", [SMALL, TINY, dataclasses.replace(SMALL, latent_dim=16), _golden()],
                         ids=["small", "tiny", "no-latent", "golden-L3"])
@pytest.mark.parametrize("seed", [0, 3])
def test_init_weights_draws_each_parameter_once_in_order_and_nothing_else(cfg, seed):
    ref, ref_state = drawn_whole(cfg, seed)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    got = dict(model.named_parameters())
    assert list(got) == list(ref)
    for name, r in ref.items():
        assert torch.equal(got[name].detach(), r), name
    assert torch.equal(torch.get_rng_state(), ref_state), "the generator ends elsewhere: later draws would differ"


def test_the_modules_standalone_inits_never_run_inside_the_model(monkeypatch):
    """The router's, the expert stacks' and the embedding's own inits (for modules used alone) are not
    the model's: building the model never calls them (nn.Linear's runs on the meta device, drawing
    nothing), and a module built alone still draws its own."""
    from rungs.moe import RoutedExperts
    from rungs.router import Router

    calls = []
    for cls in (Router, RoutedExperts, nn.Linear, nn.Embedding):  # every module with an init of its own
        original = cls.reset_parameters
        monkeypatch.setattr(cls, "reset_parameters", lambda self, _f=original: (
            calls.append((type(self).__name__, next(self.parameters()).device.type)), _f(self)))
    model = Transformer(SMALL)
    assert set(calls) == {("Linear", "meta")}, calls
    assert len(calls) == sum(isinstance(m, nn.Linear) for m in model.modules())
    calls.clear()
    Router(8, 4, 2), RoutedExperts(4, 8, 12), nn.Embedding(5, 4)
    assert calls == [("Router", "cpu"), ("RoutedExperts", "cpu"), ("Embedding", "cpu")]


@pytest.mark.parametrize("cfg", [SMALL, TINY, dataclasses.replace(SMALL, init_std=0.05), _golden()],
                         ids=["small", "tiny", "std-0.05", "golden-L3"])
def test_one_init_rule_serves_the_torch_model_the_jax_params_and_the_gpu_benchmark(cfg):
    """`rungs.architecture.init_std` is the rule every initialiser draws by."""
    from benchmarks.gpu_rung import init_on_device

    names = list(parameter_shapes(cfg))
    assert [init_std(n, cfg) for n in names] == [reference_std(n, cfg) for n in names]
    assert sum(init_std(n, cfg) == cfg.init_std / (2 * cfg.n_layers) ** 0.5 for n in names) == sum(
        n.endswith(("attn.wo.weight", "shared.w_down.weight", "experts.w_down", "latent_up.weight")) for n in names)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device="cpu")
    init_on_device(model)
    for name, p in model.named_parameters():
        std = init_std(name, cfg)
        if std is None:
            assert bool((p == 1).all()), name
        elif p.numel() >= 512:  # the sample std of n normal draws has standard error std / sqrt(2n)
            assert abs(float(p.detach().std()) - std) < 6 * std / (2 * p.numel()) ** 0.5, name


def test_a_private_generator_gives_the_same_model_and_leaves_the_global_one_alone():
    torch.manual_seed(4)
    ref = Transformer(SMALL)
    torch.manual_seed(99)
    before = torch.get_rng_state()
    with torch.device("meta"):
        model = Transformer(SMALL)
    assert all(p.is_meta for p in model.parameters()) and torch.equal(torch.get_rng_state(), before)
    model.to_empty(device="cpu")
    model.init_weights(torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), before)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.detach(), r.detach()), name
    for (name, b), r in zip(model.named_buffers(), ref.buffers()):
        assert torch.equal(b, r), name


def test_parameters_and_buffers_without_a_rule_are_refused():
    model = Transformer(SMALL)
    model.layers[0].attn.register_parameter("scale", nn.Parameter(torch.ones(16)))
    with pytest.raises(ValueError, match="no rule for parameter 'layers.0.attn.scale'"):
        model.init_weights()
    with pytest.raises(ValueError, match="no rule for parameter 'layers.0.moe.router.temperature'"):
        init_std("layers.0.moe.router.temperature", SMALL)  # the JAX parameters draw by the same rule
    model = Transformer(SMALL)
    model.layers[1].register_buffer("table", torch.zeros(3))
    with pytest.raises(ValueError, match="no rule for buffer 'layers.1.table'"):
        model.init_weights()
