"""Distributed Muon (all-to-all resharding) equals single-process Muon on the same gradients.

Real gloo processes. Shapes are chosen so that rows do not divide the world size and some ranks
hold empty shards; 3-D expert stacks are sharded on rows and on the expert dim; two replicated
routers take the owner-computes + all-gather path. The reference is a float64 loop written here.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from rungs.parallel.dist_muon import DistMuon, DistMuonError
from tests.rungs.parallel.spawn import run_ranks

COEFFS = (3.4445, -4.7750, 2.0315)
LR, WD, MOMENTUM = 0.05, 0.1, 0.9

# (shape, placement): None = a plain replicated tensor (the router)
SPECS = [((5, 7), Shard(0)), ((2, 6), Shard(0)), ((7, 3), Shard(0)), ((5, 7), Shard(0)),
         ((4, 6, 5), Shard(1)), ((3, 4, 4), Shard(0)), ((4, 5), None), ((4, 5), None)]


def reference_ns(x: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Quintic Newton–Schulz in float64 on a batch of matrices, returned in the input dtype."""
    y = x.double()
    tall = y.shape[-2] > y.shape[-1]
    if tall:
        y = y.mT
    y = y / y.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-30)
    a, b, c = COEFFS
    for _ in range(steps):
        gram = y @ y.mT
        y = a * y + (b * gram + c * gram @ gram) @ y
    return (y.mT if tall else y).to(x.dtype)


def scale(lr: float, shape: tuple[int, int]) -> float:
    return 0.2 * math.sqrt(max(shape)) * lr


def reference_muon(fulls, grads_per_step, comm_dtype):
    """Single-process Muon: EMA momentum + Nesterov, NS per matrix, decoupled WD (float64 state)."""
    params = [f.double().clone() for f in fulls]
    bufs = [torch.zeros_like(p) for p in params]
    for grads in grads_per_step:
        for p, buf, g in zip(params, bufs, grads):
            g = g.double()
            buf.lerp_(g, 1 - MOMENTUM)
            u = g.lerp(buf, MOMENTUM).to(comm_dtype)
            batch = u if u.ndim == 3 else u[None]
            o = torch.stack([reference_ns(mat) for mat in batch]).to(comm_dtype)
            o = o if u.ndim == 3 else o[0]
            p.mul_(1 - LR * WD).add_(o.double(), alpha=-scale(LR, tuple(p.shape[-2:])))
    return params


def _grads(step: int, specs) -> list[torch.Tensor]:
    """The same gradients on every rank (and in the reference), scales from 1e-4 to 1e3."""
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=gen) * 10.0 ** (i - 4) for i, (shape, _) in enumerate(specs)]


def _run_dist(mesh, specs, make_opt) -> tuple[list, list]:
    torch.manual_seed(0)
    fulls = [torch.randn(shape) for shape, _ in specs]
    params = [torch.nn.Parameter(distribute_tensor(f.clone(), mesh, [pl]) if pl else f.clone())
              for f, (_, pl) in zip(fulls, specs)]
    opt = make_opt(params)
    steps = []
    for step in range(3):
        steps.append(_grads(step, specs))
        for p, g, (_, pl) in zip(params, steps[-1], specs):
            p.grad = distribute_tensor(g, mesh, [pl]) if pl else g.clone()
        opt.step()
    return params, fulls, steps


def _single_process(fulls, steps, make_opt) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(f.clone()) for f in fulls]
    opt = make_opt(params)
    for grads in steps:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params]


def _worker(rank: int, world: int, comm_dtype: torch.dtype) -> None:
    mesh = init_device_mesh("cpu", (world,))
    params, fulls, steps = _run_dist(mesh, SPECS, lambda ps: DistMuon(
        ps, lr=LR, weight_decay=WD, momentum=MOMENTUM, nesterov=True, adjust_lr=scale,
        comm_dtype=comm_dtype, orthogonalize=reference_ns))
    ref = reference_muon(fulls, steps, comm_dtype)
    # rows of (2, 6) over 3-4 ranks and experts of (3, 4, 4) over 4 ranks leave some shards empty
    empty = torch.tensor(sum(p.to_local().numel() == 0 for p, (_, pl) in zip(params, SPECS) if pl))
    dist.all_reduce(empty)
    assert empty.item() > 0 or world < 3
    for (shape, pl), p, r in zip(SPECS, params, ref):
        got = p.full_tensor() if pl else p.detach()
        assert got.shape == r.shape
        if comm_dtype == torch.float32:
            rel = (got.double() - r).norm() / r.norm()
            assert rel < 1e-5, f"rank {rank} {shape} {pl}: relative error {rel:.2e}"
        else:  # each step's update moves by at most one bf16 rounding of a unit-scale entry
            bound = 3 * scale(LR, tuple(shape[-2:])) * 2.0 ** -7
            err = (got.double() - r).abs().max()
            assert err <= bound, f"rank {rank} {shape} {pl}: max error {err:.2e} > {bound:.2e}"
    # the replicated routers stay identical on every rank
    for p, (_, pl) in zip(params, SPECS):
        if pl is None:
            gathered = [torch.empty_like(p.detach()) for _ in range(world)]
            dist.all_gather(gathered, p.detach())
            assert all(torch.equal(gathered[0], t) for t in gathered)
    if comm_dtype == torch.float32:  # the project's single-process Muon, NS in fp32 on both sides
        from rungs.muon import Muon

        kw = dict(lr=LR, weight_decay=WD, momentum=MOMENTUM, nesterov=True, adjust_lr="match_rms_adamw",
                  ns_dtype=None)
        params, fulls, steps = _run_dist(mesh, SPECS, lambda ps: DistMuon(ps, comm_dtype=torch.float32, **kw))
        ref = _single_process(fulls, steps, lambda ps: Muon(ps, **kw))
        for (shape, pl), p, r in zip(SPECS, params, ref):
            got = p.full_tensor() if pl else p.detach()
            rel = (got - r).norm() / r.norm()
            assert rel < 1e-5, f"rank {rank} {shape} {pl} vs rungs.muon.Muon: relative error {rel:.2e}"
    else:  # torch.optim.Muon (2-D only, NS in bf16) with BF16 communication
        specs = [s for s in SPECS if len(s[0]) == 2]
        kw = dict(lr=LR, weight_decay=WD, momentum=MOMENTUM, nesterov=True)
        params, fulls, steps = _run_dist(mesh, specs, lambda ps: DistMuon(ps, adjust_lr="original", **kw))
        ref = _single_process(fulls, steps, lambda ps: torch.optim.Muon(ps, **kw))
        for (shape, pl), p, r in zip(specs, params, ref):
            got = p.full_tensor() if pl else p.detach()
            bound = 3 * LR * math.sqrt(max(1, shape[0] / shape[1])) * 2.0 ** -6
            err = (got - r).abs().max()
            assert err <= bound, f"rank {rank} {shape} vs torch.optim.Muon: max error {err:.2e} > {bound:.2e}"


def test_dist_muon_matches_single_process_fp32_comm():
    """4 ranks: (5, 7) splits 2/2/1/0 rows, (2, 6) 1/1/0/0, the (3, 4, 4) stack 1/1/1/0 experts."""
    run_ranks(_worker, 4, torch.float32)


def test_dist_muon_matches_single_process_bf16_comm():
    run_ranks(_worker, 2, torch.bfloat16)


def test_reference_ns_orthogonalises():
    """The test's own reference must do what NS does: singular values pushed into ~[0.5, 1.5]."""
    x = torch.randn(6, 9, dtype=torch.float64)
    s = torch.linalg.svdvals(reference_ns(x))
    assert s.min() > 0.5 and s.max() < 1.5


def test_rejects_vectors_and_multi_dim_meshes():
    with pytest.raises(DistMuonError, match="2-D matrices"):
        DistMuon([torch.nn.Parameter(torch.zeros(4))], orthogonalize=reference_ns, adjust_lr=scale).plan()
