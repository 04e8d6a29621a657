"""Activation checkpointing (ModelConfig.activation_checkpointing): the same loss and gradients as
no checkpointing, with activation gradient clipping and dropout on, routers counting each token once,
and fewer bytes saved for backward (measured with saved_tensors_hooks)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rungs.agc import ActivationGradClipper
from rungs.agc_settings import AGCSettings
from rungs.model import ModelConfig, Transformer
from rungs.router import load_balancing_loss

torch.set_num_threads(1)

# A global layer (every 2nd) and window layers with the window shorter than the sequence.
CFG = ModelConfig(n_layers=3, d_model=32, n_heads=4, head_dim=8, n_kv_heads_global=1, n_kv_heads_local=2,
                  global_every=2, window_tokens=8, seq_len=24, n_experts=8, top_k=2, n_shared_experts=1,
                  latent_dim=16, expert_hidden=32, shared_hidden=32, vocab_size=64, dropout=0.1)


def step(mode: str):
    """One forward/backward of loss + balancing loss; gradients, the bytes saved for backward, router counts."""
    torch.manual_seed(0)
    model = Transformer(replace(CFG, activation_checkpointing=mode)).train()
    # A fixed low threshold, so clipping happens and must happen once per point, in the real graph.
    clipper = ActivationGradClipper(AGCSettings(mode="fixed", threshold=1e-4))
    model.activation_clip = clipper
    clipper.begin_step(0)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=g)
    targets = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=g)
    clipper.begin_micro_batch(idx)
    saved_bytes = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved_bytes
        saved_bytes += t.numel() * t.element_size()
        return t

    torch.manual_seed(2)  # dropout masks
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ce, routes = model(idx, targets)
        loss = ce + 0.01 * load_balancing_loss(routes, CFG.n_experts, CFG.top_k)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    counts = [block.moe.router.pending_counts.clone() for block in model.layers]
    return float(loss.detach()), grads, saved_bytes, counts, clipper.total_clips


@pytest.fixture(scope="module")
def runs():
    return {mode: step(mode) for mode in ("none", "selective", "full")}


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_loss_gradients_clips_and_router_counts_equal_no_checkpointing(runs, mode):
    loss, grads, _, counts, clips = runs[mode]
    ref_loss, ref_grads, _, ref_counts, ref_clips = runs["none"]
    assert loss == pytest.approx(ref_loss, abs=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert ref_clips > 0 and clips == ref_clips
    for c, ref in zip(counts, ref_counts):
        assert torch.equal(c, ref)  # the recomputed forward is not counted again
    assert int(ref_counts[0].sum()) == 3 * CFG.seq_len * CFG.top_k


def test_checkpointing_saves_fewer_bytes_for_backward(runs):
    none, selective, full = (runs[m][2] for m in ("none", "selective", "full"))
    assert selective < 0.9 * none
    assert full < 0.5 * selective


def test_config_default_keeps_the_key_and_refuses_unknown_modes():
    from ladder.plan.resolve import resolve_train_config
    from rungs.config import TrainConfigError, parse_config

    raw = resolve_train_config("cpu-demo", 3, {"tracking_uri": None})
    base = parse_config(raw)
    assert parse_config(raw | {"activation_checkpointing": "none"}).key() == base.key()
    assert parse_config(raw | {"activation_checkpointing": "full"}).architecture().activation_checkpointing == "full"
    with pytest.raises(TrainConfigError, match="activation_checkpointing"):
        parse_config(raw | {"activation_checkpointing": "attention"})
