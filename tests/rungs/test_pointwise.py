"""The elementwise chains between the GEMMs (rungs.pointwise): their math against plain autograd in
float64, the GPU's RoPE form against the CPU's, and that each traces whole for torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rungs.model import apply_rope, rms_norm, rope_tables
from rungs.pointwise import rope_rotate, set_compiled, swiglu, swiglu_backward

torch.set_num_threads(1)


def _inputs(rows=12, hidden=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, hidden, generator=g, dtype=dtype) for _ in range(3)] + [
        torch.rand(rows, generator=g, dtype=dtype)]


def test_swiglu_backward_is_the_gradient_of_the_gated_swiglu():
    dh, a, b, gate = _inputs()
    leaves = [t.clone().requires_grad_() for t in (a, b, gate)]
    h = gate[:, None] * F.silu(a) * b
    out = leaves[2][:, None] * F.silu(leaves[0]) * leaves[1]
    out.backward(dh)
    h_got, d_ab, dgate = swiglu_backward(dh, a, b, gate)
    torch.testing.assert_close(h_got, h)
    torch.testing.assert_close(d_ab, torch.cat([leaves[0].grad, leaves[1].grad], dim=1))
    torch.testing.assert_close(dgate, leaves[2].grad)
    torch.testing.assert_close(swiglu(a, b, gate), h)
    torch.testing.assert_close(swiglu(a, b, None), F.silu(a) * b)


@pytest.mark.parametrize("layout", ["bhtd", "bthd"])
def test_the_gpus_real_arithmetic_rope_equals_the_cpus_complex_multiply(layout):
    cos, sin = rope_tables(16, 8, 10_000.0)
    x = torch.randn(2, 3, 16, 8, generator=torch.Generator().manual_seed(1))          # (B, h, T, hd)
    want = apply_rope(x, cos, sin)
    if layout == "bthd":
        got = rope_rotate(x.transpose(1, 2), cos.unsqueeze(1), sin.unsqueeze(1)).transpose(1, 2)
        torch.testing.assert_close(apply_rope(x.transpose(1, 2).contiguous(), cos, sin, seq_dim=-3).transpose(1, 2),
                                   want)
    else:
        got = rope_rotate(x, cos, sin)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_each_chain_traces_whole_for_torch_compile():
    """What runs compiled on a GPU: dynamo must take every chain in one graph (fullgraph) with
    dynamic sizes; a graph break would leave the chain as separate kernels there (backend="eager":
    the capture alone, no code generator)."""
    dh, a, b, gate = _inputs(dtype=torch.float32)
    cos, sin = rope_tables(12, 8, 10_000.0)
    cases = [(swiglu_backward.eager, (dh, a, b, gate)), (swiglu.eager, (a, b, gate)),
             (rope_rotate.eager, (torch.randn(2, 12, 3, 8), cos[:, None], sin[:, None])),
             (rms_norm.eager, (a, torch.rand(8) + 0.5, 1e-6, torch.bfloat16))]
    for fn, args in cases:
        got = torch.compile(fn, backend="eager", fullgraph=True, dynamic=True)(*args)
        want = fn(*args)
        for g, r in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            torch.testing.assert_close(g, r)


def test_set_compiled_returns_the_previous_setting():
    assert set_compiled(False) is True
    try:
        assert set_compiled(False) is False
    finally:
        set_compiled(True)
