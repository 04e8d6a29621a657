"""The op census (rungs.op_census): categories, bytes and FLOPs of known ops, fake tensors, fused chains."""

from __future__ import annotations

import torch

from rungs.op_census import OpCensus, active_census, count_fake, modelled_seconds
from rungs.pointwise import swiglu

torch.set_num_threads(1)


def _one(records, name):
    found = [r for r in records if r.name == name]
    assert len(found) == 1, [r.name for r in records]
    return found[0]


def test_bytes_and_flops_of_known_ops():
    a, b = torch.randn(6, 4), torch.randn(4, 5)
    x = torch.randn(8, 3)
    with OpCensus() as census:
        a @ b                                           # (6, 4) x (4, 5): 2*6*4*5 FLOPs
        x.to(torch.bfloat16)                            # reads 4 B, writes 2 B per element
        x.add_(1.0)                                     # in place: read and written
        y = torch.zeros(10, 3)
        y.index_copy_(0, torch.tensor([1, 4]), x[:2])   # moves the two source rows and the index
        y.copy_(torch.ones(10, 3))                      # writes y, reads the source only
        x.view(24)                                      # a view moves nothing
    mm = _one(census.records, "mm")
    assert (mm.category, mm.flops, mm.read_bytes, mm.write_bytes) == ("gemm", 240, (24 + 20) * 4, 30 * 4)
    cast = _one(census.records, "_to_copy")
    assert (cast.category, cast.read_bytes, cast.write_bytes) == ("cast", 96, 48)
    add = _one(census.records, "add_")
    assert (add.category, add.read_bytes, add.write_bytes) == ("elementwise", 96, 96)
    index = _one(census.records, "index_copy_")
    assert (index.category, index.read_bytes, index.write_bytes) == ("index", 16 + 24, 24)
    copy = _one(census.records, "copy_")
    assert (copy.read_bytes, copy.write_bytes) == (120, 120)
    assert not [r for r in census.records if r.name == "view"]
    assert census.by_category()["gemm"] == {"kernels": 1, "bytes": mm.bytes, "flops": 240}


def test_an_out_of_place_baddbmm_is_charged_the_copy_of_its_input():
    """On CUDA an out-of-place addmm/baddbmm with beta != 0 copies its input into the output first."""
    A = torch.randn(3, 4, 4)
    with OpCensus() as census:
        torch.baddbmm(A, A, A, beta=0.5, alpha=2.0)
        torch.baddbmm(A, A, A, beta=0.0)
    copies = [r for r in census.records if r.category == "copy"]
    assert [(r.name, r.read_bytes, r.write_bytes) for r in copies] == [("baddbmm_input_copy", 192, 192)]
    assert [r.flops for r in census.records if r.name == "baddbmm"] == [2 * 3 * 4 * 4 * 4] * 2


def test_fake_tensors_count_the_same_bytes_without_memory():
    def work(t):
        (t @ t.mT).sum().backward()

    real = OpCensus()
    t = torch.randn(64, 32, requires_grad=True)
    with real:
        work(t)
    fake = count_fake(lambda: torch.randn(64, 32, requires_grad=True), work)
    assert [(r.name, r.bytes, r.flops) for r in fake.records] == [(r.name, r.bytes, r.flops) for r in real.records]
    assert active_census() is None


def test_a_fused_chain_counts_as_one_kernel_forward_and_backward():
    a, b = torch.randn(16, 8, requires_grad=True), torch.randn(16, 8)
    gate = torch.rand(16)
    eager = OpCensus()
    with eager:
        swiglu(a, b, gate).sum().backward()
    fused = OpCensus(fuse_pointwise=True)
    grad_eager = a.grad.clone()
    a.grad = None
    with fused:
        out = swiglu(a, b, gate)
        out.sum().backward()
    torch.testing.assert_close(a.grad, grad_eager)                    # the same function, counted differently
    kinds = {r.name: r for r in fused.records if r.category == "fused"}
    assert set(kinds) == {"swiglu", "swiglu_backward"}
    assert kinds["swiglu"].read_bytes == (16 * 8 * 2 + 16) * 4 and kinds["swiglu"].write_bytes == 16 * 8 * 4
    assert kinds["swiglu_backward"].write_bytes == 16 * 8 * 4          # d a only: b and the gate need none
    assert len(fused.records) < len(eager.records)


def test_modelled_time_is_the_roofline_of_each_op():
    with OpCensus() as census:
        torch.randn(128, 64) @ torch.randn(64, 32)
    mm = _one(census.records, "mm")
    t = modelled_seconds([mm], gemm_flops_per_second=1e9, bytes_per_second=1e12, seconds_per_kernel=1e-6)
    assert t["gemm"] == t["total"] == mm.flops / 1e9 + 1e-6
