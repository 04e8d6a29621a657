"""Top-k token-choice router, load-balancing loss, z-loss, aux-loss-free expert bias.

The router's GEMM runs in the compute dtype (bf16 under autocast, as torchtitan's router does; the
parameters' dtype otherwise, TF32 where the job enables it); its logits are cast to fp32 before the
softmax or sigmoid, the top-k and the gates, which are all fp32.

Load-balancing loss (Switch Transformer / Megatron `switch_load_balancing_loss_func`, coefficient-free):

    f_{l,i} = n_{l,i} / sum_j n_{l,j}      fraction of layer l's (token, slot) assignments to expert i
    P_{l,i} = mean_t p_{l,t,i}             mean router probability of expert i (p normalised over experts)
    LBL     = (1 / L) * sum_l  E * sum_i f_{l,i} * P_{l,i}

It equals 1 at perfect balance (f = P = 1/E) for any k, and E (its maximum) when every token goes to
one expert with probability 1. f carries no gradient; P does. All layers' counts are stacked into
one (L, E) tensor first, so a distributed job sums them with ONE all-reduce (`reduce_fn`) per step,
making f the fraction over every data-parallel rank's tokens (Megatron's "global" aux loss) while P
stays local. Under gradient accumulation the loss is formed per micro-batch (its backward runs before
the next micro-batch is routed), so f is the micro-batch's across ranks, not the whole batch's: with
`lb_loss_coef` > 0, `micro_batch_sequences` changes the router's balancing gradient (as in Megatron,
whose aux loss is per micro-batch too), while the task loss's gradient is the full batch's.

z-loss (ST-MoE): mean over layers and tokens of logsumexp(logits)^2.

Aux-loss-free balancing (DeepSeek-V3): a per-expert bias buffer added to the scores for top-k
selection only (gates come from the unbiased scores); once per optimizer step
b += rate * sign(mean(n) - n_i), then b -= mean(b update) so it stays mean-zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rungs.moe import count_per_expert

__all__ = ["RouterConfigError", "RouterOutput", "Router", "load_balancing_loss", "recomputing", "z_loss"]

# True while activation checkpointing recomputes a forward in backward (rungs.model.Block): the
# tokens were counted once already, in the forward that is being replayed.
_RECOMPUTING: ContextVar[bool] = ContextVar("rungs_router_recomputing", default=False)


@contextmanager
def recomputing() -> Iterator[None]:
    """Within it, routers add nothing to their pending counts (a checkpoint's recompute context)."""
    token = _RECOMPUTING.set(True)
    try:
        yield
    finally:
        _RECOMPUTING.reset(token)


class RouterConfigError(ValueError):
    """Invalid router configuration or inputs."""


class RouterOutput(NamedTuple):
    expert_idx: Tensor          # (T, k) long: selected experts, in descending selection score
    gate: Tensor                # (T, k) fp32: combine weights (normalised top-k probabilities)
    probs: Tensor               # (T, E) fp32: softmax or sigmoid scores, no bias
    logits: Tensor              # (T, E) fp32 (from a GEMM in the compute dtype)
    tokens_per_expert: Tensor   # (E,) long: assignments this call, before any capacity


class Router(nn.Module):
    """logits = x W^T in the compute dtype, then fp32; scores = softmax or sigmoid; top-k on scores + bias.

    Gates are the selected unbiased scores, normalised to sum to 1 over the k slots (normalize_gates,
    by default where top_k > 1). With top_k=1 normalising makes every gate 1 and the router learns
    only from the balancing terms, so one slot's gate is its score unnormalised (Switch Transformer's
    choice) unless normalize_gates=True is asked for.
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, *, score: str = "softmax",
                 expert_bias: bool = False, bias_update_rate: float = 1e-3, normalize_gates: bool | None = None):
        super().__init__()
        if score not in ("softmax", "sigmoid"):
            raise RouterConfigError(f"score must be 'softmax' or 'sigmoid', got {score!r}")
        if not 1 <= top_k <= n_experts:
            raise RouterConfigError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        if d_model < 1 or bias_update_rate < 0:
            raise RouterConfigError(f"d_model must be >= 1 and bias_update_rate >= 0, "
                                    f"got {d_model}, {bias_update_rate}")
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.score, self.use_expert_bias, self.bias_update_rate = score, expert_bias, bias_update_rate
        self.normalize_gates = top_k > 1 if normalize_gates is None else normalize_gates
        self.weight = nn.Parameter(torch.empty(n_experts, d_model))
        self.register_buffer("expert_bias", torch.zeros(n_experts))
        # Assignment counts accumulated over the micro-batches of one optimizer step (training only).
        self.register_buffer("pending_counts", torch.zeros(n_experts, dtype=torch.long), persistent=False)
        if not self.weight.is_meta:  # on the meta device (the model's build) there is nothing to draw
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """A router built on its own (tests, benchmarks) draws N(0, 1/d_model). Inside the model it is
        built on the meta device, where this draws nothing: the model's one policy
        (`rungs.architecture.init_std`, applied by `Transformer.init_weights`) is its only init."""
        nn.init.normal_(self.weight, std=self.d_model ** -0.5)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_experts={self.n_experts}, top_k={self.top_k}, score={self.score}, "
                f"expert_bias={self.use_expert_bias}")

    def forward(self, x: Tensor) -> RouterOutput:
        if x.ndim != 2 or x.shape[1] != self.d_model:
            raise RouterConfigError(f"router input must be (T, {self.d_model}), got {tuple(x.shape)}")
        # Under autocast F.linear casts both to bf16 (x usually is already); without it x takes the
        # weight's dtype.
        if not torch.is_autocast_enabled(x.device.type):
            x = x.to(self.weight.dtype)
        logits = F.linear(x, self.weight)                                       # (T, E), compute dtype
        with torch.autocast(x.device.type, enabled=False):
            logits = logits.float()                                              # (T, E) fp32
            probs = logits.softmax(-1) if self.score == "softmax" else logits.sigmoid()
            select = probs + self.expert_bias if self.use_expert_bias else probs
            expert_idx = select.topk(self.top_k, dim=-1).indices              # (T, k)
            gate = probs.gather(-1, expert_idx)
            if self.normalize_gates:
                gate = gate / gate.sum(-1, keepdim=True).clamp_min(torch.finfo(gate.dtype).tiny)
        counts = count_per_expert(expert_idx, self.n_experts)
        if self.training and torch.is_grad_enabled() and not _RECOMPUTING.get():
            self.pending_counts += counts
        return RouterOutput(expert_idx, gate, probs, logits, counts)

    @torch.no_grad()
    def update_bias(self, counts: Tensor | None = None) -> Tensor:
        """One aux-loss-free bias step from `counts` (default: the counts accumulated since the last
        call, which are then reset). Returns the applied (mean-zero) update."""
        if counts is None:
            counts = self.pending_counts.clone()
        self.pending_counts.zero_()
        if not self.use_expert_bias:
            raise RouterConfigError("update_bias called on a router built with expert_bias=False")
        counts = counts.to(self.expert_bias.device, torch.float32)
        if counts.shape != (self.n_experts,):
            raise RouterConfigError(f"counts must be ({self.n_experts},), got {tuple(counts.shape)}")
        delta = self.bias_update_rate * torch.sign(counts.mean() - counts)
        delta -= delta.mean()
        self.expert_bias += delta
        return delta


def _require_layers(outputs: Sequence[RouterOutput]) -> None:
    if not outputs:
        raise RouterConfigError("need at least one layer's RouterOutput")


def load_balancing_loss(outputs: Sequence[RouterOutput], n_experts: int, top_k: int,
                        reduce_fn: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """E * sum_i f_i P_i averaged over layers (see module docstring); one stacked reduction.

    `reduce_fn` (e.g. an all-reduce SUM over data-parallel ranks) is applied once to the stacked
    (L, E) counts. `top_k` is only checked: f is normalised by the actual number of assignments.
    """
    _require_layers(outputs)
    if any(o.probs.shape[-1] != n_experts or o.expert_idx.shape[-1] != top_k for o in outputs):
        raise RouterConfigError(f"every RouterOutput must have E={n_experts} and k={top_k}")
    counts = torch.stack([o.tokens_per_expert for o in outputs]).float()   # (L, E)
    if reduce_fn is not None:
        counts = reduce_fn(counts)
    f = counts / counts.sum(-1, keepdim=True).clamp_min(1.0)
    if len({o.probs.shape for o in outputs}) == 1:
        probs = torch.stack([o.probs for o in outputs])                          # (L, T, E)
        p = (probs / probs.sum(-1, keepdim=True)).mean(1)                        # (L, E)
    else:
        p = torch.stack([(o.probs / o.probs.sum(-1, keepdim=True)).mean(0) for o in outputs])
    return n_experts * (f * p).sum(-1).mean()


def z_loss(outputs: Sequence[RouterOutput]) -> Tensor:
    """Mean over layers and tokens of logsumexp(logits)^2 (ST-MoE router z-loss, coefficient-free)."""
    _require_layers(outputs)
    return torch.stack([torch.logsumexp(o.logits, -1).square().mean() for o in outputs]).mean()
