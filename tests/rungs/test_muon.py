"""Muon: scale-invariant Newton-Schulz, agreement with torch.optim.Muon, batched expert stacks, the
float32-emulated bf16 Newton-Schulz used on CPUs without bf16 units."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rungs.cpu_bf16 import cpu_has_bf16_units
from rungs.muon import CONVENTIONS, Muon, MuonConfigError, newton_schulz, ns_working_bytes

torch.set_num_threads(1)


@pytest.mark.parametrize("shape", [(16, 32), (32, 16), (3, 24, 8)])
@pytest.mark.parametrize("c", [1e-30, 1e-20, 1e-9, 1e-7, 1e-5, 1e-3, 1e-1, 1.0, 10.0, 1e3, 1e20, 1e30])
def test_newton_schulz_is_scale_invariant(shape, c):
    G = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(newton_schulz(c * G, dtype=torch.float32), newton_schulz(G, dtype=torch.float32),
                               rtol=1e-4, atol=1e-5)
    # bf16 compute: c*G rounds differently to bf16 than G, so only bf16-level agreement
    diff = (newton_schulz(c * G).float() - newton_schulz(G).float()).abs().max()
    assert diff < 0.05


def test_eps_clamp_would_break_scale_invariance_but_ours_does_not():
    """torch.optim.Muon clamps the norm at 1e-7, so a gradient with ||G|| < 1e-7 is divided by eps
    instead of its norm and comes out shrunk (NVIDIA-NeMo/Emerging-Optimizers #229); ours does not."""
    from torch.optim._muon import _zeropower_via_newtonschulz as torch_ns

    G = torch.randn(16, 32, generator=torch.Generator().manual_seed(0)) * 1e-11
    ours = torch.linalg.svdvals(newton_schulz(G).float())
    clamped = torch.linalg.svdvals(torch_ns(G, (3.4445, -4.7750, 2.0315), 5, 1e-7).float())
    assert ours.min() > 0.5 and ours.max() < 1.5                  # orthogonalised
    assert clamped.max() < 0.6                                      # the eps clamp shrank it


def test_newton_schulz_of_zero_is_zero():
    assert torch.equal(newton_schulz(torch.zeros(4, 6), dtype=torch.float32), torch.zeros(4, 6))
    assert torch.equal(newton_schulz(torch.zeros(2, 4, 6)).float(), torch.zeros(2, 4, 6))


def test_newton_schulz_approximately_orthogonalises_and_batches():
    G = torch.randn(4, 24, 40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = newton_schulz(G, dtype=None)
    assert out.shape == G.shape and out.dtype == torch.float64
    s = torch.linalg.svdvals(out)
    assert s.min() > 0.5 and s.max() < 1.3                         # the quintic's known band
    # singular vectors are those of G: out ~ U f(S) V^T
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    inner = U.mT @ out @ Vh.mT
    off_diag = inner - torch.diag_embed(torch.diagonal(inner, dim1=-2, dim2=-1))
    assert off_diag.abs().max() < 1e-6
    for i in range(4):                                             # batch == one at a time
        torch.testing.assert_close(out[i], newton_schulz(G[i], dtype=None))


@pytest.mark.parametrize("adjust_lr", ["match_rms_adamw", "original"])
@pytest.mark.parametrize("nesterov", [True, False])
def test_matches_torch_optim_muon_on_plain_matrices(adjust_lr, nesterov):
    g = torch.Generator().manual_seed(0)
    shapes = [(16, 32), (32, 16), (24, 24), (16, 32)]              # two share a shape: batched NS path
    init = [torch.randn(s, generator=g) for s in shapes]
    ours = [torch.nn.Parameter(p.clone()) for p in init]
    ref = [torch.nn.Parameter(p.clone()) for p in init]
    opt = Muon(ours, lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr=adjust_lr,
               ns_emulate=False)                           # native bf16, torch.optim.Muon's path
    torch_opt = torch.optim.Muon(ref, lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov,
                                 adjust_lr_fn=adjust_lr)
    for _ in range(4):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, gr in zip(ours, grads):
            p.grad = gr.clone()
        for p, gr in zip(ref, grads):
            p.grad = gr.clone()
        opt.step()
        torch_opt.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert opt.convention == CONVENTIONS[adjust_lr]


def test_expert_stack_is_each_expert_orthogonalised_separately_with_its_own_scale():
    g = torch.Generator().manual_seed(0)
    stack = torch.nn.Parameter(torch.randn(3, 8, 24, generator=g))
    singles = [torch.nn.Parameter(stack[e].detach().clone()) for e in range(3)]
    opt_stack = Muon([stack], lr=0.01, weight_decay=0.05, ns_emulate=False)
    opt_single = torch.optim.Muon(singles, lr=0.01, weight_decay=0.05, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        grad = torch.randn(3, 8, 24, generator=g)
        stack.grad = grad.clone()
        for e in range(3):
            singles[e].grad = grad[e].clone()
        opt_stack.step()
        opt_single.step()
    for e in range(3):
        torch.testing.assert_close(stack[e], singles[e], rtol=1e-5, atol=2e-6)


def test_update_scale_formula_and_decoupled_weight_decay():
    """One step from zero momentum with G = a known orthogonal matrix: the NS fixed point is not 1,
    so measure the RMS ratio against NS(G) directly: W1 = W0 (1 - lr wd) - lr * scale * NS(G)."""
    W0 = torch.randn(12, 48)
    G = torch.randn(12, 48)
    for adjust, scale in [("match_rms_adamw", 0.2 * math.sqrt(48)), ("original", 1.0)]:
        p = torch.nn.Parameter(W0.clone())
        p.grad = G.clone()
        Muon([p], lr=0.1, weight_decay=0.5, momentum=0.0, nesterov=False, adjust_lr=adjust, ns_dtype=torch.float32).step()
        want = W0 * (1 - 0.1 * 0.5) - 0.1 * scale * newton_schulz(G, dtype=torch.float32)
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip_and_errors():
    p = torch.nn.Parameter(torch.randn(8, 8))
    opt = Muon([p], lr=0.01)
    p.grad = torch.randn(8, 8)
    opt.step()
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = Muon([q], lr=0.01)
    opt2.load_state_dict(opt.state_dict())
    torch.testing.assert_close(opt2.state[q]["momentum_buffer"], opt.state[p]["momentum_buffer"])
    with pytest.raises(MuonConfigError, match="update scale"):
        Muon([q], lr=0.01, adjust_lr="original").load_state_dict(opt.state_dict())
    with pytest.raises(MuonConfigError, match="2-D"):
        Muon([torch.nn.Parameter(torch.randn(4))], lr=0.01)
    with pytest.raises(MuonConfigError, match="adjust_lr"):
        Muon([p], lr=0.01, adjust_lr="spectral")


def _singular_values(G, coefficients):
    return torch.linalg.svdvals(newton_schulz(G, coefficients=coefficients, dtype=None))


def test_per_step_presets_orthogonalise_tighter_than_the_simple_quintic():
    """Against float64 SVD: dion's per-step quintic lands much closer to 1 than the fixed one on a
    Gaussian matrix; Polar Express (with its 1.02 safety factor) lifts the small singular values
    of an ill-conditioned matrix the most."""
    g = torch.Generator().manual_seed(0)
    G = torch.randn(64, 128, generator=g, dtype=torch.float64)
    simple, quintic = _singular_values(G, "simple"), _singular_values(G, "quintic")
    assert (quintic - 1).abs().max() < 0.05 < (simple - 1).abs().max()
    U, _, Vh = torch.linalg.svd(torch.randn(64, 128, generator=g, dtype=torch.float64), full_matrices=False)
    ill = U @ torch.diag(torch.logspace(0, -3, 64, dtype=torch.float64)) @ Vh      # condition number 1e3
    assert _singular_values(ill, "polar_express").min() > 1.5 * _singular_values(ill, "simple").min()
    assert _singular_values(ill, "polar_express").max() < 1.2


def test_coefficient_forms_and_presets_in_muon():
    G = torch.randn(8, 16, dtype=torch.float64)
    torch.testing.assert_close(newton_schulz(G, coefficients="simple", dtype=None),
                               newton_schulz(G, 5, (3.4445, -4.7750, 2.0315), dtype=None))
    torch.testing.assert_close(newton_schulz(G, coefficients=[(3.4445, -4.7750, 2.0315)] * 3, dtype=None),
                               newton_schulz(G, 3, (3.4445, -4.7750, 2.0315), dtype=None))
    p = torch.nn.Parameter(torch.randn(8, 16))
    p.grad = torch.randn(8, 16)
    Muon([p], lr=0.01, ns_coefficients="polar_express").step()
    with pytest.raises(MuonConfigError, match="preset"):
        Muon([p], lr=0.01, ns_coefficients="cubic")
    with pytest.raises(MuonConfigError, match="coefficients"):
        newton_schulz(G, coefficients=[(1.0, 2.0)])


# ---- bounded chunks -----------------------------------------------------------------------------

def test_matrix_chunks_cut_stacks_into_whole_matrices_in_order():
    from rungs.muon import matrix_chunks

    # 1 matrix, a stack of 5, 1 matrix; 2 matrices of 10 bytes fit 25 bytes
    assert matrix_chunks([1, 5, 1], 10, 25) == [[(0, 0, 1), (1, 0, 1)], [(1, 1, 3)], [(1, 3, 5)], [(2, 0, 1)]]
    assert matrix_chunks([3], 10, 1) == [[(0, 0, 1)], [(0, 1, 2)], [(0, 2, 3)]]      # at least one matrix
    assert matrix_chunks([2, 3], 10, 10**9) == [[(0, 0, 2), (1, 0, 3)]]
    with pytest.raises(MuonConfigError):
        matrix_chunks([1], 10, 0)
    with pytest.raises(MuonConfigError, match="ns_chunk_bytes"):
        Muon([torch.nn.Parameter(torch.randn(4, 4))], lr=0.01, ns_chunk_bytes=0)


def _run_muon(params, grads, **kwargs):
    opt = Muon(params, lr=0.02, weight_decay=0.1, momentum=0.9, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()
    return [p.detach().clone() for p in params], [opt.state[p]["momentum_buffer"].clone() for p in params]


@pytest.mark.parametrize("chunk_matrices", [1, 2, 3, 7])
def test_chunked_step_equals_the_unchunked_step_bit_for_bit(chunk_matrices):
    """Stacks of experts and plain matrices of one shape, cut into chunks of 1..7 matrices (chunks
    span parameters and cut stacks): parameters and momentum identical to one batch of all."""
    g = torch.Generator().manual_seed(0)
    shapes = [(5, 8, 16), (8, 16), (3, 8, 16), (16, 8), (2, 16, 8)]
    init = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(3)]
    whole = _run_muon([torch.nn.Parameter(t.clone()) for t in init], grads)
    chunked = _run_muon([torch.nn.Parameter(t.clone()) for t in init], grads,
                        ns_chunk_bytes=chunk_matrices * 8 * 16 * 4)
    for a, b in zip(whole[0] + whole[1], chunked[0] + chunked[1]):
        assert torch.equal(a, b)


def test_chunked_stack_still_matches_torch_optim_muon_per_expert():
    g = torch.Generator().manual_seed(0)
    stack = torch.nn.Parameter(torch.randn(4, 8, 24, generator=g))
    singles = [torch.nn.Parameter(stack[e].detach().clone()) for e in range(4)]
    opt_stack = Muon([stack], lr=0.01, weight_decay=0.05, ns_chunk_bytes=8 * 24 * 4, ns_emulate=False)     # one expert a chunk
    opt_single = torch.optim.Muon(singles, lr=0.01, weight_decay=0.05, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        grad = torch.randn(4, 8, 24, generator=g)
        stack.grad = grad.clone()
        for e in range(4):
            singles[e].grad = grad[e].clone()
        opt_stack.step()
        opt_single.step()
    for e in range(4):
        torch.testing.assert_close(stack[e], singles[e], rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("emulate, chunks", [(False, 4), (True, 6)])
def test_step_memory_is_bounded_by_the_chunk_not_the_stack(emulate, chunks):
    """Peak bytes allocated inside step() (MemTracker) for a 64-expert stack: with chunks of 4
    experts well under a quarter of the one-batch step's, which copies the whole stack. Native bf16
    Newton-Schulz holds under 4 chunks' bytes; the float32 emulation (CPU) under 6 (its iterate and
    Gram matrices are float32, measured 5.5)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    def peak(chunk_bytes: int) -> int:
        p = torch.nn.Parameter(torch.randn(64, 32, 64))
        opt = Muon([p], lr=0.01, ns_chunk_bytes=chunk_bytes, ns_emulate=emulate)
        p.grad = torch.randn(64, 32, 64)
        opt.step()                                      # momentum state exists before measuring
        p.grad = torch.randn(64, 32, 64)
        tracker = MemTracker()
        with tracker:
            opt.step()
        return int(sum(v["Total"] for v in tracker.get_tracker_snapshot("peak").values()))

    stack_bytes, chunk_bytes = 64 * 32 * 64 * 4, 4 * 32 * 64 * 4
    resident = 3 * stack_bytes                          # parameter, gradient, momentum (tracked too)
    unbounded, bounded = peak(1 << 40) - resident, peak(chunk_bytes) - resident
    assert unbounded > stack_bytes                      # the whole stack's update is live at once
    assert bounded < chunks * chunk_bytes < unbounded / 2, (bounded, unbounded)


def _dist_chunk_worker(rank: int, world: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from rungs.parallel.dist_muon import DistMuon

    mesh = init_device_mesh("cpu", (world,))
    specs = [((5, 8, 6), Shard(1)), ((8, 6), Shard(0)), ((4, 8, 6), Shard(0)), ((3, 8, 6), None), ((8, 6), None)]
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.9, adjust_lr="match_rms_adamw", comm_dtype=torch.float32,
              ns_dtype=None)
    results = []
    one = ns_working_bytes((8, 6), torch.float32)                         # fp32 Newton-Schulz (ns_dtype=None)
    for chunk_bytes in (None, one, 3 * one):                             # one batch; 1 and 3 matrices a batch
        torch.manual_seed(0)
        fulls = [torch.randn(shape) for shape, _ in specs]
        params = [torch.nn.Parameter(distribute_tensor(f.clone(), mesh, [pl]) if pl else f.clone())
                  for f, (_, pl) in zip(fulls, specs)]
        opt = DistMuon(params, ns_chunk_bytes=chunk_bytes, **kw)
        gen = torch.Generator().manual_seed(1)
        for _ in range(2):
            for p, (shape, pl) in zip(params, specs):
                g = torch.randn(shape, generator=gen)
                p.grad = distribute_tensor(g, mesh, [pl]) if pl else g
            opt.step()
        results.append([p.full_tensor() if pl else p.detach() for p, (_, pl) in zip(params, specs)])
        if chunk_bytes is not None:
            assert max(len(b.matrices) for b in opt.plan()) == chunk_bytes // one
    assert len(opt.plan()) > 3                                           # the cut made more batches
    for chunked in results[1:]:
        for a, b in zip(results[0], chunked):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    dist.barrier()


def test_dist_muon_in_bounded_batches_equals_one_batch():
    """3 gloo ranks, row-sharded, expert-sharded and replicated stacks of one matrix shape: batches
    of 1 and 3 matrices give the parameters of one batch."""
    from tests.rungs.parallel.spawn import run_ranks

    run_ranks(_dist_chunk_worker, 3)


# --- bf16 Newton-Schulz emulated in float32 on CPU (rungs.muon._rounded_newton_schulz) -----------------

EMULATION_SHAPES = [(96, 96), (40, 24), (3, 24, 40), (8, 48, 48)]


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 values lie between a and b (both bf16), elementwise, via their ordered int16 bits."""
    def ordered(t):
        i = t.view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -32768 - i, i)
    return (ordered(a) - ordered(b)).abs()


def test_newton_schulz_on_cpu_emulates_bf16_only_without_bf16_units():
    G = torch.randn(3, 24, 40, generator=torch.Generator().manual_seed(0))
    auto = newton_schulz(G)
    assert auto.dtype == torch.bfloat16
    assert torch.equal(auto, newton_schulz(G, emulate=not cpu_has_bf16_units()))
    assert torch.equal(newton_schulz(G, dtype=torch.float32), newton_schulz(G, dtype=torch.float32, emulate=True))


def _cpuinfo_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def test_bf16_units_are_what_the_kernel_reports():
    """torch's dispatch view of the CPU against the kernel's: AVX512-BF16 or AMX (the tiles come with
    AMX-BF16 on every CPU that has them) in /proc/cpuinfo's flags."""
    flags = _cpuinfo_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo on this OS")
    assert cpu_has_bf16_units() == bool({"avx512_bf16", "amx_tile"} & flags), sorted(f for f in flags if "bf16" in f or "amx" in f)


@pytest.mark.parametrize("shape", EMULATION_SHAPES)
def test_one_emulated_step_rounds_where_native_bf16_does(shape):
    """One iteration: each op's float32 sums round once to bf16 as the native GEMM's do, so values are
    equal but for the sum order inside a product (measured: 0-0.1% of values one unit apart)."""
    G = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    native, emulated = (newton_schulz(G, steps=1, emulate=e) for e in (False, True))
    apart = _ulps_apart(native, emulated)
    assert apart.max() <= 1
    assert apart.float().mean() <= 0.01


@pytest.mark.parametrize("shape", EMULATION_SHAPES)
def test_emulated_newton_schulz_is_as_accurate_as_native_bf16(shape):
    """Five iterations in bf16 amplify a one-unit difference (after five, a third of the values differ
    between the two paths, as between two summation orders), so the paths are compared by their
    error against the same iteration in float64: the emulated one is no worse."""
    G = torch.randn(shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    exact = newton_schulz(G, dtype=None)
    err = {e: (newton_schulz(G, emulate=e).double() - exact).norm() / exact.norm() for e in (False, True)}
    assert err[True] <= 1.5 * err[False] + 1e-3, err
    assert err[True] < 0.05


def test_muon_on_cpu_tracks_torch_optim_muon_within_bf16_rounding():
    """The emulated path (the default on CPUs without bf16 units, forced here so every host tests it)
    against torch.optim.Muon's native bf16 for 4 steps: each step's update moves by at most a few bf16
    roundings of a unit-scale entry."""
    g = torch.Generator().manual_seed(0)
    shapes = [(16, 32), (32, 16), (24, 24)]
    init = [torch.randn(s, generator=g) for s in shapes]
    ours = [torch.nn.Parameter(p.clone()) for p in init]
    ref = [torch.nn.Parameter(p.clone()) for p in init]
    opt = Muon(ours, lr=0.02, weight_decay=0.1, adjust_lr="original", ns_emulate=True)
    torch_opt = torch.optim.Muon(ref, lr=0.02, weight_decay=0.1, adjust_lr_fn="original")
    steps = 4
    for _ in range(steps):
        for a, b in zip(ours, ref):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        opt.step()
        torch_opt.step()
    for (m, n), a, b in zip(shapes, ours, ref):
        bound = steps * 0.02 * math.sqrt(max(1, m / n)) * 4 * 2.0 ** -8
        assert (a - b).abs().max() <= bound


# --- the step's passes: the same values as the plain algorithm, fewer kernels -----------------------

def _plain_muon_step(params, bufs, lr, wd, mu, emulate):
    """Muon as written before the passes were merged: float32 Nesterov updates, one concatenated
    float32 batch per shape, cast by newton_schulz, decay, scaled add; one batch per shape."""
    by_shape = {}
    for p, b in zip(params, bufs):
        by_shape.setdefault(tuple(p.shape[-2:]), []).append((p, b))
    for shape, members in by_shape.items():
        for p, b in members:
            b.lerp_(p.grad, 1 - mu)
        updates = [p.grad.lerp(b, mu) for p, b in members]
        lone = len(members) == 1 and members[0][0].ndim == 2
        batch = updates[0] if lone else torch.cat([u.reshape(-1, *shape) for u in updates])
        out = newton_schulz(batch, emulate=emulate)
        sizes = [u.numel() // (shape[0] * shape[1]) for u in updates]
        for (p, _), o in zip(members, [out] if lone else out.split(sizes)):
            p.mul_(1 - lr * wd).add_(o.reshape(p.shape).float(), alpha=-0.2 * math.sqrt(max(shape)) * lr)


@pytest.mark.parametrize("emulate", [True, False])
def test_the_merged_passes_give_the_plain_algorithms_values_bit_for_bit(emulate):
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 8, 16), (8, 16), (12, 8), (3, 16, 8), (6, 6)]
    init = [torch.randn(s, generator=g) for s in shapes]
    ours = [torch.nn.Parameter(t.clone()) for t in init]
    plain = [t.clone() for t in init]
    plain_bufs = [torch.zeros_like(t) for t in init]
    opt = Muon(ours, lr=0.02, weight_decay=0.1, momentum=0.9, ns_emulate=emulate)
    for _ in range(3):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, q, gr in zip(ours, plain, grads):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt.step()
        with torch.no_grad():
            _plain_muon_step(plain, plain_bufs, 0.02, 0.1, 0.9, emulate)
    for p, q, b, bq in zip(ours, plain, [opt.state[p]["momentum_buffer"] for p in ours], plain_bufs):
        assert torch.equal(p.detach(), q) and torch.equal(b, bq)


def test_the_step_writes_the_update_once_in_bf16_and_concatenates_nothing():
    """Counted on fake tensors at an expert stack's shape: one float32 momentum pass, the Nesterov
    update written straight into the bf16 batch, no concatenation, no cast of the batch; the bytes
    moved besides the GEMMs per matrix element, baddbmm's input copies included (85 here; 103 with
    the float32 concatenation, its cast and a |X| pass), stay under 90."""
    from rungs.op_census import count_fake

    def setup():
        params = [torch.nn.Parameter(torch.empty(s)) for s in ((16, 32, 48), (16, 32, 48), (16, 48, 32))]
        for p in params:
            p.grad = torch.empty_like(p)
        opt = Muon(params, lr=0.01, weight_decay=0.1, ns_emulate=False)
        for p in params:
            opt.state[p]["momentum_buffer"] = torch.empty_like(p)
        return opt

    census = count_fake(setup, lambda opt: opt.step())
    elements = 3 * 16 * 32 * 48
    names = [r.name for r in census.records]
    assert "cat" not in names and not [r for r in census.records if r.category == "cast" and r.bytes > 1024]
    assert [r.dtypes for r in census.records if r.name == "lerp"] == [("float32", "float32", "bfloat16")] * 3
    between = sum(r.bytes for r in census.records if r.category != "gemm")
    assert between / elements < 90, between / elements


def test_the_batch_is_sized_by_the_newton_schulz_budget():
    from rungs.muon import NS_CHUNK_BYTES, ns_budget_bytes, ns_matrices_per_chunk

    per_matrix = ns_working_bytes((768, 768), torch.bfloat16)
    assert per_matrix == (2 * 768 * 768 + 2 * 768 * 768) * 2
    assert ns_working_bytes((64, 256), torch.bfloat16) == (2 * 64 * 256 + 2 * 64 * 64) * 2   # Gram on the short side
    assert ns_matrices_per_chunk((768, 768), torch.bfloat16, 7 * 10**9) == 7 * 10**9 // per_matrix == 1483
    assert ns_matrices_per_chunk((768, 768), torch.bfloat16, 1) == 1
    assert ns_budget_bytes("cpu") == NS_CHUNK_BYTES
    with pytest.raises(MuonConfigError, match="budget"):
        ns_matrices_per_chunk((4, 4), torch.bfloat16, 0)
