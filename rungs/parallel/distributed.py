"""Data parallel × expert parallel, applied to the unmodified model from outside (torchtitan's rule).

Layout on W = dp × ep ranks (rank = dp_index · ep + ep_index):
- dense parameters (attention, shared expert, latent projections, norms, router, embeddings, head)
  are FSDP2-sharded (`fully_shard`, one unit per block plus the root) over all W ranks;
- with ep > 1 each block's `moe.experts` is swapped for `ExpertParallelExperts` over its EP group
  (ranks with the same dp index); those stacks are kept out of FSDP and are replicated over the
  data-parallel group (ranks with the same ep index), whose gradients are all-reduced in one
  flat collective per step;
- with ep == 1 the expert stacks are FSDP-sharded like everything else (dim 0: whole experts).

The model is built on the meta device, sharded, then materialised shard by shard (`build_model`): no
rank ever holds the whole model, and each shard gets the values the single-process model has for
the same seed (`rungs.model.Transformer.init_weights`, told where each local part sits by
`local_rows`). Sharded checkpoints (`rungs.parallel.dist_checkpoint`) load into these shards.

Mixed precision (`param_dtype=torch.bfloat16`): the blocks' FSDP units all-gather bf16 parameters
and reduce-scatter gradients in fp32 into fp32 shards (the master copy the optimizer updates); the
root unit (embedding, final norm, head) stays fp32, so the residual stream starts in fp32 as in the
single-process bf16-autocast run (autocast still decides each op's dtype). Expert stacks under
expert parallelism are outside FSDP and are cast per op by autocast, as on one process.

Gradient accumulation (`train_step`, micro_batches > 1) reduce-scatters once per step: every
micro-batch but the last runs with FSDP's gradient sync off, so the unsharded gradients accumulate
locally (fp32) and the last micro-batch's backward reduces the sum. The price is memory: between
micro-batches each rank holds the unsharded gradients of every FSDP unit it has run (with ep = 1
that includes every expert stack); `defer_grad_sync=False` reduces every micro-batch instead.

Gradients are means over the W ranks' losses, each a mean over that rank's equal share of the
batch, so the update equals the single-process update on the whole batch. The load-balancing
statistics of all layers are all-reduced in one collective per step (the router module's stacked
counts), making f the global batch's assignment fraction as in the single-process loss.
gloo on CPU, NCCL on GPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard

from rungs.architecture import ModelConfig
from rungs.model import LocalRows, Transformer
from rungs.held_weights import held_expert_weights
from rungs.parallel.dist_muon import DistMuon
from rungs.parallel.expert_parallel import ExpertParallelExperts
from rungs.optim import ADAMW_ROLES, DEFAULT_NO_DECAY_ROLES, MUON_ROLES, MuonAdamW, param_role
from rungs.router import load_balancing_loss, z_loss

log = logging.getLogger(__name__)


class DistributedError(ValueError):
    """A parallel layout that cannot run (sizes that do not multiply to the world, bad model)."""


@dataclass
class Parallel:
    """The process groups of one job (built by `setup`)."""
    dp: int
    ep: int
    rank: int
    world: int
    device_type: str
    world_mesh: DeviceMesh            # 1-D over all ranks: FSDP2 shards dense parameters here
    mesh: DeviceMesh                  # 2-D ("dp", "ep")
    dp_group: Any
    ep_group: Any
    expert_params: list[nn.Parameter] = field(default_factory=list)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def setup(dp: int | None = None, ep: int = 1, *, device_type: str | None = None) -> Parallel:
    """Initialise the default process group from the environment (torchrun / Ray Train set RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT) if needed, then build the DP × EP meshes."""
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device_type))
    world, rank = dist.get_world_size(), dist.get_rank()
    dp = world // ep if dp is None else dp
    if ep < 1 or dp < 1 or dp * ep != world:
        raise DistributedError(f"dp={dp} × ep={ep} must equal the world size {world}")
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    world_mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("world",))
    mesh = init_device_mesh(device_type, (dp, ep), mesh_dim_names=("dp", "ep"))
    return Parallel(dp=dp, ep=ep, rank=rank, world=world, device_type=device_type, world_mesh=world_mesh,
                    mesh=mesh, dp_group=mesh.get_group("dp"), ep_group=mesh.get_group("ep"))


def build_model(arch: ModelConfig, par: Parallel, *, capacity_per_expert: int | None = None,
                param_dtype: torch.dtype | None = None, generator: torch.Generator | None = None,
                draw_weights: bool = True) -> nn.Module:
    """The sharded `rungs.model.Transformer` for `par`, built on the meta device, sharded, then
    materialised and initialised shard by shard (see the module docstring). `generator`: the CPU
    generator the single-process model would draw from (default: torch's global one).
    `draw_weights=False` when a checkpoint is loaded next: the parameters are allocated but not drawn
    (drawing walks the whole random stream on every rank, one draw per parameter: ~1.3 min at L18 and
    ~15 min at L42, for values the checkpoint replaces); the buffers are set as usual."""
    with torch.device("meta"):
        model = Transformer(arch)
    parallelize(model, par, capacity_per_expert=capacity_per_expert, param_dtype=param_dtype)
    materialise(model, par, generator, draw_weights=draw_weights)
    return model


def materialise(model: nn.Module, par: Parallel, generator: torch.Generator | None = None, *,
                draw_weights: bool = True) -> None:
    """Allocate a meta-built, sharded model's local parts on this rank's device and initialise them
    (only the buffers with `draw_weights=False`: the caller loads every parameter next)."""
    model.to_empty(device=torch.device(par.device_type))
    # to_empty replaces the expert-parallel slices' Parameter objects (FSDP2 keeps its own): point the
    # layout's expert list (optimizer roles, gradient reduction, norm) at the live ones
    par.expert_params = [w for m in model.modules() if isinstance(m, ExpertParallelExperts)
                         for w in (m.w_gate, m.w_up, m.w_down)]
    if draw_weights:
        model.init_weights(generator, local_rows=local_rows(model))
    else:
        model.init_buffers()


def local_rows(model: nn.Module) -> LocalRows:
    """Where each parameter's local part sits in the whole tensor (`Transformer.init_weights`).

    An FSDP2 shard (Shard(0) over the world) holds rows [rank·c, rank·c + its rows) with
    c = ceil(rows / world), torch.chunk's split, which FSDP2 uses; an expert-parallel slice holds
    experts [first_expert, first_expert + local experts) of the stack."""
    slices: dict[int, tuple[torch.Size, int]] = {}
    for module in model.modules():
        if isinstance(module, ExpertParallelExperts):
            for w in (module.w_gate, module.w_up, module.w_down):
                slices[id(w)] = (torch.Size((module.n_experts, *w.shape[1:])), module.first_expert)

    def where(name: str, p: Tensor) -> tuple[torch.Size, int, Tensor]:
        if id(p) in slices:
            return *slices[id(p)], p
        if not isinstance(p, DTensor):
            return p.shape, 0, p
        local = p.to_local()
        if all(isinstance(pl, Replicate) for pl in p.placements):
            return p.shape, 0, local
        if tuple(p.placements) != (Shard(0),):
            raise DistributedError(f"{name}: placements {p.placements}; materialise knows Shard(0) on one mesh "
                                   "dimension and Replicate")
        rows, ranks = p.shape[0], p.device_mesh.size()
        chunk = -(-rows // ranks)
        first = min(rows, p.device_mesh.get_local_rank() * chunk)
        if local.shape[0] != min(rows, first + chunk) - first:
            raise DistributedError(f"{name}: local rows {local.shape[0]} are not torch.chunk's split of {rows} rows "
                                   f"over {ranks} ranks")
        return p.shape, first, local
    return where


def parallelize(model: nn.Module, par: Parallel, *, capacity_per_expert: int | None = None,
                reshard_after_forward: bool = True, param_dtype: torch.dtype | None = None) -> nn.Module:
    """Shard `model` (a `rungs.model.Transformer`, unmodified, real or on the meta device) in place
    for `par`; returns it. `param_dtype`: the blocks' compute dtype under FSDP mixed precision
    (None: fp32 throughout)."""
    if not hasattr(model, "layers"):
        raise DistributedError("parallelize expects a rungs.model.Transformer (a model with .layers)")
    par.expert_params = []
    if par.ep > 1:
        for block in model.layers:
            ep_experts = ExpertParallelExperts(block.moe.experts, par.ep_group, capacity_per_expert=capacity_per_expert)
            block.moe.experts = ep_experts
            par.expert_params += [ep_experts.w_gate, ep_experts.w_up, ep_experts.w_down]
    ignored = set(par.expert_params) or None
    blocks = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
              if param_dtype is not None else MixedPrecisionPolicy())
    for block in model.layers:
        fully_shard(block, mesh=par.world_mesh, reshard_after_forward=reshard_after_forward, ignored_params=ignored,
                    mp_policy=blocks)
    fully_shard(model, mesh=par.world_mesh, reshard_after_forward=reshard_after_forward, ignored_params=ignored)
    return model


def build_optimizer(model: nn.Module, par: Parallel, *, lr: float, weight_decay: float, adam_lr: float | None = None,
                    adam_betas: tuple[float, float] = (0.9, 0.95), adam_eps: float = 1e-8,
                    muon_momentum: float = 0.95, adjust_lr: str = "match_rms_adamw",
                    comm_dtype: torch.dtype = torch.bfloat16, ns_dtype: torch.dtype | None = torch.bfloat16
                    ) -> MuonAdamW:
    """`rungs.optim.build_optimizer`'s groups and hyperparameters, with DistMuon for the matrices.

    Expert stacks under expert parallelism are replicated over the data-parallel group: DistMuon
    orthogonalises each on one owner there and all-gathers (the report's replicated path).
    """
    adam_lr = lr if adam_lr is None else adam_lr
    experts = {id(p) for p in par.expert_params}
    by_role: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            role = param_role(name, p)
            if role == "expert_stack" and id(p) in experts:
                role = "expert_stack_ep"
            by_role.setdefault(role, []).append(p)

    def group(role: str, base_lr: float) -> dict:
        base = role.removesuffix("_ep")
        g = {"params": by_role[role], "role": base, "lr": base_lr, "initial_lr": base_lr,
             "weight_decay": 0.0 if base in DEFAULT_NO_DECAY_ROLES else weight_decay}
        if role == "expert_stack_ep":
            g["replica_group"] = par.dp_group
        return g

    muon_groups = [group(r, lr) for r in (*MUON_ROLES, "expert_stack_ep") if r in by_role]
    adam_groups = [group(r, adam_lr) for r in ADAMW_ROLES if r in by_role]
    muon = DistMuon(muon_groups, lr=lr, weight_decay=weight_decay, momentum=muon_momentum, adjust_lr=adjust_lr,
                    comm_dtype=comm_dtype, ns_dtype=ns_dtype) if muon_groups else None
    adamw = torch.optim.AdamW(adam_groups, lr=adam_lr, betas=adam_betas, eps=adam_eps,
                              weight_decay=weight_decay) if adam_groups else None
    return MuonAdamW(muon, adamw)


def reduce_expert_grads(par: Parallel) -> None:
    """Expert gradients: the EP exchange already summed the EP group's sources; sum over the
    data-parallel replicas in one flat all-reduce and divide by the world (a mean over ranks)."""
    grads = [p.grad for p in par.expert_params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if par.dp > 1:
        dist.all_reduce(flat, group=par.dp_group)
    flat /= par.world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def clip_grad_norm_on_device(model: nn.Module, par: Parallel, max_norm: float | None) -> Tensor:
    """Global L2 norm of all gradients as a 0-d float64 device tensor (one all-reduce), clipped like
    `rungs.optim.clip_grad_norm_on_device_`: the scale is computed and applied on the device (1 where
    the norm is within `max_norm` or not finite), so the step reads the norm once, at its end."""
    experts = {id(p) for p in par.expert_params}
    sq = torch.zeros((), dtype=torch.float64, device=par.device_type)
    grads = []
    for p in model.parameters():
        if p.grad is None:
            continue
        g = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
        grads.append(g)
        # FSDP shards are disjoint over the world; expert stacks are repeated on the dp replicas
        sq += g.double().square().sum() / (par.dp if id(p) in experts else 1)
    dist.all_reduce(sq)  # every rank now holds the same global sum, so every rank scales alike
    norm = sq.sqrt()
    if max_norm is not None and grads:
        clip = torch.isfinite(norm) & (norm > max_norm)
        scale = torch.where(clip, max_norm / (norm + 1e-6), 1.0)  # float64, as the host scalar was
        torch._foreach_mul_(grads, scale.to(grads[0].dtype))
    return norm


def clip_grad_norm(model: nn.Module, par: Parallel, max_norm: float | None) -> float:
    """`clip_grad_norm_on_device`, read on the host (outside the training step: tests, tools)."""
    return float(clip_grad_norm_on_device(model, par, max_norm))


def lbl_reduce(par: Parallel):
    """The one collective per step that makes the balancing statistics global (all layers stacked)."""
    def reduce(counts: Tensor) -> Tensor:
        counts = counts.clone()
        dist.all_reduce(counts)
        return counts
    return reduce


def rank_rows(batch_sequences: int, micro_batches: int, rank: int, world: int) -> list[int]:
    """The global batch's rows rank `rank` of `world` trains, micro-batch by micro-batch: its 1/world of each
    of the one-process step's micro-batches (rows [m·M, (m+1)·M), M = batch_sequences / micro_batches). The
    ranks' m-th micro-batches together are then the one-process m-th micro-batch, so a statistic the ranks
    all-reduce per micro-batch (the load-balancing loss's f) is taken over the same tokens as in one process.
    (A contiguous 1/world of the batch cut into micro-batches mixed rows of different micro-batches.)"""
    if batch_sequences % (micro_batches * world):
        raise DistributedError(f"batch_sequences={batch_sequences} does not split into {micro_batches} micro-batches "
                               f"of {world} equal shares")
    micro, share = batch_sequences // micro_batches, batch_sequences // micro_batches // world
    return [m * micro + rank * share + i for m in range(micro_batches) for i in range(share)]


def train_step(model: nn.Module, optimizer: MuonAdamW, par: Parallel, inputs: Tensor, targets: Tensor, *,
               n_experts: int, top_k: int, lb_loss_coef: float = 0.0, z_loss_coef: float = 0.0,
               grad_clip: float | None = None, autocast_dtype: torch.dtype | None = None,
               micro_batches: int = 1, clipper: Any = None, locate: Any = None, row_offset: int = 0,
               rows: Sequence[int] | None = None, decode: Any = None, defer_grad_sync: bool = True,
               host_inputs: Tensor | None = None) -> dict[str, float]:
    """One optimizer step on this rank's share (inputs, targets: (b, T)) of the global batch,
    accumulated over `micro_batches` equal slices of it (each scaled by 1 / micro_batches); with
    `defer_grad_sync` FSDP reduces the gradients once, in the last micro-batch's backward.
    With an activation-gradient `clipper` installed on the model, each micro-batch is announced to
    it (rows located in the global batch through `locate`: `rows`, the global row of each of this rank's
    rows (`rank_rows`), else this rank's rows contiguous from `row_offset`;
    `host_inputs`, the CPU copy of `inputs`, lets it decode an event's context without a device read).

    The host reads the device once, after `optimizer.step()`: losses, MoE rounds and overload
    and the grad norm stay on the device, the clip scale is applied there, and the step's statistics
    of every rank travel in one all-gather before that one read."""
    if inputs.shape[0] % micro_batches:
        raise DistributedError(f"{inputs.shape[0]} sequences per rank do not split into {micro_batches} micro-batches")
    device = inputs.device
    ce_sum = torch.zeros((), dtype=torch.float64, device=device)
    aux_sum = torch.zeros((), dtype=torch.float64, device=device)
    micro = inputs.shape[0] // micro_batches
    host_chunks = (host_inputs if host_inputs is not None else inputs).chunk(micro_batches)
    global_rows = rows if rows is not None else range(row_offset, row_offset + inputs.shape[0])
    rounds: list[Tensor] = []    # per layer and micro-batch, 0-d on the device
    overload: list[Tensor] = []  # per layer and micro-batch: busiest expert's assignments / the mean, this rank
    # Accumulating in a compute dtype under expert parallelism: the local expert stacks are cast once a
    # step and later micro-batches add their gradients into .grad in place (rungs.held_weights.held_expert_weights;
    # the same values bit for bit). Not with ep 1: there the stacks are FSDP's.
    hold = (held_expert_weights(model) if autocast_dtype is not None and micro_batches > 1 and par.ep > 1
            else contextlib.nullcontext())
    with hold:
        for m, (inp, tgt) in enumerate(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches))):
            if clipper is not None:
                where = None if locate is None else (lambda r, p, o=m * micro: locate(global_rows[r + o], p))
                clipper.begin_micro_batch(host_chunks[m], locate=where, decode=decode)
            if defer_grad_sync and micro_batches > 1:
                model.set_requires_gradient_sync(m == micro_batches - 1)  # True again after the last
            with torch.autocast(par.device_type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
                ce, routes = model(inp, tgt)  # the chunked loss (rungs.loss): no (tokens, vocab) logits
            aux = ce.new_zeros(())
            if lb_loss_coef:
                aux = aux + lb_loss_coef * load_balancing_loss(routes, n_experts, top_k, reduce_fn=lbl_reduce(par))
            if z_loss_coef:
                aux = aux + z_loss_coef * z_loss(routes)
            ((ce + aux) / micro_batches).backward()
            ce_sum = ce_sum + ce.detach().double() / micro_batches
            aux_sum = aux_sum + aux.detach().double() / micro_batches
            rounds += [block.moe.experts.last_rounds.double() for block in model.layers]
            overload += [r.tokens_per_expert.max().double() / r.tokens_per_expert.float().mean().double().clamp_min(1e-9)
                         for r in routes]
    reduce_expert_grads(par)
    grad_norm = clip_grad_norm_on_device(model, par, grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    rounds_t = torch.stack(rounds)
    mine = torch.stack([ce_sum, aux_sum, rounds_t.mean(), rounds_t.max(), torch.stack(overload).max()])
    # One collective for every rank's statistics (sums and maxima alike: an all-gather, reduced here
    # in rank order, the same on every rank), then the step's one host read.
    every = torch.empty(par.world * mine.numel(), dtype=mine.dtype, device=device)
    dist.all_gather_single(every, mine)
    every = every.view(par.world, mine.numel())  # (world, 5): one row per rank
    means, peaks = every[:, :3].sum(0) / par.world, every[:, 3:].max(0).values
    loss, aux_loss, rounds_mean, rounds_max, overload_max, norm = torch.cat(
        [means, peaks, grad_norm.reshape(1)]).tolist()
    # The same names as the one-process step (rungs.torch_engine._train_step); the overload is the
    # largest over the ranks of each rank's own routing.
    return {"loss": loss, "aux_loss": aux_loss, "grad_norm": norm, "moe_rounds_mean": rounds_mean,
            "moe_rounds_max": rounds_max, "moe_overload_max": overload_max}
