"""Optimizer roles by name, the combined Muon+AdamW object, LR schedules and grad clipping."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from rungs.muon import Muon
from rungs.optim import MuonAdamW, OptimConfigError, build_optimizer, clip_grad_norm_, lr_at, param_role

torch.set_num_threads(1)

EXPECTED_ROLES = {
    "embed.weight": "embedding", "lm_head.weight": "lm_head", "final_norm.weight": "norm",
    "layers.0.attn_norm.weight": "norm", "layers.0.moe_norm.weight": "norm",
    "layers.0.attn.wq.weight": "matrix", "layers.0.attn.wk.weight": "matrix",
    "layers.0.attn.wv.weight": "matrix", "layers.0.attn.wo.weight": "matrix",
    "layers.0.moe.router.weight": "router",
    "layers.0.moe.experts.w_gate": "expert_stack", "layers.0.moe.experts.w_up": "expert_stack",
    "layers.0.moe.experts.w_down": "expert_stack",
    "layers.0.moe.shared.w_gate.weight": "matrix", "layers.0.moe.shared.w_up.weight": "matrix",
    "layers.0.moe.shared.w_down.weight": "matrix",
    "layers.0.moe.latent_down.weight": "matrix", "layers.0.moe.latent_up.weight": "matrix",
}


def tiny_model():
    from rungs.model import ModelConfig, Transformer

    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=2,
                      global_every=2, window_tokens=8, seq_len=16, n_experts=4, top_k=2, n_shared_experts=1,
                      latent_dim=16, expert_hidden=16, shared_hidden=32, vocab_size=64)
    return Transformer(cfg)


def test_every_parameter_of_the_rung_model_gets_the_contract_role():
    model = tiny_model()
    roles = {n: param_role(n, p) for n, p in model.named_parameters()}
    for name, role in roles.items():
        bare = name.replace("layers.1.", "layers.0.")
        assert EXPECTED_ROLES[bare] == role, name
    assert set(roles.values()) == {"embedding", "lm_head", "norm", "matrix", "router", "expert_stack"}


def test_role_is_by_name_not_shape():
    square = torch.zeros(64, 64)
    assert param_role("lm_head.weight", square) == "lm_head"       # 2-D, still AdamW
    assert param_role("layers.3.attn.wq.weight", square) == "matrix"
    assert param_role("_orig_mod.module.layers.3.moe.router.weight", torch.zeros(4, 64)) == "router"
    assert param_role("layers.0.attn.wq.bias", torch.zeros(64)) == "bias"
    with pytest.raises(OptimConfigError, match="no optimizer role"):
        param_role("layers.0.mystery.weight", square)
    with pytest.raises(OptimConfigError, match="expected 3-D"):
        param_role("layers.0.moe.experts.w_up", square)


def test_build_optimizer_groups_decay_and_lr_keys():
    model = tiny_model()
    opt = build_optimizer(model, lr=3e-3, weight_decay=0.1, adam_lr=1e-3)
    assert isinstance(opt.muon, Muon) and isinstance(opt.adamw, torch.optim.AdamW)
    assert opt.convention == "0.2*sqrt(max(fan_out,fan_in))"
    groups = {g["role"]: g for g in opt.param_groups}
    assert set(groups) == {"matrix", "expert_stack", "embedding", "lm_head", "norm", "router"}
    assert all(any(p is q for q in opt.muon.param_groups[0]["params"] + opt.muon.param_groups[1]["params"])
               for n, p in model.named_parameters() if "attn.w" in n or "experts" in n)
    assert groups["lm_head"]["params"][0] is model.lm_head.weight
    assert groups["matrix"]["weight_decay"] == groups["expert_stack"]["weight_decay"] == 0.1
    assert groups["lm_head"]["weight_decay"] == 0.0                    # the logit scale is not decayed
    assert groups["embedding"]["weight_decay"] == groups["norm"]["weight_decay"] == groups["router"]["weight_decay"] == 0
    assert groups["matrix"]["initial_lr"] == 3e-3 and groups["embedding"]["initial_lr"] == 1e-3
    n_params = sum(len(g["params"]) for g in opt.param_groups)
    assert n_params == len(list(model.parameters()))
    opt.set_lr_multiplier(0.5)
    assert groups["matrix"]["lr"] == pytest.approx(1.5e-3) and groups["norm"]["lr"] == pytest.approx(5e-4)


def test_step_updates_every_parameter_and_state_dict_resumes_exactly():
    torch.manual_seed(0)
    model = tiny_model()
    twin = tiny_model()
    twin.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 64, (2, 16))

    def train_step(m, opt):
        logits, _ = m(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    opt = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(model, opt)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == set(before)
    # resume: a fresh optimizer loaded from the state dict continues exactly like the original
    twin_opt = build_optimizer(twin, lr=1e-2, weight_decay=0.1)
    train_step(twin, twin_opt)
    buffer = io.BytesIO()                       # through bytes, as a checkpoint does (state_dict holds references)
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    twin_opt.load_state_dict(torch.load(buffer))
    train_step(model, opt)
    train_step(twin, twin_opt)
    for (n, a), (_, b) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(OptimConfigError, match="update scale"):
        build_optimizer(twin, lr=1e-2, weight_decay=0.1, adjust_lr="original").load_state_dict(opt.state_dict())


def test_lr_schedules():
    kw = {"total_steps": 100, "warmup_steps": 10}
    assert lr_at(0, **kw) == pytest.approx(0.1) and lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(55, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(100, **kw) == pytest.approx(0.1) and lr_at(500, **kw) == pytest.approx(0.1)
    wsd = {"schedule": "wsd", "decay_fraction": 0.2, **kw}
    assert lr_at(79, **wsd) == 1.0 and lr_at(80, **wsd) == 1.0
    assert lr_at(90, **wsd) == pytest.approx(1 - 0.9 * 0.5) and lr_at(100, **wsd) == pytest.approx(0.1)
    values = [lr_at(s, **wsd) for s in range(101)]
    assert all(0 <= v <= 1 for v in values) and all(a >= b for a, b in zip(values[10:], values[11:]))
    with pytest.raises(OptimConfigError):
        lr_at(0, total_steps=10, warmup_steps=20)
    with pytest.raises(OptimConfigError):
        lr_at(0, schedule="linear", **kw)


def test_clip_grad_norm_is_global_and_returns_the_unclipped_norm():
    a = nn.Parameter(torch.zeros(3))
    b = nn.Parameter(torch.zeros(4))
    a.grad = torch.tensor([3.0, 0, 0])
    b.grad = torch.tensor([0.0, 4, 0, 0])
    assert clip_grad_norm_([a, b], max_norm=1.0) == pytest.approx(5.0)
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0, 0]), atol=1e-6, rtol=0)
    torch.testing.assert_close(b.grad, torch.tensor([0.0, 0.8, 0, 0]), atol=1e-6, rtol=0)
    assert clip_grad_norm_([a, b], max_norm=float("inf")) == pytest.approx(1.0, abs=1e-5)


def test_optimizer_without_matrices_still_works():
    model = nn.Module()
    model.final_norm = nn.Module()
    model.final_norm.weight = nn.Parameter(torch.ones(4))
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1)
    assert isinstance(opt, MuonAdamW) and opt.muon is None and len(opt.param_groups) == 1


def test_no_decay_roles_can_be_changed_moonlight_style():
    model = tiny_model()
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, no_decay_roles=("embedding", "bias"))
    groups = {g["role"]: g for g in opt.param_groups}
    assert groups["norm"]["weight_decay"] == groups["router"]["weight_decay"] == 0.1
    assert groups["embedding"]["weight_decay"] == 0.0
    with pytest.raises(OptimConfigError, match="unknown roles"):
        build_optimizer(model, lr=1e-3, weight_decay=0.1, no_decay_roles=("norms",))


def test_adamw_runs_its_multi_tensor_kernels_off_cuda():
    """fused=True needs every parameter on CUDA; elsewhere the foreach path, which gives the values
    of torch's per-tensor loop bit for bit (checked here over three steps)."""
    from rungs.optim import adamw_implementation

    model = tiny_model()
    opt = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    assert opt.adamw.defaults["foreach"] is True and not opt.adamw.defaults["fused"]
    assert adamw_implementation([torch.zeros(2)]) == {"foreach": True}
    params = [p for g in opt.adamw.param_groups for p in g["params"]]
    loop = torch.optim.AdamW([{**{k: v for k, v in g.items() if k not in ("params", "foreach", "fused")},
                               "params": [torch.nn.Parameter(p.detach().clone()) for p in g["params"]]}
                              for g in opt.adamw.param_groups], foreach=False)
    twins = [p for g in loop.param_groups for p in g["params"]]
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, q in zip(params, twins):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.adamw.step()
        loop.step()
    assert loop.param_groups[0]["foreach"] is False
    assert all(torch.equal(p.detach(), q.detach()) for p, q in zip(params, twins))
