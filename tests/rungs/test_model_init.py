"""`Transformer.init_weights`, the model's one initialisation (#21): bit-identical to the procedure it
replaced (every module initialising itself in its constructor, then a pass overwriting all of it),
for every seed and shape, including tensors below normal_'s 16-element block, tied embeddings,
no shared expert and no latent projection. The reference below is that procedure, rebuilt from the
model's own blocks constructed on the CPU (not on the meta device, which draws nothing)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from ladder.plan.resolve import resolve_train_config
from rungs.config import parse_config
from rungs.architecture import init_std, parameter_shapes
from rungs.model import Block, ModelConfig, RMSNorm, Transformer

SMALL = ModelConfig(n_layers=2, d_model=16, n_heads=2, head_dim=8, n_kv_heads_global=1, n_kv_heads_local=2,
                    global_every=2, window_tokens=4, seq_len=8, n_experts=4, top_k=2, n_shared_experts=1,
                    latent_dim=8, expert_hidden=12, shared_hidden=12, vocab_size=48)
# router (2 x 4) and several other tensors are under 16 elements; tied head; no shared expert; no latent projection
TINY = ModelConfig(n_layers=3, d_model=4, n_heads=2, head_dim=2, n_kv_heads_global=1, n_kv_heads_local=2,
                   global_every=3, window_tokens=2, seq_len=4, n_experts=2, top_k=1, n_shared_experts=0,
                   latent_dim=4, expert_hidden=3, shared_hidden=3, vocab_size=5, tied_embeddings=True)


def _golden() -> ModelConfig:
    return parse_config(resolve_train_config("cpu-demo", 3, {"seq_len": 64, "tracking_uri": None})).architecture()


def construct_then_overwrite(cfg: ModelConfig, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The pre-#21 initialisation: modules built on the CPU in the model's order (each drawing its own
    init), then N(0, init_std) over every parameter in order, output projections / sqrt(2 n_layers)."""
    torch.manual_seed(seed)
    m = nn.Module()
    m.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
    m.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
    m.final_norm = RMSNorm(cfg.d_model)
    if not cfg.tied_embeddings:
        m.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
    with torch.no_grad():
        for name, p in m.named_parameters():
            std = reference_std(name, cfg)
            if std is None:
                p.fill_(1.0)
            else:
                nn.init.normal_(p, 0.0, std)
    return {n: p.detach() for n, p in m.named_parameters()}, torch.get_rng_state()


def reference_std(name: str, cfg: ModelConfig) -> float | None:
    """GPT-2's rule as the pre-#21 pass applied it: norms 1, the projections into the residual stream
    (attention out, shared and routed experts' down, latent up) N(0, init_std / sqrt(2 n_layers))."""
    if name.endswith("norm.weight"):
        return None
    residual = name.endswith(("attn.wo.weight", "w_down.weight", "experts.w_down", "latent_up.weight"))
    return cfg.init_std / (2 * cfg.n_layers) ** 0.5 if residual else cfg.init_std


@pytest.mark.parametrize("cfg", [SMALL, TINY, dataclasses.replace(SMALL, latent_dim=16), _golden()],
                         ids=["small", "tiny", "no-latent", "golden-L3"])
@pytest.mark.parametrize("seed", [0, 3])
def test_init_weights_equals_the_construct_then_overwrite_init(cfg, seed):
    ref, ref_state = construct_then_overwrite(cfg, seed)
    torch.manual_seed(seed)
    model = Transformer(cfg)
    got = dict(model.named_parameters())
    assert got.keys() == ref.keys()
    for name, r in ref.items():
        assert torch.equal(got[name].detach(), r), name
    assert torch.equal(torch.get_rng_state(), ref_state), "the generator ends elsewhere: later draws would differ"



@pytest.mark.parametrize("cfg", [SMALL, TINY, dataclasses.replace(SMALL, init_std=0.05), _golden()],
                         ids=["small", "tiny", "std-0.05", "golden-L3"])
def test_one_init_rule_serves_the_torch_model_the_jax_params_and_the_gpu_benchmark(cfg):
    """`rungs.architecture.init_std` is the rule every initialiser draws by (it was written three times)."""
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
    model = Transformer(SMALL)
    model.layers[1].register_buffer("table", torch.zeros(3))
    with pytest.raises(ValueError, match="no rule for buffer 'layers.1.table'"):
        model.init_weights()
