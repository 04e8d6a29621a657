"""Sharded gradient accumulation takes each rank's share of every one-process micro-batch
(rungs.parallel.distributed.rank_rows), so the load-balancing loss, whose expert fractions the ranks all-reduce
per micro-batch, is taken over the one-process micro-batch's tokens: the gradient of a 2-rank step with two
micro-batches equals the one-process step's (a contiguous half of the batch per rank, cut in two, put rows of
both micro-batches into each and moved the router's gradient by 58%)."""

from __future__ import annotations

import pytest
import torch

from rungs.model import Transformer
from rungs.parallel.distributed import DistributedError, parallelize, rank_rows, setup, train_step
from rungs.router import load_balancing_loss
from tests.rungs.parallel.spawn import run_ranks
from tests.rungs.parallel.test_distributed_train import CFG

LB, BATCH, MICRO_BATCHES = 0.5, 8, 2


def test_each_rank_takes_its_share_of_every_micro_batch():
    assert rank_rows(8, 2, 0, 2) == [0, 1, 4, 5] and rank_rows(8, 2, 1, 2) == [2, 3, 6, 7]
    assert rank_rows(8, 1, 1, 2) == [4, 5, 6, 7]  # one micro-batch: the contiguous half, as before
    together = sorted(r for rank in range(4) for r in rank_rows(24, 3, rank, 4)[2:4])  # every rank's 2nd micro-batch
    assert together == list(range(8, 16))
    with pytest.raises(DistributedError, match="does not split"):
        rank_rows(8, 3, 0, 2)


class GradientProbe:
    """Stands where the optimizer steps: keeps the gradients the step reduced (the optimizer is not tested here)."""

    def __init__(self, model) -> None:
        self.model, self.grads = model, {}

    def step(self) -> None:
        from torch.distributed.tensor import DTensor

        self.grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                      for n, p in self.model.named_parameters() if p.grad is not None}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)


def _one_process(batch: torch.Tensor) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = Transformer(CFG)
    micro = BATCH // MICRO_BATCHES
    for m in range(MICRO_BATCHES):
        rows = slice(m * micro, (m + 1) * micro)
        ce, routes = model(batch[rows, :-1], batch[rows, 1:])
        ((ce + LB * load_balancing_loss(routes, CFG.n_experts, CFG.top_k)) / MICRO_BATCHES).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _worker(rank: int, world: int) -> None:
    par = setup(world, 1)
    batch = torch.randint(0, CFG.vocab_size, (BATCH, CFG.seq_len + 1), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    model = parallelize(Transformer(CFG), par)
    probe = GradientProbe(model)
    rows = rank_rows(BATCH, MICRO_BATCHES, rank, world)
    train_step(model, probe, par, batch[rows, :-1], batch[rows, 1:], n_experts=CFG.n_experts, top_k=CFG.top_k,
               lb_loss_coef=LB, micro_batches=MICRO_BATCHES, rows=rows)
    ref = _one_process(batch)
    for name, r in ref.items():
        rel = float((probe.grads[name] - r).norm() / r.norm())
        assert rel < 1e-5, f"rank {rank} {name}: relative error {rel:.2e}"


def test_two_ranks_accumulating_two_micro_batches_with_the_balancing_loss_equal_one_process():
    run_ranks(_worker, 2)
