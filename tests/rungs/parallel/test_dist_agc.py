"""Activation gradient clipping in a sharded step equals the single-process step.

2 gloo ranks (data parallel, then expert parallel) against one process on the whole batch, with a
fixed threshold set between the typical and the largest per-token gradient norms so that some tokens
clip and most do not. A rank's loss is the mean over its own tokens, so its activation gradients are
`world` × the single-process ones and the sharded threshold is scaled by the worker count (what
`rungs.launch` does). The clip rate is gathered over the ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rungs.agc import ActivationGradClipper, AGCSettings
from rungs.parallel.distributed import build_optimizer, parallelize, setup, train_step
from rungs.model import Transformer
from rungs.optim import build_optimizer as single_optimizer
from rungs.optim import clip_grad_norm_
from tests.rungs.parallel.spawn import run_ranks
from tests.rungs.parallel.test_distributed_train import CFG, CLIP, LR, SEQS_PER_RANK, WD, _batches, _whole


def _threshold(world: int) -> float:
    """Between the median and the largest per-token norm at the first step (single process)."""
    torch.manual_seed(0)
    model = Transformer(CFG)
    norms = []
    probe = ActivationGradClipper(AGCSettings(mode="fixed", threshold=1e30))
    probe._clip = lambda grad, layer, point: (norms.append(grad.float().norm(dim=-1).flatten()), grad)[1]
    model.activation_clip = probe
    batch = _batches(world)[0]
    logits, _ = model(batch[:, :-1])
    F.cross_entropy(logits.view(-1, logits.size(-1)), batch[:, 1:].reshape(-1)).backward()
    all_norms = torch.cat(norms)
    return float(torch.quantile(all_norms, 0.9))


def _single(world: int, thr: float):
    torch.manual_seed(0)
    model = Transformer(CFG)
    clipper = ActivationGradClipper(AGCSettings(mode="fixed", threshold=thr))
    model.activation_clip = clipper
    opt = single_optimizer(model, lr=LR, weight_decay=WD)
    opt.muon.ns_dtype = None
    rates = []
    for step, batch in enumerate(_batches(world)):
        clipper.begin_step(step)
        clipper.begin_micro_batch(batch[:, :-1])
        logits, _ = model(batch[:, :-1])
        F.cross_entropy(logits.view(-1, logits.size(-1)), batch[:, 1:].reshape(-1)).backward()
        clip_grad_norm_(model, CLIP)
        opt.step()
        opt.zero_grad()
        rates.append(clipper.end_step())
    return {n: p.detach() for n, p in model.named_parameters()}, rates


def _sharded(rank: int, world: int, dp: int, ep: int, thr: float):
    par = setup(dp, ep)
    torch.manual_seed(0)
    model = parallelize(Transformer(CFG), par)
    clipper = ActivationGradClipper(AGCSettings(mode="fixed", threshold=thr * par.world))
    model.activation_clip = clipper
    opt = build_optimizer(model, par, lr=LR, weight_decay=WD, comm_dtype=torch.float32, ns_dtype=None)
    rows = slice(rank * SEQS_PER_RANK, (rank + 1) * SEQS_PER_RANK)

    def all_gather(obj):
        out = [None] * par.world
        dist.all_gather_object(out, obj)
        return out

    rates = []
    for step, batch in enumerate(_batches(world)):
        clipper.begin_step(step)
        train_step(model, opt, par, batch[rows, :-1], batch[rows, 1:], n_experts=CFG.n_experts, top_k=CFG.top_k,
                   grad_clip=CLIP, clipper=clipper, row_offset=rows.start)
        clipper.synchronise(all_gather)
        rates.append(clipper.end_step())
    return {n: _whole(p, par, ep) for n, p in model.named_parameters()}, rates


def _worker(rank: int, world: int) -> None:
    thr = _threshold(world)
    ref, ref_rates = _single(world, thr)
    assert 0 < ref_rates[0] < 0.5  # some tokens clip, most do not
    for dp, ep in ((2, 1), (1, 2)):
        got, rates = _sharded(rank, world, dp, ep, thr)
        assert rates == ref_rates, f"dp={dp} ep={ep}: clip rates {rates} vs {ref_rates}"
        for name, r in ref.items():
            rel = float((got[name] - r).norm() / r.norm())
            assert rel < 1e-5, f"rank {rank} dp={dp} ep={ep} {name}: relative error {rel:.2e}"


def test_sharded_agc_equals_single_process_and_clips_the_same_tokens():
    run_ranks(_worker, 2)
