"""Sharded checkpoints with torch.distributed.checkpoint (DCP): every rank writes only its shards.

Tensors are stored under their global shapes: FSDP2 parameters and their optimizer state are
DTensors already; expert-parallel slices (plain local tensors, see `rungs.parallel.expert_parallel`) are
presented as DTensors on the (dp, ep) mesh with placements (Replicate, Shard(0)). DCP therefore
reshards on load, so a checkpoint resumes onto any dp × ep layout and any number of workers.
Optimizer state is keyed by parameter name (`<name>/<state key>`), so it does not depend on how
the optimizer's groups are ordered. Small non-tensor state (step, sampler, RNG) is a JSON file
written by rank 0. A checkpoint directory appears atomically (written under a temporary name).

Loading unpickles nothing but data. Stock DCP reads its `.metadata` file with `pickle.load` and
non-tensor entries with `torch.load(weights_only=False)`, either of which runs whatever a crafted
file says; its tensors are already read with `weights_only=True`. Here the metadata goes through an
unpickler that admits only DCP's own metadata classes and torch's dtype/Size values, and non-tensor
entries are read with `weights_only=True`, so a crafted checkpoint is refused, not executed.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from rungs.parallel.distributed import Parallel
from rungs.optim import MuonAdamW

EXTRA_FILE = "extra.json"


class DistCheckpointError(ValueError):
    """A checkpoint that cannot be read into this job (missing directory, different model)."""


# Modules whose classes make up DCP's metadata (Metadata, TensorStorageMetadata, MetadataIndex,
# _StorageInfo, ...): only classes from these, never functions or modules, are admitted.
_METADATA_MODULES = frozenset({"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                               "torch.distributed.checkpoint.planner", "torch.distributed.checkpoint.storage"})
_PLAIN_GLOBALS = {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
                  ("torch", "Size"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
                  ("torch.serialization", "_get_layout")}  # a layout's name -> the torch.layout (a lookup)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN_GLOBALS:
            return super().find_class(module, name)
        if module == "torch":  # dtypes, layouts and memory formats pickle as `torch.<name>`
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        if module in _METADATA_MODULES and "." not in name:
            value = super().find_class(module, name)
            if isinstance(value, type):
                return value
        raise pickle.UnpicklingError(f"{module}.{name} is not checkpoint metadata")


class _SafeReader(FileSystemReader):
    """DCP's file reader, with its metadata read by the allow-listing unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(f).load()
            except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as err:
                raise DistCheckpointError(f"{path}: not distributed-checkpoint metadata; refusing to unpickle "
                                          f"it: {err}") from None
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner with non-tensor entries read as data (weights_only=True)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element  # DCP's own helper

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


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
        dcp.load(state, storage_reader=_SafeReader(str(path)), planner=_SafePlanner())
    except DistCheckpointError:
        raise
    except (Exception, CheckpointException) as err:  # every rank's error inside (a BaseException, not Exception)
        raise DistCheckpointError(f"{path}: cannot load into this model: {err}") from err
    with torch.no_grad():
        for local, loaded in copy_back:
            local.copy_(loaded.to_local())
    # the other entries alias the live parameters, buffers and optimizer state: filled in place
    return json.loads((path / EXTRA_FILE).read_text())
