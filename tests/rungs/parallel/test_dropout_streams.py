"""Dropout in the sharded job: every rank masks its sequences from a stream of its own (they all walk the one
weight stream first, and each drew rank 0's masks), and a checkpoint carries each rank's generator state, so a
job resumed with dropout trains the losses the uninterrupted job does (it drew from the bare seed after a
resume). Real gloo processes on the tiny cpu-demo L3 config."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.rungs.parallel.spawn import run_ranks
from tests.rungs.train_helpers import tiny_config


def _masks(rank: int, world: int) -> None:
    from rungs.config import parse_config
    from rungs.parallel.distributed import setup
    from rungs.parallel.engine import ShardedTorchEngine

    cfg = parse_config(tiny_config(max_steps=3, precision="fp32", dropout=0.1))
    engine = ShardedTorchEngine(cfg, setup(ep=1, device_type="cpu"), comm_dtype=torch.float32)
    engine.build()
    mask = engine.model.drop(torch.ones(cfg.batch_sequences // world, cfg.seq_len, cfg.architecture().d_model)) == 0
    every = [torch.empty_like(mask) for _ in range(world)]
    dist.all_gather(every, mask)
    assert 0.05 < float(mask.float().mean()) < 0.15
    assert not torch.equal(every[0], every[1])


def test_each_rank_draws_its_own_dropout_masks():
    run_ranks(_masks, 2)


def _resume(rank: int, world: int, out: str) -> None:
    from rungs.parallel.launch import train_sharded

    cfg = tiny_config(max_steps=3, precision="fp32", dropout=0.1, eval_batch_size=128)
    whole = train_sharded(cfg, run_dir=f"{out}/whole", comm_dtype=torch.float32)
    train_sharded(cfg, run_dir=f"{out}/resumed", comm_dtype=torch.float32, stop_after=1)
    resumed = train_sharded(cfg, run_dir=f"{out}/resumed", comm_dtype=torch.float32)
    assert resumed.losses == whole.losses, (resumed.losses, whole.losses)


def test_a_job_with_dropout_resumes_to_the_losses_of_the_uninterrupted_job(tmp_path):
    run_ranks(_resume, 2, str(tmp_path))
