"""`rungs.held_weights.held_expert_weights`: gradient accumulation that casts the expert stacks once a step and adds
later micro-batches' weight gradients into .grad in place. Against the plain path: the same gradients
and parameters bit for bit (one and several MoE rounds, across optimizer steps, in the job's own step),
and the traffic on stack-sized tensors counted by op under a dispatch mode: fewer casts and copies."""

from __future__ import annotations

import contextlib
import copy
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rungs.moe as moe
from rungs.architecture import ModelConfig
from rungs.model import Transformer
from rungs.held_weights import held_expert_weights
from rungs.moe import MoEConfigError, RoutedExperts
from rungs.optim import build_optimizer

ARCH = ModelConfig(n_layers=2, d_model=64, n_heads=4, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=2,
                   global_every=2, window_tokens=64, seq_len=64, n_experts=8, top_k=2, n_shared_experts=1,
                   latent_dim=32, expert_hidden=48, shared_hidden=40, vocab_size=512)
MICRO = 3


def _train(model: Transformer, batches: list[torch.Tensor], hold: bool, steps: int = 2):
    """`steps` optimizer steps of MICRO micro-batches each, bf16 autocast; each step's gradients and the
    final parameters."""
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.1)
    grads = []
    for step in range(steps):
        with held_expert_weights(model) if hold else contextlib.nullcontext():
            for tokens in batches[step * MICRO:(step + 1) * MICRO]:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    ce, _ = model(tokens[:, :-1], tokens[:, 1:])
                (ce / MICRO).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grads, {n: p.detach().clone() for n, p in model.named_parameters()}, model


def _batches(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, ARCH.vocab_size, (2, ARCH.seq_len + 1), generator=gen) for _ in range(n)]


@pytest.mark.parametrize("capacity", [None, 2])   # one round; several rounds (fp32 sums over rounds)
def test_the_same_gradients_and_parameters_bit_for_bit_across_optimizer_steps(capacity):
    torch.manual_seed(0)
    base = Transformer(ARCH)
    if capacity is not None:
        for block in base.layers:
            block.moe.experts.capacity_per_expert = capacity
    batches = _batches(2 * MICRO)
    plain_grads, plain_params, _ = _train(copy.deepcopy(base), batches, hold=False)
    held_grads, held_params, model = _train(copy.deepcopy(base), batches, hold=True)
    for plain, held in zip(plain_grads, held_grads):
        assert plain.keys() == held.keys()
        assert [n for n in plain if not torch.equal(plain[n], held[n])] == []
    assert [n for n in plain_params if not torch.equal(plain_params[n], held_params[n])] == []
    rounds = model.layers[0].moe.experts.last_stats["computed_rounds"]
    assert rounds == 1 if capacity is None else rounds > 1


class _StackOps(TorchDispatchMode):
    """Every op whose output has an expert stack's shape, by (op, dtype)."""

    def __init__(self, shapes: set[tuple[int, ...]]) -> None:
        super().__init__()
        self.shapes, self.ops = shapes, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and tuple(out.shape) in self.shapes:
            self.ops[(func.overloadpacket.__name__, str(out.dtype).removeprefix("torch."))] += 1
        return out


def _stack_ops(hold: bool, micro: int) -> Counter:
    torch.manual_seed(0)
    experts = RoutedExperts(8, 32, 48)
    gen = torch.Generator().manual_seed(2)
    calls = [(torch.randn(40, 32, generator=gen), torch.randint(0, 8, (40, 2), generator=gen),
              torch.rand(40, 2, generator=gen)) for _ in range(micro)]
    mode = _StackOps({(8, 48, 32), (8, 32, 48), (8, 96, 32)})
    with held_expert_weights(experts) if hold else contextlib.nullcontext(), mode:
        for x, idx, gate in calls:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = experts(x, idx, gate)
            y.float().sum().backward()
    return mode.ops


def test_a_step_casts_the_stacks_once_and_later_micro_batches_add_in_place():
    """Per micro-batch the plain path casts the stacks in forward and again in backward (gate|up stack
    and down: 2 writes each), and from the second micro-batch on copies each bf16 weight gradient to
    float32 and adds it; held, the casts happen once a step and each later gradient is one add_."""
    plain, held = _stack_ops(False, MICRO), _stack_ops(True, MICRO)
    casts = ("copy_", "bfloat16"), ("_to_copy", "bfloat16")
    assert sum(plain[c] for c in casts) == 2 * MICRO * 3 and sum(held[c] for c in casts) == 3
    widen = ("_to_copy", "float32")
    assert plain[widen] == 3 * MICRO and held[widen] == 3          # the first micro-batch's grads only
    assert plain[("add_", "float32")] == held[("add_", "float32")] == 3 * (MICRO - 1)


def test_a_stack_written_inside_is_cast_again_and_the_copies_go_at_the_end():
    torch.manual_seed(0)
    experts = RoutedExperts(8, 32, 48)
    x, idx, gate = torch.randn(16, 32), torch.randint(0, 8, (16, 2)), torch.rand(16, 2)
    with held_expert_weights(experts):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            first = experts(x, idx, gate)
        with torch.no_grad():
            experts.w_down.mul_(2.0)                                # e.g. an optimizer step inside
        with torch.autocast("cpu", dtype=torch.bfloat16):
            held = experts(x, idx, gate)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = experts(x, idx, gate)
    assert torch.equal(held, plain) and not torch.equal(first, plain)
    assert experts._held is None


def test_the_copies_go_when_the_block_raises_and_a_gradient_hook_is_refused():
    torch.manual_seed(0)
    model = Transformer(ARCH)
    with pytest.raises(RuntimeError, match="inside"):
        with held_expert_weights(model):
            raise RuntimeError("a failure inside")
    assert all(block.moe.experts._held is None for block in model.layers)
    model.layers[1].moe.experts.w_up.register_hook(lambda g: g)
    with pytest.raises(MoEConfigError, match="w_up has a gradient hook"):
        with held_expert_weights(model):
            pass
    assert all(block.moe.experts._held is None for block in model.layers)


def test_the_jobs_step_holds_the_stacks_when_it_accumulates_under_bf16(monkeypatch):
    """`rungs.torch_engine.train_step_on_device` at precision bf16 with 2 micro-batches: one cast of each
    layer's stacks a step (the plain path: 2 per micro-batch), the same parameter updates bit for bit."""
    from tests.rungs.test_train import _one_sgd_step
    from tests.rungs.train_helpers import tiny_config
    import rungs.torch_engine as engine
    from rungs.config import parse_config

    cfg = parse_config(tiny_config(micro_batch_sequences=2, precision="bf16", agc=False))
    made = []
    real = moe._compute_weights
    monkeypatch.setattr(moe, "_compute_weights", lambda *a: made.append(1) or real(*a))
    _, held = _one_sgd_step(cfg)
    held_casts = len(made)
    monkeypatch.setattr(engine, "held_expert_weights", lambda model: contextlib.nullcontext())
    made.clear()
    _, plain = _one_sgd_step(cfg)
    n_layers = cfg.architecture().n_layers
    assert held_casts == n_layers and len(made) == 2 * cfg.accumulation_steps * n_layers
    assert [n for n in plain if not torch.equal(plain[n], held[n])] == []
