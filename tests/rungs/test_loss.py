"""Chunked linear cross-entropy (rungs.loss) against the plain loss over materialised logits: value
and gradients in fp32 and float64, under bf16 autocast, chunk sizes that do not divide the tokens,
the compiled chunk's math and its fallback, the model's targets path, the (V × d) work per chunk
(counted by op, on the CPU and on the meta device that stands in for a GPU's GEMMs), and bad input."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import rungs.loss
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

    import rungs.loss_chunks
    from rungs.model import ModelConfig, Transformer
    from tests.rungs.test_model import MAI_LIKE

    monkeypatch.setattr(rungs.loss_chunks, "LOGITS_PER_CHUNK", 8 * MAI_LIKE.vocab_size)  # several chunks
    seen = []
    monkeypatch.setattr(rungs.loss, "_chunk_loss_and_grad",
                        lambda h, *a, f=rungs.loss._chunk_loss_and_grad: seen.append(h.shape[0]) or f(h, *a))
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
    assert seen == [8, 8, 8, 8, 8], seen                                     # 40 tokens in chunks of 8


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
    with pytest.raises(ValueError, match="kernel"):
        linear_cross_entropy(h, w, t, kernel="triton")


def test_the_compiled_chunks_math_equals_the_eager_kernels():
    """`_softmax_grad_fused` is what torch.compile fuses on a GPU; run eagerly it must give the eager
    path's loss and gradient (float64, so only the formulas are compared)."""
    g = torch.Generator().manual_seed(3)
    h, w = torch.randn(9, 6, generator=g, dtype=torch.float64), torch.randn(40, 6, generator=g, dtype=torch.float64)
    t = torch.randint(0, 40, (9,), generator=g)
    loss, grad = rungs.loss._softmax_grad(h, w, t, True)
    fused_loss, fused_grad = rungs.loss._softmax_grad_fused(h @ w.T, t)
    logits = h @ w.T
    want = F.cross_entropy(logits, t, reduction="none")
    torch.testing.assert_close(loss, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(fused_loss, want, rtol=0, atol=1e-12)
    onehot = F.one_hot(t, 40).double()
    torch.testing.assert_close(grad, logits.softmax(-1) - onehot, rtol=0, atol=1e-12)
    torch.testing.assert_close(fused_grad, grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("autocast", [False, True])
def test_the_compiled_kernel_path_and_its_fallback_equal_the_plain_loss(monkeypatch, autocast):
    """kernel="compiled" (the CUDA default) through the whole Function, with the fused math run
    uncompiled (compiling costs seconds on a CPU); and a compile that fails falls back to the eager
    kernels, once, with the same numbers."""
    monkeypatch.setattr(rungs.loss, "_COMPILE_FAILED", set())
    calls = []

    def failing(*args):
        calls.append(1)
        raise RuntimeError("no compiler")

    results = []
    for compiled in (rungs.loss._softmax_grad_fused, failing, failing):
        monkeypatch.setattr(rungs.loss, "_compiled_softmax_grad", lambda c=compiled: c)
        h, w, t = inputs(n=48, d=16, vocab=40)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = linear_cross_entropy(h, w, t, logits_per_chunk=10 * 40, kernel="compiled")
        loss.backward()
        results.append((loss.detach(), h.grad, w.grad))
    assert len(calls) == 1 and rungs.loss._COMPILE_FAILED == {"cpu"}      # tried once, then eager
    h, w, t = inputs(n=48, d=16, vocab=40)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        want = plain(h, w, t)
    want.backward()
    exact = _float64_reference(h, w, t)
    for got in results:
        if autocast:  # bf16: no further from the exact numbers than the plain bf16 path is
            for ours, theirs, truth in zip(got, (want.detach(), h.grad, w.grad), exact):
                assert (ours - truth).abs().max() <= 2 * (theirs - truth).abs().max() + 1e-6
        else:
            for ours, theirs in zip(got, (want.detach(), h.grad, w.grad)):
                torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def _float64_reference(h, w, t):
    """The mean cross-entropy and its gradients computed in float64 from the same inputs."""
    h64, w64 = (x.detach().double().requires_grad_() for x in (h, w))
    loss = F.cross_entropy(h64 @ w64.T, t)
    loss.backward()
    return loss.detach().float(), h64.grad.float(), w64.grad.float()


class _VocabByModelOps(TorchDispatchMode):
    """Records the aten ops that read or write a (V, d)-sized tensor: name, and for GEMMs their output."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.ops, self.gemm_outputs = numel, collections.Counter(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [x for x in (*args, *kwargs.values(), *(out if isinstance(out, tuple) else (out,)))
                   if isinstance(x, torch.Tensor)]
        if getattr(func, "is_view", False) or not any(x.numel() == self.numel for x in tensors):
            return out
        name = func._schema.name.split("::")[-1]
        self.ops[name] += 1
        result = kwargs.get("out", out)
        if name.startswith(("mm", "addmm")) and isinstance(result, torch.Tensor) and result.numel() == self.numel:
            self.gemm_outputs.append(result)
        return out


@pytest.mark.parametrize("device,autocast", [("cpu", False), ("cpu", True), ("meta", False)])
def test_the_weight_gradient_work_does_not_grow_with_the_number_of_chunks(monkeypatch, device, autocast):
    """Per chunk the (V, d) weight gradient costs one GEMM that accumulates into the same fp32 tensor
    (beta = 1), never a temporary, a copy or an add: every other op on (V, d)-sized tensors (the
    weight's cast, the backward's scale) runs once per call, however many chunks. The GEMMs that read
    the weight (logits, hidden gradient) read it in every chunk by nature and are not counted. On
    the meta device (bf16 operands, fp32 gradient) the GPU's `out_dtype` GEMM runs by shape."""
    monkeypatch.setattr(rungs.loss, "_OUT_DTYPE_GEMM", {})
    vocab, d, n = 48, 16, 64
    counts = {}
    for chunks in (2, 8):
        h = torch.randn(n, d, device=device, requires_grad=True)
        w = torch.randn(vocab, d, device=device, requires_grad=True)
        t = torch.randint(0, vocab, (n,), device=device)
        census = _VocabByModelOps(vocab * d)
        with census, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            hidden = h.to(torch.bfloat16) if device == "meta" else h                  # bf16 compute
            weight = w.to(torch.bfloat16) if device == "meta" else w
            linear_cross_entropy(hidden, weight, t, logits_per_chunk=(n // chunks) * vocab).backward()
        accumulating = [o for o in census.gemm_outputs if o.dtype == torch.float32]
        assert len(accumulating) == chunks and all(o is accumulating[0] for o in accumulating), census.ops
        reads = {"mm", "addmm"} if device == "cpu" and autocast else {"mm"}    # GEMMs that only read w
        counts[chunks] = {k: v for k, v in census.ops.items() if not k.startswith(("mm", "addmm"))}
        assert sum(v for k, v in census.ops.items() if k in reads) >= chunks
    assert counts[2] == counts[8], counts
    if device == "meta":
        assert rungs.loss._OUT_DTYPE_GEMM == {"meta": True}
