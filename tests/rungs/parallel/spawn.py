"""Run a function in N real gloo processes (CPU): the harness every distributed test uses.

Each process gets one intra-op thread (the CI machine has two cores shared by many jobs), a fresh
port from the OS, and the same seed; a failure in any rank fails the test with that rank's traceback.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world: int, *args: Any) -> None:
    """Call `fn(rank, world, *args)` in `world` gloo processes; raise if any rank fails.

    Processes come from a fork server that has imported torch and the distributed modules once:
    each rank starts in well under a second instead of re-importing torch (a fresh interpreter per
    rank costs seconds on a loaded two-core machine), without forking the test process itself
    (whose thread pools may be in use)."""
    mp.start_processes(_entry, args=(world, free_port(), fn, args), nprocs=world, join=True,
                       start_method="forkserver")


# What the ranks import, once: the sharded job's modules and MLflow, which every rank of a tracked job
# imports (`rungs.tracking`; ~1.6 CPU-seconds a process). None of them starts a thread (a fork would copy it
# half-way); JAX and Ray stay out.
_PRELOAD = ["torch", "torch.distributed", "rungs.parallel.distributed", "rungs.parallel.expert_parallel", "rungs.parallel.dist_muon",
            "rungs.model", "rungs.launch", "mlflow", "mlflow.tracking", "tests.rungs.parallel.spawn"]
mp.set_forkserver_preload(_PRELOAD)
