"""The sharded PyTorch job honours the config's `device` and `deterministic`, as the one-process job does: it
picked CUDA whenever torch saw a GPU (and trained on the CPU under `device=cuda`), and never turned
deterministic algorithms on."""

from __future__ import annotations

import pytest
import torch

from rungs.config import TrainConfigError
from tests.rungs.parallel.spawn import run_ranks
from tests.rungs.train_helpers import tiny_config


def _sharded(rank, world, cfg, run_dir):
    from rungs.parallel.launch import train_sharded

    assert not torch.are_deterministic_algorithms_enabled()
    train_sharded(cfg, run_dir=run_dir, progress=False)
    assert torch.are_deterministic_algorithms_enabled()  # deterministic=True, applied on every rank


def test_deterministic_is_applied_on_every_rank(tmp_path):
    run_ranks(_sharded, 2, tiny_config(deterministic=True, max_steps=1, n_layers=1, warmup_steps=1), tmp_path / "run")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")
def test_device_cuda_without_a_gpu_is_refused_before_the_job_joins(tmp_path):
    from rungs.parallel.launch import train_sharded

    import torch.distributed as dist

    with pytest.raises(TrainConfigError, match="device is cuda but torch sees no GPU"):
        train_sharded(tiny_config(device="cuda", max_steps=1, n_layers=1, warmup_steps=1), run_dir=tmp_path / "run")
    assert not dist.is_initialized()
