"""Router: fp32 top-k, gates, expert bias; load-balancing loss and z-loss against closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from rungs.router import Router, RouterConfigError, RouterOutput, load_balancing_loss, z_loss

torch.set_num_threads(1)


def test_router_gemm_is_bf16_under_autocast_scores_fp32_and_gates_are_normalised_topk():
    torch.manual_seed(0)
    router = Router(16, 8, 2)
    x = torch.randn(32, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = router(x)
    assert out.logits.dtype == out.probs.dtype == out.gate.dtype == torch.float32
    # The GEMM's inputs are rounded to bf16 (and its output, to bf16's 8 bits); everything after is fp32.
    logits64 = x.bfloat16().double() @ router.weight.bfloat16().double().T
    torch.testing.assert_close(out.logits.double(), logits64, rtol=2**-8, atol=1e-6)
    assert not torch.equal(out.logits.double(), x.double() @ router.weight.double().T)
    probs = out.logits.double().softmax(-1)
    torch.testing.assert_close(out.probs.double(), probs, rtol=1e-6, atol=1e-7)
    top = probs.topk(2, -1)
    assert torch.equal(out.expert_idx, top.indices)
    torch.testing.assert_close(out.gate.double(), top.values / top.values.sum(-1, keepdim=True), rtol=1e-5, atol=1e-6)
    assert torch.equal(out.tokens_per_expert, torch.bincount(top.indices.reshape(-1), minlength=8))


def test_router_is_fp32_without_autocast():
    torch.manual_seed(0)
    router = Router(16, 8, 2)
    x = torch.randn(32, 16, dtype=torch.float64)  # cast to the weight's dtype
    out = router(x)
    assert out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits.double(), x.float().double() @ router.weight.double().T, rtol=1e-6, atol=1e-6)


def test_sigmoid_bias_changes_selection_but_not_gate_values():
    torch.manual_seed(0)
    router = Router(16, 4, 1, score="sigmoid", expert_bias=True, normalize_gates=False)
    x = torch.randn(64, 16)
    before = router(x)
    router.expert_bias.copy_(torch.tensor([10.0, 0, 0, 0]))     # force selection of expert 0
    after = router(x)
    assert torch.all(after.expert_idx == 0)
    torch.testing.assert_close(after.gate[:, 0], torch.sigmoid(before.logits[:, 0]))   # unbiased score
    torch.testing.assert_close(after.probs, before.probs)


def test_update_bias_sign_rule_mean_zero_and_accumulated_counts():
    router = Router(4, 4, 1, score="sigmoid", expert_bias=True, bias_update_rate=0.01)
    delta = router.update_bias(torch.tensor([10, 2, 2, 2]))
    # overloaded expert 0 goes down, the others up; then the mean is removed
    raw = 0.01 * torch.tensor([-1.0, 1, 1, 1])
    torch.testing.assert_close(delta, raw - raw.mean())
    assert abs(float(router.expert_bias.sum())) < 1e-7
    router.train()
    x = torch.randn(10, 4)
    with torch.enable_grad():
        c1 = router(x).tokens_per_expert
        c2 = router(x).tokens_per_expert
    torch.testing.assert_close(router.pending_counts, c1 + c2)
    with torch.no_grad():                                    # recompute/eval passes are not counted
        router(x)
    torch.testing.assert_close(router.pending_counts, c1 + c2)
    router.update_bias()
    assert int(router.pending_counts.sum()) == 0


def fake_output(probs: torch.Tensor, idx: torch.Tensor) -> RouterOutput:
    n_experts = probs.shape[-1]
    return RouterOutput(idx, probs.gather(-1, idx), probs, probs.log(), torch.bincount(idx.reshape(-1), minlength=n_experts))


def test_load_balancing_loss_closed_forms_and_float64_loop():
    n_tokens, n_experts, k = 16, 4, 2
    uniform = torch.full((n_tokens, n_experts), 1 / n_experts)
    balanced = (torch.arange(n_tokens * k) % n_experts).view(n_tokens, k)
    assert float(load_balancing_loss([fake_output(uniform, balanced)] * 3, n_experts, k)) == pytest.approx(1.0)
    collapsed = torch.zeros(n_tokens, n_experts)
    collapsed[:, 0] = 1.0
    one = torch.zeros(n_tokens, 1, dtype=torch.long)
    assert float(load_balancing_loss([fake_output(collapsed, one)], n_experts, 1)) == pytest.approx(n_experts)
    # random layers: E * sum_i f_i P_i per layer, averaged, by explicit loops in float64
    torch.manual_seed(0)
    outs, want = [], 0.0
    for _ in range(3):
        probs = torch.randn(n_tokens, n_experts).softmax(-1)
        idx = probs.topk(k, -1).indices
        outs.append(fake_output(probs, idx))
        layer = 0.0
        for i in range(n_experts):
            f = sum(int(idx[t, j] == i) for t in range(n_tokens) for j in range(k)) / (n_tokens * k)
            p = sum(float(probs[t, i]) for t in range(n_tokens)) / n_tokens
            layer += n_experts * f * p
        want += layer / 3
    assert float(load_balancing_loss(outs, n_experts, k)) == pytest.approx(want, rel=1e-6)


def test_load_balancing_loss_reduce_fn_called_once_on_stacked_counts_and_gradient_flows():
    torch.manual_seed(0)
    router = Router(8, 4, 2)
    outs = [router(torch.randn(10, 8)) for _ in range(3)]
    calls = []

    def reduce_fn(t):
        calls.append(tuple(t.shape))
        return t * 2             # e.g. the all-reduce SUM over two identical ranks
    loss = load_balancing_loss(outs, 4, 2, reduce_fn=reduce_fn)
    assert calls == [(3, 4)]
    assert loss.item() == pytest.approx(load_balancing_loss(outs, 4, 2).item())   # f is a fraction
    loss.backward()
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_z_loss_is_mean_logsumexp_squared():
    logits = [torch.randn(5, 4, dtype=torch.float64) for _ in range(2)]
    outs = [RouterOutput(torch.zeros(5, 1, dtype=torch.long), torch.ones(5, 1), lg.softmax(-1), lg, torch.zeros(4)) for lg in logits]
    want = sum(sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in lg.tolist()) / 5 for lg in logits) / 2
    assert float(z_loss(outs)) == pytest.approx(want, rel=1e-9)


def test_bad_configuration():
    with pytest.raises(RouterConfigError):
        Router(8, 4, 5)
    with pytest.raises(RouterConfigError):
        Router(8, 4, 2, score="tanh")
    with pytest.raises(RouterConfigError):
        Router(8, 4, 2)(torch.randn(3, 7))
    with pytest.raises(RouterConfigError):
        load_balancing_loss([], 4, 2)
    with pytest.raises(RouterConfigError, match="expert_bias=False"):
        Router(8, 4, 2).update_bias(torch.ones(4))


def test_one_slot_gates_are_the_scores_so_the_task_loss_reaches_the_router():
    # normalised over one slot every gate is 1: the task loss gave the router no gradient at top_k=1
    torch.manual_seed(0)
    x, upstream = torch.randn(16, 8), torch.randn(16, 1)
    router = Router(8, 4, 1)
    out = router(x)
    torch.testing.assert_close(out.gate, out.probs.gather(-1, out.expert_idx))
    (out.gate * upstream).sum().backward()
    assert float(router.weight.grad.abs().max()) > 1e-3
    asked = Router(8, 4, 1, normalize_gates=True)
    assert bool((asked(x).gate == 1).all())
    assert Router(8, 4, 2).normalize_gates  # top-k > 1 normalises by default
