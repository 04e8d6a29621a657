"""Distributed Muon with all-to-all resharding (MAI-Base-2 report; research note A4 pattern 4).

Newton–Schulz (NS) needs whole, fully reduced matrices, but under ZeRO/FSDP2 every rank holds only
a row shard of each matrix. Each step:

1. every rank updates its FP32 momentum *shards* locally and casts the update to the comm dtype
   (BF16 by default; FP32 for exact tests);
2. same-shape matrices form one batch; one ``all_to_all_single`` over a flat buffer sends each row
   shard to the matrix's owner, so every rank then holds whole matrices (owners round-robin);
3. the owner runs NS locally on its whole matrices (batched, ``rungs.muon.newton_schulz``);
4. a second ``all_to_all_single`` returns the orthogonalised rows to the shards that hold them,
   which are cast back to FP32 and applied (decoupled weight decay, then the scaled update).

Replicated matrices (expert stacks replicated over the data-parallel group under expert
parallelism; a router, were it given to Muon: `rungs.optim.build_optimizer` gives it to AdamW) skip step 2: each is orthogonalised by one owner and all-gathered. A
replication group of one rank (e.g. expert stacks FSDP-sharded along the expert dim, which are
whole matrices already) is orthogonalised locally with no collective.

Every rank issues the same collectives in the same order: the plan (batches, owners, split sizes)
depends only on global shapes and parameter order, uneven and empty shards are zero-padded to
``ceil(rows / world)`` rows (zero rows never reach NS: full matrices are compacted first), and a
missing gradient counts as zero. The plan is computed once and cached. The exchange of batch b+1 is
issued asynchronously before NS of batch b runs, so communication overlaps compute.

Batches hold as many matrices as a Newton–Schulz working-set budget has room for
(``ns_chunk_bytes``; default ``rungs.muon.ns_budget_bytes`` of the parameters' device, per matrix
``rungs.muon.ns_working_bytes``): same-shape matrices beyond that form further batches of the same
layout, so neither the exchange buffers nor the Newton–Schulz working set of one batch grows with
the number of experts. The cut depends only on shapes, counts and the device type, so it is the
same on every rank. The momentum update writes its result once, in the comm dtype; the apply adds
it to the float32 shard without a float32 copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

try:  # DTensor is what FSDP2 gives us; plain tensors are replicated params
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover - torch 2.13 always has it
    DTensor = None  # type: ignore[assignment]

Orthogonalize = Callable[[Tensor], Tensor]
AdjustLR = Callable[[float, tuple[int, int]], float]


class DistMuonError(ValueError):
    """A parameter layout distributed Muon cannot orthogonalise whole (names the parameter)."""


@dataclass(frozen=True)
class _Matrix:
    """One logical (m, n) matrix: parameter `param` (index into the flat list), matrix `batch` of it."""
    param: int
    batch: int


@dataclass
class _Batch:
    """Same-shape matrices sharing one layout; all exchange fields are rank-invariant except `mine`."""
    kind: str                       # "rows": row-sharded over `ranks`; "whole": replicated over `ranks`
    ranks: tuple[int, ...]
    group: Any
    shape: tuple[int, int]
    matrices: list[_Matrix] = field(default_factory=list)
    # filled by _finalise
    world: int = 1
    rank: int = 0
    rows_per_rank: int = 0          # "rows": padded shard rows c = ceil(m / world)
    my_rows: int = 0                # "rows": real rows this rank holds (0 for an empty shard)
    owner_order: list[int] = field(default_factory=list)   # matrices sorted by (owner, index)
    send_splits: list[int] = field(default_factory=list)   # elements, first all-to-all
    mine: list[int] = field(default_factory=list)          # indices of the matrices this rank orthogonalises
    per_rank: int = 0               # "whole": padded matrices per rank for the all-gather

    def finalise(self) -> None:
        m, n = self.shape
        count = len(self.matrices)
        if self.kind == "rows":
            c = self.rows_per_rank = math.ceil(m / self.world)
            self.my_rows = max(0, min(c, m - self.rank * c))
            owners = [j % self.world for j in range(count)]
            self.owner_order = sorted(range(count), key=lambda j: (owners[j], j))
            self.send_splits = [owners.count(d) * c * n for d in range(self.world)]
            self.mine = [j for j in range(count) if owners[j] == self.rank]
        else:
            self.per_rank = math.ceil(count / self.world)
            self.mine = list(range(self.rank * self.per_rank, min(count, (self.rank + 1) * self.per_rank)))

    def comm_elements(self) -> int:
        """Elements this rank sends in the batch's collectives (the benchmark's floor uses it)."""
        m, n = self.shape
        if self.world == 1:
            return 0
        if self.kind == "rows":  # out and back, padded shards, less the share a rank keeps
            return 2 * len(self.matrices) * self.rows_per_rank * n * (self.world - 1) // self.world
        return self.per_rank * m * n * (self.world - 1)


def _default_orthogonalize(steps: int, coefficients: tuple[float, float, float] | None,
                           dtype: torch.dtype | None) -> Orthogonalize:
    from rungs.muon import SIMPLE_COEFFICIENTS, newton_schulz

    coefficients = coefficients or SIMPLE_COEFFICIENTS
    return lambda x: newton_schulz(x, steps, coefficients, dtype=dtype)


def _default_adjust_lr(mode: str) -> AdjustLR:
    from rungs.muon import CONVENTIONS, adjust_lr  # the single-process Muon's formula, shared on purpose

    if mode not in CONVENTIONS:
        raise DistMuonError(f"adjust_lr must be one of {sorted(CONVENTIONS)}, got {mode!r}")
    return lambda lr, shape: adjust_lr(lr, shape, mode)


class DistMuon(torch.optim.Optimizer):
    """Muon for FSDP2-sharded (DTensor ``Shard(0)``) and replicated matrices; never runs NS on a shard.

    Parameters are 2-D ``(m, n)`` or 3-D stacks ``(E, m, n)`` (a batch of E matrices). A DTensor on a
    1-D mesh sharded on the row dim (dim 0 of a 2-D, dim 1 of a 3-D) is row-sharded; a 3-D DTensor
    sharded on dim 0 holds whole matrices. A plain tensor is replicated over the param group's
    ``replica_group`` (default: the world), e.g. a router kept out of FSDP or an expert-parallel
    stack replicated over its data-parallel group; its gradient must already be reduced.

    Momentum is the EMA form (``m.lerp_(g, 1-β)``, Nesterov ``g.lerp(m, β)``), weight decay is
    decoupled with the unadjusted lr, the update is scaled by ``adjust_lr(lr, (m, n))``: the same
    math as ``rungs.muon.Muon`` (whose ``newton_schulz`` and scale conventions are used), except that
    a missing gradient counts as zero so that every rank issues the same collectives.
    """

    def __init__(self, params: Iterable[Any], *, lr: float = 0.02, weight_decay: float = 0.0,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 adjust_lr: str | AdjustLR = "match_rms_adamw",
                 ns_coefficients: tuple[float, float, float] | None = None,
                 ns_dtype: torch.dtype | None = torch.bfloat16, comm_dtype: torch.dtype = torch.bfloat16,
                 orthogonalize: Orthogonalize | None = None, replica_group: Any = None,
                 ns_chunk_bytes: int | None = None) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1:
            raise DistMuonError(f"need lr >= 0, weight_decay >= 0, 0 <= momentum < 1; got {lr}, {weight_decay}, {momentum}")
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        replica_group=replica_group)
        super().__init__(params, defaults)
        self.ns_chunk_bytes = ns_chunk_bytes
        if ns_chunk_bytes is not None and ns_chunk_bytes < 1:
            raise DistMuonError(f"ns_chunk_bytes must be >= 1, got {ns_chunk_bytes}")
        self.comm_dtype, self.ns_dtype = comm_dtype, ns_dtype
        self._orthogonalize = orthogonalize or _default_orthogonalize(ns_steps, ns_coefficients, ns_dtype)
        self._adjust_lr = adjust_lr if callable(adjust_lr) else _default_adjust_lr(adjust_lr)
        self.convention = _convention(adjust_lr)
        self._plan_key: tuple[int, ...] | None = None
        self._plan: list[_Batch] = []
        self._entries: list[tuple[Tensor, dict]] = []

    # ----- plan (computed once, cached) -----
    def _layout(self, p: Tensor, group_opts: dict) -> tuple[str, Any, tuple[int, int], int]:
        """(kind, process group, matrix shape, matrices) for one parameter."""
        if p.ndim not in (2, 3):
            raise DistMuonError(f"Muon takes 2-D matrices or 3-D expert stacks, got shape {tuple(p.shape)}")
        shape = (p.shape[-2], p.shape[-1])
        count = p.shape[0] if p.ndim == 3 else 1
        if DTensor is not None and isinstance(p, DTensor):
            placements = p.placements
            if len(placements) != 1:
                raise DistMuonError(f"DTensor on a {len(placements)}-D mesh: give Muon the 1-D shard mesh "
                                    "(placements must be one Shard or Replicate)")
            placement = placements[0]
            group = p.device_mesh.get_group(0)
            if isinstance(placement, Replicate):
                return "whole", group, shape, count
            if isinstance(placement, Shard) and placement.dim == p.ndim - 2:
                return "rows", group, shape, count
            if isinstance(placement, Shard) and p.ndim == 3 and placement.dim == 0:
                return "whole", None, shape, p.to_local().shape[0]  # local whole matrices
            raise DistMuonError(f"unsupported placement {placement} for shape {tuple(p.shape)}: shard rows "
                                "(dim -2) or, for expert stacks, the expert dim")
        group = group_opts.get("replica_group")
        if group is None and dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        return "whole", group, shape, count

    def _build_plan(self) -> None:
        from rungs.muon import ns_budget_bytes, ns_matrices_per_chunk

        self._entries = [(p, g) for g in self.param_groups for p in g["params"]]
        self._device = _local(self._entries[0][0]).device if self._entries else torch.device("cpu")
        budget = self.ns_chunk_bytes or ns_budget_bytes(self._device)
        batches: dict[tuple, _Batch] = {}
        for index, (p, g) in enumerate(self._entries):
            kind, group, shape, count = self._layout(p, g)
            ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else ()
            key = (kind, ranks, shape)
            if key not in batches:  # first appearance order: identical on every rank
                batches[key] = _Batch(kind, ranks, group, shape)
            batches[key].matrices += [_Matrix(index, b) for b in range(count)]
        plan = []
        for whole in batches.values():
            per_chunk = ns_matrices_per_chunk(whole.shape, self.ns_dtype or self.comm_dtype, budget)
            for lo in range(0, len(whole.matrices), per_chunk):  # bounded batches, same cut on every rank
                batch = _Batch(whole.kind, whole.ranks, whole.group, whole.shape, whole.matrices[lo:lo + per_chunk])
                if batch.group is not None and len(batch.ranks) > 1:
                    batch.world, batch.rank = len(batch.ranks), dist.get_rank(batch.group)
                batch.finalise()
                plan.append(batch)
        self._plan = plan
        self._plan_key = tuple(id(p) for p, _ in self._entries)

    def plan(self) -> list[_Batch]:
        key = tuple(id(p) for g in self.param_groups for p in g["params"])
        if key != self._plan_key:
            self._build_plan()
        return self._plan

    def comm_bytes_per_rank(self) -> int:
        """Bytes this rank sends per step in the resharding collectives (all batches)."""
        size = torch.empty((), dtype=self.comm_dtype).element_size()
        return sum(b.comm_elements() for b in self.plan()) * size

    # ----- step -----
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plan = self.plan()
        updates = [self._momentum_update(p, g) for p, g in self._entries]  # local, comm dtype
        results: dict[int, Tensor] = {}  # param index -> orthogonalised local update (comm dtype)
        pieces: dict[int, list[tuple[int, Tensor]]] = {}

        inflight: dict[int, tuple[Any, Tensor]] = {}
        if plan:
            inflight[0] = self._send_rows(plan[0], updates)
        returns = []
        for b, batch in enumerate(plan):
            if b + 1 < len(plan):  # prefetch: next batch's exchange runs while this NS computes
                inflight[b + 1] = self._send_rows(plan[b + 1], updates)
            whole = self._receive_whole(batch, updates, inflight.pop(b))
            ortho = self._orthogonalize(whole).to(self.comm_dtype) if whole.shape[0] else whole
            returns.append((batch, self._send_back(batch, ortho)))
        for batch, (handle, buffer) in returns:
            if handle is not None:
                handle.wait()
            for matrix, local in self._unpack_back(batch, buffer):
                pieces.setdefault(matrix.param, []).append((matrix.batch, local))
        for index, parts in pieces.items():
            parts.sort(key=lambda t: t[0])
            p = self._entries[index][0]
            results[index] = torch.stack([t for _, t in parts]) if p.ndim == 3 else parts[0][1]
        for index, (p, g) in enumerate(self._entries):
            if index in results:  # absent: a local expert stack with no experts on this rank
                self._apply(p, g, results[index])
        return loss

    def _momentum_update(self, p: Tensor, g: dict) -> Tensor:
        local = _local(p)
        grad = _local(p.grad) if p.grad is not None else torch.zeros_like(local)  # zero-fill: same collectives
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
        buf = _local(state["momentum_buffer"])
        grad = grad.float()
        buf.lerp_(grad, 1 - g["momentum"])
        if not g["nesterov"]:
            return buf.to(self.comm_dtype)
        return torch.lerp(grad, buf, g["momentum"], out=torch.empty_like(buf, dtype=self.comm_dtype))

    def _matrix_local(self, updates: list[Tensor], m: _Matrix) -> Tensor:
        u = updates[m.param]
        return u[m.batch] if u.ndim == 3 else u

    def _send_rows(self, batch: _Batch, updates: list[Tensor]) -> tuple[Any, Tensor]:
        """First exchange of a row-sharded batch (async); whole batches need none."""
        if batch.kind != "rows" or batch.world == 1:
            return None, torch.empty(0)
        c, n = batch.rows_per_rank, batch.shape[1]
        padded = torch.zeros(len(batch.matrices), c, n, dtype=self.comm_dtype, device=self._device)
        for j, m in enumerate(batch.matrices):
            padded[j, :batch.my_rows] = self._matrix_local(updates, m)
        send = padded[batch.owner_order].reshape(-1)
        recv = torch.empty(batch.world * len(batch.mine) * c * n, dtype=self.comm_dtype, device=self._device)
        recv_splits = [len(batch.mine) * c * n] * batch.world
        handle = dist.all_to_all_single(recv, send, recv_splits, batch.send_splits, group=batch.group, async_op=True)
        return handle, recv

    def _receive_whole(self, batch: _Batch, updates: list[Tensor], inflight: tuple[Any, Tensor]) -> Tensor:
        """The whole (k, m, n) matrices this rank orthogonalises."""
        m_rows, n = batch.shape
        if batch.kind == "rows" and batch.world > 1:
            handle, recv = inflight
            handle.wait()
            k, c = len(batch.mine), batch.rows_per_rank
            full = recv.view(batch.world, k, c, n).permute(1, 0, 2, 3).reshape(k, batch.world * c, n)
            return full[:, :m_rows].contiguous()
        if batch.kind == "rows":  # world of one: the shard is the whole matrix
            return torch.stack([self._matrix_local(updates, batch.matrices[j]) for j in batch.mine]) \
                if batch.mine else torch.empty(0, m_rows, n, dtype=self.comm_dtype, device=self._device)
        if not batch.mine:
            return torch.empty(0, m_rows, n, dtype=self.comm_dtype, device=self._device)
        return torch.stack([self._matrix_local(updates, batch.matrices[j]) for j in batch.mine])

    def _send_back(self, batch: _Batch, ortho: Tensor) -> tuple[Any, Tensor]:
        m_rows, n = batch.shape
        if batch.world == 1:
            return None, ortho
        if batch.kind == "rows":
            k, c = len(batch.mine), batch.rows_per_rank
            padded = torch.zeros(k, batch.world * c, n, dtype=self.comm_dtype, device=self._device)
            padded[:, :m_rows] = ortho
            send = padded.view(k, batch.world, c, n).permute(1, 0, 2, 3).reshape(-1)
            recv = torch.empty(sum(batch.send_splits), dtype=self.comm_dtype, device=self._device)
            handle = dist.all_to_all_single(recv, send, batch.send_splits, [k * c * n] * batch.world,
                                            group=batch.group, async_op=True)
            return handle, recv
        mine = torch.zeros(batch.per_rank, m_rows, n, dtype=self.comm_dtype, device=self._device)
        mine[:ortho.shape[0]] = ortho
        out = torch.empty(batch.world * batch.per_rank, m_rows, n, dtype=self.comm_dtype, device=self._device)
        handle = dist.all_gather_single(out, mine, group=batch.group, async_op=True)
        return handle, out

    def _unpack_back(self, batch: _Batch, buffer: Tensor) -> list[tuple[_Matrix, Tensor]]:
        """(matrix, this rank's slice of its orthogonalised update) for every matrix of the batch."""
        m_rows, n = batch.shape
        if batch.world == 1:
            return [(batch.matrices[j], buffer[i]) for i, j in enumerate(batch.mine)]
        if batch.kind == "rows":
            c = batch.rows_per_rank
            by_owner = buffer.view(len(batch.matrices), c, n)
            out = []
            for position, j in enumerate(batch.owner_order):
                out.append((batch.matrices[j], by_owner[position, :batch.my_rows]))
            return out
        return [(mat, buffer[j]) for j, mat in enumerate(batch.matrices)]

    def _apply(self, p: Tensor, g: dict, update: Tensor) -> None:
        local = _local(p)
        lr, wd = g["lr"], g["weight_decay"]
        scaled = self._adjust_lr(lr, (p.shape[-2], p.shape[-1]))
        if wd:
            local.mul_(1 - lr * wd)
        local.add_(update, alpha=-scaled)                  # comm dtype promoted on the fly: no copy


def _convention(adjust_lr: str | AdjustLR) -> str:
    """The update-scale formula, named like rungs.muon.Muon.convention (logged by the trainer)."""
    if callable(adjust_lr):
        return getattr(adjust_lr, "__name__", "custom")
    from rungs.muon import CONVENTIONS

    return CONVENTIONS[adjust_lr]


def _local(t: Tensor) -> Tensor:
    """The local shard of a DTensor (aliasing its storage), the tensor itself otherwise."""
    if DTensor is not None and isinstance(t, DTensor):
        return t._local_tensor
    return t
