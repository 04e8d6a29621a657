"""How the JAX engine lays a rung over devices: a `Mesh` with a data axis and an expert axis.

- Dense parameters are FSDP-style: each 2-D (or higher) tensor is split along its first dimension
  over the `data` axis where that dimension divides, else replicated; XLA gathers it for the
  matmul and reduce-scatters its gradient (GSPMD inserts the collectives from the annotations).
- Expert stacks (E, ., .) are split over the `expert` axis along E: each device of an expert
  column holds E / expert experts.
- The batch is split over both axes (data x expert), rows first.
- The optimizer state follows its parameters (optax states are built from sharded parameters
  under jit, so GSPMD propagates the layout); Muon's Newton-Schulz runs on the gathered matrices.

What this is not (yet): expert parallelism as a shard_map with fixed-size all-to-all buffers, and
distributed Muon with whole matrices on their owners. Here the MoE dispatch is the single-device
algorithm partitioned by GSPMD, so every device sees the same round plan as one device would.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

__all__ = ["make_mesh", "param_spec", "param_shardings", "shard_params", "batch_sharding", "replicated", "describe"]

DATA, EXPERT = "data", "expert"


class MeshError(ValueError):
    """A mesh that does not fit the devices or the rung."""


def make_mesh(data: int, expert: int = 1, devices: list | None = None) -> Mesh:
    """A (data, expert) mesh over the first data x expert devices."""
    devices = list(jax.devices() if devices is None else devices)
    if data < 1 or expert < 1 or data * expert > len(devices):
        raise MeshError(f"mesh ({data}, {expert}) needs {data * expert} devices; {len(devices)} available")
    return Mesh(np.array(devices[: data * expert]).reshape(data, expert), (DATA, EXPERT))


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
