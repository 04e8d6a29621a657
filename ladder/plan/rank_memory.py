"""The per-rank byte model of the memory planner: the bytes one rank holds at its peak when a rung trains
under one layout (`ladder.plan.layout_search` finds the smallest layout that fits a GPU).

Pure arithmetic over the rung's tensor shapes (`rungs.architecture.parameter_shapes`), no torch. A
layout is dp × ep ranks (`rungs.parallel.distributed`: dense tensors FSDP2-sharded over all
dp·ep ranks along dim 0; with ep > 1 each rank holds E/ep whole experts of every layer, replicated
over the dp group, outside FSDP), a per-rank micro-batch of sequences, activation checkpointing
and precision:

- "fp32": everything fp32 (the CPU path);
- "bf16": bf16 compute (torch.autocast) over fp32 master parameters, fp32 gradients and optimizer
  states, FSDP2 all-gathers in bf16 and reductions in fp32 (its MixedPrecisionPolicy).

What it counts, per rank (bytes):

- params: fp32 master shards (ceil(rows / world) rows of each FSDP tensor; E/ep experts under ep);
- grads: the same shapes in fp32 (present from the second micro-batch on, so counted in full);
  when a rank accumulates several micro-batches with FSDP's sync deferred (the sharded job's
  default), the whole unsharded fp32 gradients of every FSDP-sharded tensor;
- optimizer: Muon's fp32 momentum for the matrix and expert-stack roles, AdamW's fp32 m and v for
  the embedding, LM head, norms and router (the roles of `rungs.optim`);
- activations: what autograd saves during one micro-batch's forward, layer by layer, as the
  torch model (`rungs.model`, `rungs.moe`, `rungs.parallel.expert_parallel`) saves it: RMSNorm's
  input and normalised rows, each linear's input, flash attention's q, k, v, output and
  log-sum-exp (no mask tensor: `rungs.attention`), RoPE's rotation tables, the router's
  probabilities, indices and gates, the routed experts' (`ladder.plan.expert_memory`: one
  process, the dispatched rows and hidden pre-activations of a one-round call; under ep, the
  per-pair outputs and the plan), the shared expert's hidden tensors, the
  load-balancing loss's stacked probabilities, the final norm, and the loss: chunked
  (`rungs.loss`: its saved gradients of the hidden rows and head weight) or, when the micro-batch
  fits one chunk or the step takes logits, the head's input and the fp32 log-probabilities (plus
  the logits the step holds). Under bf16 it adds autocast's bf16 copies: each linear's input, and
  the compute copies of the weights autograd keeps until backward (the head; on one process the
  blocks' matrices and routers);
- buffers: the transients on top of that at the worst moment: FSDP2's gathered (unsharded) fp32 root
  (embedding, LM head) through forward and backward, two blocks' gathered parameters (current + prefetch)
  and one block's unsharded gradients before the reduce-scatter; one layer's expert forward and
  backward (fp32 weight-gradient accumulators, round buffers, and under ep the fixed all-to-all
  exchange and compute buffers of `ExpertParallelExperts`, sized by the capacity factor:
  `ladder.plan.expert_memory`); cross-entropy's backward over the logits; and with
  checkpointing the one layer being recomputed. The largest of these phases is what counts, plus,
  accumulating micro-batches under bf16 on one process or under expert parallelism, every layer's
  (local) expert stacks in bf16, held for the whole step (`rungs.held_weights.held_expert_weights`).

Left out: the CUDA context, NCCL's own buffers and allocator fragmentation (the `headroom`
fraction of device memory is kept free for them), the one-off model build before sharding, the
optimizer step's temporaries (distributed Muon's exchange buffers and Newton-Schulz workspace,
bounded by `rungs.muon.NS_CHUNK_BYTES` of matrices per batch), evaluation, and skew beyond one MoE
round (a skewed step costs rounds, not memory: `rungs.moe`). Checkpointing "selective" (recompute the attention
sub-layer in backward, keep its input) and "full" (keep each block's input, recompute the block)
are `rungs.model.Block`'s policies (config `activation_checkpointing`); the layout search prefers
none whenever it fits. Not modelled: the CPU sliding-window attention path (chunk copies a GPU kernel
does not make).

Checked against measurements at small shapes on CPU (tests/ladder/plan/test_memory.py: the real
tensors' bytes, autograd's saved tensors, torch's MemTracker peak over a step), within 15%: one
process (fp32 under each checkpointing, and bf16 autocast), 2 gloo ranks dp=2 and ep=2 (with and
without a capacity factor), and one expert-parallel layer call on its own. Those
shapes take the one-chunk loss; the many-chunk branch is counted from `rungs.loss`'s code.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from math import prod
from typing import Any

from ladder.errors import LadderInputError
from ladder.plan.expert_memory import expert_activations, expert_backward, expert_forward
from rungs.architecture import Architecture, layer_shapes, parameter_shapes
from rungs.loss_chunks import LOGITS_PER_CHUNK, max_chunk_tokens

__all__ = ["BF16_BYTES", "CHECKPOINTING", "FP32_BYTES", "INT64_BYTES", "LOGITS_PER_CHUNK", "LOSSES", "PRECISIONS",
           "Layout", "MemoryBreakdown", "job_loss", "memory_breakdown", "state_bytes"]

CHECKPOINTING = ("none", "selective", "full")
PRECISIONS = ("fp32", "bf16")
FP32_BYTES, BF16_BYTES, INT64_BYTES = 4, 2, 8
LOSSES = ("chunked", "logits")


@dataclass(frozen=True)
class Layout:
    """dp × ep ranks, the micro-batch each rank runs, activation checkpointing and precision."""

    dp: int
    ep: int
    micro_batch_sequences: int  # per rank and micro-batch (TrainConfig's is this × world)
    checkpointing: str = "none"
    precision: str = "bf16"
    # MoE capacity per round / balanced load (TrainConfig's capacity_factor; None: one round always
    # fits). Under ep it also caps each peer's rows a round, sizing the all-to-all buffers.
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        for name in ("dp", "ep", "micro_batch_sequences"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LadderInputError(f"must be a positive integer, got {value!r}", field=name)
        if self.checkpointing not in CHECKPOINTING:
            raise LadderInputError(f"must be one of {list(CHECKPOINTING)}, got {self.checkpointing!r}",
                                   field="checkpointing")
        if self.precision not in PRECISIONS:
            raise LadderInputError(f"must be one of {list(PRECISIONS)}, got {self.precision!r}", field="precision")
        factor = self.capacity_factor
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not (factor > 0 and math.isfinite(factor))):
            raise LadderInputError(f"must be a finite number > 0 or None, got {factor!r}", field="capacity_factor")

    @property
    def world(self) -> int:
        return self.dp * self.ep

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"world": self.world}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-rank bytes of one layout; `details` splits activations and buffers into their parts."""

    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int
    details: dict[str, int] = field(default_factory=dict)

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.states + self.activations + self.buffers

    def to_dict(self) -> dict[str, Any]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers, "total": self.total,
                "details": dict(self.details)}


@functools.lru_cache(maxsize=64)
def _shapes(arch: Architecture) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(parameter_shapes(arch).items())


@functools.lru_cache(maxsize=256)
def _biggest_block(arch: Architecture, experts_outside: bool) -> int:
    """Elements FSDP2 all-gathers for the largest block (expert stacks are outside FSDP under ep > 1)."""
    return max(sum(prod(s) for name, s in layer_shapes(arch, i).items()
                   if not (experts_outside and _role(name) == "expert_stack")) for i in range(arch.n_layers))


def _role(name: str) -> str:
    """The optimizer role of a parameter name (`rungs.optim`'s rules, without torch)."""
    if ".moe.experts.w_" in name:
        return "expert_stack"
    if name.endswith("norm.weight") or name in ("embed.weight", "lm_head.weight") or ".moe.router." in name:
        return "adamw"
    return "matrix"


def _sharded(shape: tuple[int, ...], world: int) -> int:
    """Elements one rank holds of an FSDP2 tensor sharded on dim 0 (ceil(rows / world) rows, padded)."""
    return math.ceil(shape[0] / world) * prod(shape[1:])


def state_bytes(arch: Architecture, layout: Layout, *, deferred_grads: bool = False) -> tuple[int, int, int]:
    """(params, grads, optimizer) bytes of one rank: fp32 master, fp32 gradients, Muon/AdamW states.

    `deferred_grads`: FSDP's gradient sync is off between micro-batches (`rungs.parallel.distributed.
    train_step`'s default when it accumulates), so each rank holds the unsharded fp32 gradients of
    every FSDP-sharded tensor until the last micro-batch reduces them."""
    params = grads = optimizer = 0
    for name, shape in _shapes(arch):
        role = _role(name)
        if role == "expert_stack" and layout.ep > 1:
            n = shape[0] // layout.ep * prod(shape[1:])  # whole experts, replicated over dp
            g = n
        else:
            n = _sharded(shape, layout.world)
            g = prod(shape) if deferred_grads and layout.world > 1 else n
        params += n * FP32_BYTES
        grads += g * FP32_BYTES
        optimizer += n * FP32_BYTES * (2 if role == "adamw" else 1)
    return params, grads, optimizer


def _layer_activations(arch: Architecture, layer: int, tokens: int, layout: Layout, *, lb_loss: bool,
                       z_loss: bool) -> dict[str, int]:
    """Bytes autograd saves in one block for `tokens` rows, by part (no checkpointing)."""
    bf16 = layout.precision == "bf16"
    a = BF16_BYTES if bf16 else FP32_BYTES  # matmul outputs and (under autocast) their inputs
    f = FP32_BYTES  # the residual stream, norms, softmax statistics and router scores stay fp32
    n, d, seq = tokens, arch.d_model, arch.seq_len
    kv = arch.n_kv_heads_global if arch.is_global_layer(layer) else arch.n_kv_heads_local
    q_width, kv_width = arch.n_heads * arch.head_dim, kv * arch.head_dim
    norm = 2 * n * d * f + n * f  # input rows, normalised rows, 1/rms
    # the norm's output, saved by wq/wk/wv (one tensor in fp32; one bf16 copy each under autocast),
    # RoPE's cos+i·sin tables for q and k, and flash attention's q, k, v, output and log-sum-exp
    attn_inputs = 3 * n * d * a if bf16 else n * d * f
    rope = 2 * seq * (arch.head_dim // 2) * 2 * f
    sdpa = (2 * n * q_width + 2 * n * kv_width) * a + n * arch.n_heads * f
    # router: its input (the norm's output in fp32, shared with the latent projection and the shared
    # expert; under autocast a bf16 copy for each of the three), probabilities, top-k, gates
    shared_inputs = 2 if arch.n_shared_experts else 0
    moe_inputs = (2 + shared_inputs) * n * d * a if bf16 else n * d * f
    router = n * arch.n_experts * f + n * arch.top_k * (INT64_BYTES + f) + 2 * n * f
    if z_loss:
        router += n * arch.n_experts * f + n * f
    lbl = n * arch.n_experts * f + n * f if lb_loss else 0
    lat = arch.latent_dim
    experts = expert_activations(*_expert_shape(arch), n, layout.ep, a, layout.capacity_factor)
    latent_up = n * lat * a if arch.has_latent_projection else 0
    shared = 4 * n * arch.shared_hidden * arch.n_shared_experts * a
    return {"attn_norm": norm, "attention": attn_inputs + rope + sdpa, "moe_norm": norm, "moe_inputs": moe_inputs,
            "router": router, "lb_loss": lbl, "experts": experts, "latent_up": latent_up, "shared_expert": shared}


def _checkpointed(parts: dict[str, int], tokens: int, arch: Architecture, checkpointing: str) -> int:
    """What one block keeps under `rungs.model.Block`'s checkpointing: "selective" recomputes the
    attention sub-layer (its input rows are kept), "full" the whole block (its input rows kept)."""
    kept_input = tokens * arch.d_model * FP32_BYTES
    if checkpointing == "full":
        return kept_input
    if checkpointing == "selective":
        return sum(parts.values()) - parts["attn_norm"] - parts["attention"] + kept_input
    return sum(parts.values())


def _expert_shape(arch: Architecture) -> tuple[int, int, int, int]:
    return arch.n_experts, arch.top_k, arch.latent_dim, arch.expert_hidden


def job_loss(layout: Layout) -> str:
    """The loss path the job takes: both the one-process step (`rungs.torch_engine`) and the sharded
    step (`rungs.parallel.distributed.train_step`) give the model the targets (chunked)."""
    return "chunked"


def memory_breakdown(arch: Architecture, layout: Layout, *, accumulation_steps: int = 1, defer_grad_sync: bool = True,
                     lb_loss: bool = True, z_loss: bool = False, loss: str | None = None,
                     device_memory_bytes: int | None = None) -> MemoryBreakdown:
    """Per-rank bytes of `arch` trained under `layout` (see the module docstring for what counts).

    `accumulation_steps` micro-batches per optimizer step; with more than one and `defer_grad_sync`
    (the sharded job's default) the gradients are held unsharded between micro-batches.
    `loss`: "chunked" (`rungs.loss.linear_cross_entropy`: the model takes the targets) or "logits"
    (the model returns (tokens, vocab) logits and the step takes their cross-entropy); None: what
    the job runs today (`job_loss`). `device_memory_bytes`: the device's memory, which sizes the
    chunked loss's chunks as the job does (`rungs.loss_chunks`; None: the CPU's chunk)."""
    loss = job_loss(layout) if loss is None else loss
    if arch.n_experts % layout.ep:
        raise LadderInputError(f"ep={layout.ep} must divide the {arch.n_experts} experts", field="ep")
    if loss not in LOSSES:
        raise LadderInputError(f"must be one of {list(LOSSES)}, got {loss!r}", field="loss")
    if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise LadderInputError(f"must be a positive integer, got {accumulation_steps!r}", field="accumulation_steps")
    params, grads, optimizer = state_bytes(arch, layout, deferred_grads=defer_grad_sync and accumulation_steps > 1)
    bf16 = layout.precision == "bf16"
    a = BF16_BYTES if bf16 else FP32_BYTES
    f = FP32_BYTES
    tokens = layout.micro_batch_sequences * arch.seq_len
    d, vocab = arch.d_model, arch.vocab_size
    shapes = _shapes(arch)

    layers = [_layer_activations(arch, i, tokens, layout, lb_loss=lb_loss, z_loss=z_loss) for i in range(arch.n_layers)]
    per_layer = [_checkpointed(p, tokens, arch, layout.checkpointing) for p in layers]
    head = tokens * INT64_BYTES + 2 * tokens * d * f + tokens * f  # token ids, the final norm
    chunk = max_chunk_tokens(vocab, device_memory_bytes)
    if loss == "chunked" and tokens > chunk:
        # the loss's gradients, made in forward and saved: d hidden (fp32 rows), d head weight (fp32,
        # accumulated inside its GEMM); one chunk at a time: its fp32 logits and log-probabilities
        # (then the gradient in the compute dtype, no larger), and under bf16 the head's weight cast once
        head_loss = tokens * d * f + vocab * d * f
        loss_transient = 2 * chunk * vocab * f + (vocab * d * a + chunk * d * a if bf16 else 0)
    elif loss == "chunked":
        # a micro-batch within one chunk takes the plain loss inside forward (rungs.loss): the head's
        # input and the fp32 log-probabilities are saved, the logits are not held
        head_loss = tokens * d * a + tokens * vocab * f
        loss_transient = tokens * vocab * (2 * f + (a if bf16 else 0))
    else:
        # the LM head's input, the logits the step holds, cross-entropy's fp32 log-probabilities;
        # backward: d log-probs and d logits in fp32 (and their cast under autocast)
        head_loss = tokens * d * a + tokens * vocab * (a + f)
        loss_transient = tokens * vocab * (2 * f + (a if bf16 else 0))
    plain_loss = loss == "logits" or tokens <= chunk  # the head's weight goes through F.linear under autocast
    sharded = layout.world > 1
    weights = 0
    if bf16:  # autocast's weight copies, saved until backward: the head (fp32 under FSDP too); on one
        # process the blocks' matrices and routers (FSDP's bf16 gathers are freed after forward instead).
        # The expert stacks are cast inside their autograd functions, in forward and again in backward.
        for name, shape in shapes:
            block_weight = _role(name) == "matrix" or ".moe.router." in name
            if (block_weight and not sharded) or (name == "lm_head.weight" and plain_loss):
                weights += prod(shape) * BF16_BYTES
    activations = sum(per_layer) + head + head_loss + weights

    gather = a  # the blocks' all-gather dtype (FSDP2's MixedPrecisionPolicy: bf16 parameters for compute)
    world_one = layout.world == 1
    # the root unit (embedding, final norm, head) stays fp32 and is gathered for the whole step
    root = 0 if world_one else sum(prod(s) for n, s in shapes if not n.startswith("layers.")) * FP32_BYTES
    biggest = 0 if world_one else _biggest_block(arch, layout.ep > 1)
    # forward: two blocks gathered (current + prefetch); backward: those, plus one block's unsharded
    # gradients (compute dtype, and fp32 for the reduce-scatter under bf16)
    fsdp_forward = 2 * biggest * gather
    fsdp_backward = 2 * biggest * gather + biggest * (a + (f if bf16 else 0))
    recompute = max(sum(p.values()) for p in layers) if layout.checkpointing != "none" else 0
    experts = _expert_shape(arch)
    # The root is gathered through forward and again once backward reaches the head, so not while
    # the loss's own backward (the step's cross-entropy over the logits) runs before it.
    phases = {
        "forward": root + fsdp_forward + expert_forward(*experts, tokens, layout.ep, a, layout.capacity_factor),
        "backward": root + fsdp_backward + expert_backward(*experts, tokens, layout.ep, a, layout.capacity_factor)
        + recompute,
        "loss": loss_transient,
    }
    # Accumulating under bf16 on one process or under expert parallelism, every layer's (local) expert
    # stacks are held in bf16 for the whole step (rungs.held_weights.held_expert_weights: cast once a step
    # instead of twice a micro-batch); FSDP-sharded stacks (ep 1 over several ranks) are not.
    held = (sum(prod(s) for n, s in shapes if _role(n) == "expert_stack") // layout.ep * BF16_BYTES
            if bf16 and (world_one or layout.ep > 1) and accumulation_steps > 1 else 0)
    buffers = max(phases.values()) + held
    details = {"activations_layers": sum(per_layer), "activations_head": head + head_loss,
               "activations_weight_copies": weights, "buffers_fsdp_root": root,
               **{f"buffers_{k}": v for k, v in phases.items()}, "buffers_held_expert_weights": held}
    return MemoryBreakdown(params, grads, optimizer, activations, buffers, details)
