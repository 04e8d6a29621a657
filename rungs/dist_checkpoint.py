"""Sharded checkpoints with torch.distributed.checkpoint (DCP): every rank writes only its shards.

Tensors are stored under their global shapes: FSDP2 parameters and their optimizer state are
DTensors already; expert-parallel slices (plain local tensors, see `rungs.expert_parallel`) are
presented as DTensors on the (dp, ep) mesh with placements (Replicate, Shard(0)). DCP therefore
reshards on load, so a checkpoint resumes onto any dp × ep layout and any number of workers.
Optimizer state is keyed by parameter name (`<name>/<state key>`), so it does not depend on how
the optimizer's groups are ordered. Small non-tensor state (step, sampler, RNG) is a JSON file
written by rank 0. A checkpoint directory appears atomically (written under a temporary name).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from rungs.distributed import Parallel
from rungs.optim import MuonAdamW

EXTRA_FILE = "extra.json"


class DistCheckpointError(ValueError):
    """A checkpoint that cannot be read into this job (missing directory, different model)."""


def _as_global(t: Tensor, expert: bool, par: Parallel) -> Tensor:
    if expert and not isinstance(t, DTensor):
        return DTensor.from_local(t, par.mesh, [Replicate(), Shard(0)], run_check=False)
    return t


def _init_state(opt: torch.optim.Optimizer, p: nn.Parameter) -> None:
    """Create the optimizer state a first step would create, so there is something to load into."""
    state = opt.state[p]
    if state:
        return
    if isinstance(opt, torch.optim.AdamW):
        state["step"] = torch.tensor(0.0)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    else:  # DistMuon
        state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)


def _items(model: nn.Module, optimizer: MuonAdamW, par: Parallel, *, create_state: bool) -> tuple[dict, list]:
    """The DCP state dict plus the (live local tensor, loaded DTensor) pairs to copy back after a load."""
    experts = {id(p) for p in par.expert_params}
    names = {id(p): n for n, p in model.named_parameters()}
    copy_back: list[tuple[Tensor, Tensor]] = []

    def wrap(t: Tensor, expert: bool) -> Tensor:
        g = _as_global(t, expert, par)
        if g is not t:
            copy_back.append((t, g))
        return g

    model_sd = {}
    for name, t in model.state_dict().items():
        model_sd[name] = t
    for name, p in model.named_parameters():
        if id(p) in experts:
            model_sd[name] = wrap(p.detach(), True)
    optim_sd: dict[str, Any] = {}
    for opt in optimizer.optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if create_state:
                    _init_state(opt, p)
                for key, value in opt.state[p].items():
                    expert = id(p) in experts and isinstance(value, Tensor) and value.shape == p.shape
                    optim_sd[f"{names[id(p)]}/{key}"] = wrap(value, expert) if isinstance(value, Tensor) else value
    return {"model": model_sd, "optim": optim_sd}, copy_back


def save(path: Path, model: nn.Module, optimizer: MuonAdamW, par: Parallel, extra: dict | None = None) -> Path:
    """Write this rank's shards of model and optimizer (collective: every rank calls it)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if par.is_main and tmp.exists():
        shutil.rmtree(tmp)
    dist.barrier()
    state, _ = _items(model, optimizer, par, create_state=True)
    dcp.save(state, checkpoint_id=str(tmp))
    if par.is_main:
        (tmp / EXTRA_FILE).write_text(json.dumps(extra or {}))
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    dist.barrier()
    return path


def load(path: Path, model: nn.Module, optimizer: MuonAdamW, par: Parallel) -> dict:
    """Read a checkpoint written by `save` under any layout into this one; returns its extra dict."""
    path = Path(path)
    if not (path / EXTRA_FILE).is_file():
        raise DistCheckpointError(f"{path}: no complete distributed checkpoint there (missing {EXTRA_FILE})")
    state, copy_back = _items(model, optimizer, par, create_state=True)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as err:  # DCP raises CheckpointException with every rank's error inside
        raise DistCheckpointError(f"{path}: cannot load into this model: {err}") from err
    with torch.no_grad():
        for local, loaded in copy_back:
            local.copy_(loaded.to_local())
    # the other entries alias the live parameters, buffers and optimizer state: filled in place
    return json.loads((path / EXTRA_FILE).read_text())
