"""Multi-process JAX: one job over several processes (e.g. the Ray workers of one trial).

Every process calls `initialize` before anything touches a JAX device; afterwards `jax.devices()`
lists the devices of every process and a `rungs.jaxjob.sharding.make_mesh` over them spans the
processes: the compiled step is the same program, and XLA's collectives cross the processes
(gloo over TCP on CPU, NCCL on GPU). Each process runs the same Python (multi-controller JAX): the
same sampler stream (same seed), the same calls, so host arrays put on the global mesh agree.

    initialize("127.0.0.1:47000", num_processes=2, process_id=rank, cpu_devices=2)
    mesh = make_mesh(data=2, expert=2)          # 4 devices, 2 in each process
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

__all__ = ["DistributedJaxError", "ProcessGroup", "initialize"]


class DistributedJaxError(RuntimeError):
    """A multi-process JAX job that cannot start (bad sizes, JAX already running)."""


@dataclass(frozen=True)
class ProcessGroup:
    process_id: int
    num_processes: int
    local_devices: int
    global_devices: int

    @property
    def is_main(self) -> bool:
        return self.process_id == 0


def initialize(coordinator_address: str, num_processes: int, process_id: int, *,
               cpu_devices: int | None = None, timeout_seconds: int = 300) -> ProcessGroup:
    """Join the job: `jax.distributed.initialize` with the coordinator (process 0's host:port).

    `cpu_devices`: host devices this process exposes when it runs on CPU (`jax_num_cpu_devices`;
    must be set before JAX starts its backend). CPU collectives use gloo."""
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise DistributedJaxError(f"process_id={process_id} must be in [0, num_processes={num_processes})")
    if cpu_devices is not None:
        if cpu_devices < 1:
            raise DistributedJaxError(f"cpu_devices must be >= 1, got {cpu_devices}")
        jax.config.update("jax_num_cpu_devices", cpu_devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, initialization_timeout=timeout_seconds)
    return ProcessGroup(jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())
