"""How the JAX engine lays a rung over devices: a `Mesh` with a data axis and an expert axis.

- Dense parameters are FSDP-style: each 2-D (or higher) tensor is split along its first dimension
  over the `data` axis where that dimension divides, else replicated; XLA gathers it for the
  matmul and reduce-scatters its gradient (GSPMD inserts the collectives from the annotations).
- Expert stacks (E, ., .) are split over the `expert` axis along E: each device of an expert
  column holds E / expert experts.
- The batch is split over both axes (data x expert), rows first.
- The optimizer state follows its parameters (optax states are built from sharded parameters
  under jit, so GSPMD propagates the layout); Muon's Newton-Schulz runs on the gathered matrices.

Traced under `use_mesh(mesh)` (the engine compiles its step so), two parts leave GSPMD's
defaults: the routed experts run as expert parallelism in `shard_map` with fixed-size all-to-all
buffers (`rungs.jaxjob.expert_parallel`: one round plan per EP group, i.e. per data row), and Muon
orthogonalises whole matrices on their owners (`rungs.jaxjob.muon`: dense matrices round-robin over
all devices, expert stacks where their experts live, their layers split over the data axis).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

__all__ = ["DATA", "EXPERT", "MeshError", "active_mesh", "use_mesh", "make_mesh", "default_expert_axis", "param_spec",
           "param_shardings", "shard_params", "batch_sharding", "replicated", "describe"]

DATA, EXPERT = "data", "expert"


class MeshError(ValueError):
    """A mesh that does not fit the devices or the rung."""


def make_mesh(data: int, expert: int = 1, devices: list | None = None) -> Mesh:
    """A (data, expert) mesh over the first data x expert devices."""
    devices = list(jax.devices() if devices is None else devices)
    if data < 1 or expert < 1 or data * expert > len(devices):
        raise MeshError(f"mesh ({data}, {expert}) needs {data * expert} devices; {len(devices)} available")
    return Mesh(np.array(devices[: data * expert]).reshape(data, expert), (DATA, EXPERT))


def default_expert_axis(devices: int, n_experts: int, group_size: int | None = None) -> int:
    """The expert axis a trial gets when its config does not set one: the largest size that divides
    the device count and n_experts (and leaves whole router groups on each device, else
    `rungs.jaxjob.expert_parallel.fits` would refuse the layout and the experts would run un-split).
    Expert parallelism first because the expert stacks are most of an MoE rung's parameters and
    optimizer state: split over the expert axis each device holds 1/P of them, where the data axis
    only splits the dense part (FSDP) and the batch."""
    for size in range(min(devices, n_experts), 0, -1):
        if devices % size or n_experts % size:
            continue
        local = n_experts // size
        if group_size is not None and local % min(group_size, local):  # as expert_parallel.ep_layout
            continue
        return size
    return 1


@contextlib.contextmanager
def use_mesh(mesh: Mesh | None) -> Iterator[None]:
    """Trace under `mesh` (`jax.set_mesh`): expert parallelism and distributed Muon see it. None: no-op."""
    if mesh is None:
        yield
        return
    with jax.set_mesh(mesh):
        yield


def active_mesh() -> Any:
    """The (data, expert) mesh set by `use_mesh` while tracing, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or DATA not in mesh.axis_names or EXPERT not in mesh.axis_names:
        return None
    return mesh


def param_spec(name: str, shape: tuple[int, ...], mesh: Mesh) -> P:
    """The partition of one parameter (see the module docstring)."""
    data, expert = mesh.shape[DATA], mesh.shape[EXPERT]
    if name.endswith(("experts.w_gate", "experts.w_up", "experts.w_down")):
        return P(EXPERT) if shape[0] % expert == 0 else P()
    if len(shape) >= 2 and shape[0] % data == 0:
        return P(DATA)
    return P()


def param_shardings(params: dict[str, Any], mesh: Mesh) -> dict[str, NamedSharding]:
    return {n: NamedSharding(mesh, param_spec(n, tuple(np.shape(p)), mesh)) for n, p in params.items()}


def shard_params(params: dict[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    shardings = param_shardings(params, mesh)
    return {n: jax.device_put(p, shardings[n]) for n, p in params.items()}


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, rows: int) -> NamedSharding:
    """Rows over data x expert where they divide, else over data, else replicated."""
    data, expert = mesh.shape[DATA], mesh.shape[EXPERT]
    if rows % (data * expert) == 0:
        return NamedSharding(mesh, P((DATA, EXPERT)))
    if rows % data == 0:
        return NamedSharding(mesh, P(DATA))
    return replicated(mesh)


def describe(mesh: Mesh | None) -> dict[str, str]:
    """MLflow tags naming the mesh."""
    if mesh is None:
        return {"dp": "1", "ep": "1"}
    return {"dp": str(mesh.shape[DATA]), "ep": str(mesh.shape[EXPERT])}
