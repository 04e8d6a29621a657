"""Chunked linear cross-entropy (rungs.loss) against the plain loss over materialised logits: value
and gradients in fp32 and float64, under bf16 autocast, chunk sizes that do not divide the tokens,
the model's targets path, and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rungs.loss import linear_cross_entropy

torch.set_num_threads(1)


def inputs(n=37, d=16, vocab=50, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = (torch.randn(vocab, d, generator=g, dtype=dtype) * 0.5).requires_grad_()
    t = torch.randint(0, vocab, (n,), generator=g)
    return h, w, t


def plain(h, w, t):
    return F.cross_entropy(F.linear(h, w).float(), t)


@pytest.mark.parametrize("tokens_per_chunk", [1, 5, 16, 37, 1000])
def test_value_and_gradients_equal_the_plain_loss(tokens_per_chunk):
    h, w, t = inputs()
    h2, w2 = (x.detach().clone().requires_grad_() for x in (h, w))
    got = linear_cross_entropy(h, w, t, logits_per_chunk=tokens_per_chunk * w.shape[0])
    want = plain(h2, w2, t)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    (2.5 * got).backward()  # a non-unit upstream gradient
    (2.5 * want).backward()
    torch.testing.assert_close(h.grad, h2.grad, rtol=0, atol=1e-6)
    torch.testing.assert_close(w.grad, w2.grad, rtol=0, atol=1e-6)


def test_float64_against_a_log_softmax_reference():
    h, w, t = inputs(dtype=torch.float64, seed=1)
    got = linear_cross_entropy(h, w, t, logits_per_chunk=7 * w.shape[0])
    logits = h.detach() @ w.detach().T
    want = -(logits.log_softmax(-1)[torch.arange(len(t)), t]).mean()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)  # the loss itself is fp32
    got.backward()
    probs = logits.softmax(-1)
    probs[torch.arange(len(t)), t] -= 1
    # The logits are fp32 (as the plain loss's `.float()` makes them): fp32-accurate gradients.
    torch.testing.assert_close(h.grad, probs @ w.detach() / len(t), rtol=0, atol=1e-7)
    torch.testing.assert_close(w.grad, probs.T @ h.detach() / len(t), rtol=0, atol=1e-7)


def test_bf16_autocast_matches_the_plain_loss_under_autocast():
    h, w, t = inputs(n=64, d=32, vocab=100)
    h2, w2 = (x.detach().clone().requires_grad_() for x in (h, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(h, w, t, logits_per_chunk=10 * 100)
        want = plain(h2, w2, t)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-3)
    got.backward()
    want.backward()
    assert h.grad.dtype == h2.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    torch.testing.assert_close(h.grad, h2.grad, rtol=0.02, atol=1e-4)
    torch.testing.assert_close(w.grad, w2.grad, rtol=0.02, atol=1e-4)


def test_no_gradient_wanted_gives_the_loss_only():
    h, w, t = inputs()
    with torch.no_grad():
        got = linear_cross_entropy(h, w, t, logits_per_chunk=3 * w.shape[0])
    torch.testing.assert_close(got, plain(h, w, t).detach(), rtol=0, atol=1e-6)


def test_model_targets_path_equals_cross_entropy_of_its_logits(monkeypatch):
    from dataclasses import replace

    import rungs.loss
    from rungs.model import ModelConfig, Transformer
    from tests.rungs.test_model import MAI_LIKE

    monkeypatch.setattr(rungs.loss, "LOGITS_PER_CHUNK", 8 * MAI_LIKE.vocab_size)  # several chunks
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**vars(replace(MAI_LIKE, n_layers=2))))
    idx = torch.randint(0, MAI_LIKE.vocab_size, (2, 20))
    targets = torch.randint(0, MAI_LIKE.vocab_size, (2, 20))
    loss, _ = model(idx, targets)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    logits, _ = model(idx)
    want = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    want_grads = torch.autograd.grad(want, list(model.parameters()))
    torch.testing.assert_close(loss, want, rtol=0, atol=1e-6)
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bad_input_is_refused():
    h, w, t = inputs()
    with pytest.raises(ValueError, match="hidden"):
        linear_cross_entropy(h[None], w, t)
    with pytest.raises(ValueError, match="targets"):
        linear_cross_entropy(h, w, t[:-1])
    with pytest.raises(ValueError, match="no tokens"):
        linear_cross_entropy(h[:0], w, t[:0])
    with pytest.raises(ValueError, match="logits_per_chunk"):
        linear_cross_entropy(h, w, t, logits_per_chunk=0)
