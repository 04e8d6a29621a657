"""Sharded (DCP) checkpoints resume exactly, also onto a different number of workers and layout.

4 gloo ranks (dp=2 × ep=2) train two steps and save; 2 ranks (dp=1 × ep=2, then dp=2 × ep=1)
load and train the third step. Parameters must equal the uninterrupted single-process run within
1e-5 relative (FP32 communication), which needs the Muon momentum and both Adam moments restored.
"""

from __future__ import annotations

import pytest
import torch

from rungs.parallel import dist_checkpoint
from rungs.parallel.distributed import build_optimizer, parallelize, setup, train_step
from rungs.model import Transformer
from tests.rungs.parallel.spawn import run_ranks
from tests.rungs.parallel.test_distributed_train import CFG, CLIP, LB, LR, SEQS_PER_RANK, WD, _batches, _compare, _single, _whole


def _job(rank: int, world: int, dp: int, ep: int, steps: range, ckpt, load: bool, save: bool):
    par = setup(dp, ep)
    torch.manual_seed(123 if load else 0)  # resumed jobs start elsewhere: all must come from the checkpoint
    model = parallelize(Transformer(CFG), par)
    opt = build_optimizer(model, par, lr=LR, weight_decay=WD, comm_dtype=torch.float32, ns_dtype=None)
    if load:
        extra = dist_checkpoint.load(ckpt, model, opt, par)
        assert extra == {"step": steps.start}
    rows = slice(rank * SEQS_PER_RANK * 4 // world, (rank + 1) * SEQS_PER_RANK * 4 // world)
    batches = _batches(4)  # the global batch of the 4-rank run, split over however many ranks
    for step in steps:
        train_step(model, opt, par, batches[step][rows, :-1], batches[step][rows, 1:], n_experts=CFG.n_experts,
                   top_k=CFG.top_k, lb_loss_coef=LB, grad_clip=CLIP)
    if save:
        dist_checkpoint.save(ckpt, model, opt, par, extra={"step": steps.stop})
    return {n: _whole(p, par, ep) for n, p in model.named_parameters()}


def _first(rank, world, ckpt):
    _job(rank, world, 2, 2, range(0, 2), ckpt, load=False, save=True)


def _resume(rank, world, ckpt):
    ref = {k: v for k, v in _single(4, None).items() if not k.startswith("grad")}
    for dp, ep in ((1, 2), (2, 1)):
        got = _job(rank, world, dp, ep, range(2, 3), ckpt, load=True, save=False)
        _compare(rank, got, ref, torch.float32, f"resumed on dp={dp} ep={ep}")


def test_resume_on_fewer_workers_and_another_layout_equals_uninterrupted(tmp_path):
    ckpt = tmp_path / "step2"
    run_ranks(_first, 4, ckpt)
    assert (ckpt / dist_checkpoint.EXTRA_FILE).is_file() and not (tmp_path / "step2.tmp").exists()
    run_ranks(_resume, 2, ckpt)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(dist_checkpoint.DistCheckpointError, match="no complete distributed checkpoint"):
        dist_checkpoint.load(tmp_path / "nothing", None, None, None)


class _CreatesAFile:
    """A hostile `.metadata`: unpickling it calls open(path, "w")."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _save_small(rank, world, ckpt):
    _job(rank, world, 2, 1, range(0, 1), ckpt, load=False, save=True)


def _load_crafted(rank, world, ckpt, marker):
    par = setup(2, 1)
    model = parallelize(Transformer(CFG), par)
    opt = build_optimizer(model, par, lr=LR, weight_decay=WD, comm_dtype=torch.float32, ns_dtype=None)
    with pytest.raises(dist_checkpoint.DistCheckpointError, match="refusing to unpickle"):
        dist_checkpoint.load(ckpt, model, opt, par)
    assert not marker.exists()


def test_a_crafted_metadata_file_is_refused_and_never_executed(tmp_path):
    import pickle

    ckpt, marker = tmp_path / "ckpt", tmp_path / "pwned"
    run_ranks(_save_small, 2, ckpt)
    (ckpt / ".metadata").write_bytes(pickle.dumps(_CreatesAFile(marker)))  # stock DCP would pickle.load it
    run_ranks(_load_crafted, 2, ckpt, marker)
    assert not marker.exists()
