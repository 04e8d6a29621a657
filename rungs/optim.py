"""Muon + AdamW chosen by parameter role (by name, never by shape), LR schedules, grad clipping.

Roles (names per the state-dict contract shared with `ladder/plan/counting.py`):
    matrix        attn.w{q,k,v,o}, moe.shared.w_*, moe.latent_{down,up}   -> Muon
    expert_stack  moe.experts.w_{gate,up,down} (E, out, in)               -> Muon, one matrix per expert
    embedding     embed.weight                                            -> AdamW
    lm_head       lm_head.weight (2-D, yet AdamW: its rows are per-token) -> AdamW
    norm          *_norm.weight, final_norm.weight                        -> AdamW
    router        moe.router.weight                                       -> AdamW
    bias          *.bias                                                  -> AdamW

Weight decay (default): decoupled decay on the Muon roles (matrix, expert_stack) only; none on
embedding, lm_head, norm, router, bias. Why: every Muon matrix feeds a normalisation downstream
(the next RMSNorm of the residual stream), so decay bounds its scale without limiting what the
network can express; the LM head's scale is the logit temperature, so decaying it caps how
confident the model may be: on the smallest cpu-demo rung with the recipe's LR*WD law (150 steps)
held-out BPB / unigram BPB was 0.815-0.859 with the head decayed and 0.763-0.821 without. An
embedding row only receives gradient when its token occurs, so decay shrinks rare tokens' rows
with nothing pulling back; norm gains and biases are scale/offset parameters (Moonlight does decay
norms: pass `no_decay_roles` to change it); decaying the router would push routing towards uniform
independent of the balancing terms that govern it. With the "match_rms_adamw" convention AdamW and
Muon share lr and weight decay (Moonlight), so `adam_lr` defaults to `lr`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from rungs.muon import Muon

__all__ = ["MUON_ROLES", "MuonAdamW", "OptimConfigError", "adamw_implementation", "build_optimizer",
           "clip_grad_norm_", "lr_at", "param_role"]

MUON_ROLES = ("matrix", "expert_stack")
ADAMW_ROLES = ("embedding", "lm_head", "norm", "router", "bias")
DEFAULT_NO_DECAY_ROLES = ("embedding", "lm_head", "norm", "router", "bias")

# (pattern on the name with wrapper prefixes stripped, role, required ndim)
_RULES: list[tuple[re.Pattern, str, int | None]] = [
    (re.compile(r"(.*\.)?bias$"), "bias", None),
    (re.compile(r"^embed\.weight$"), "embedding", 2),
    (re.compile(r"^lm_head\.weight$"), "lm_head", 2),
    (re.compile(r"^(final_norm|layers\.\d+\.(attn_norm|moe_norm))\.weight$"), "norm", 1),
    (re.compile(r"^layers\.\d+\.moe\.router\.weight$"), "router", 2),
    (re.compile(r"^layers\.\d+\.moe\.experts\.w_(gate|up|down)$"), "expert_stack", 3),
    (re.compile(r"^layers\.\d+\.attn\.w[qkvo]\.weight$"), "matrix", 2),
    (re.compile(r"^layers\.\d+\.moe\.shared\.w_(gate|up|down)\.weight$"), "matrix", 2),
    (re.compile(r"^layers\.\d+\.moe\.latent_(down|up)\.weight$"), "matrix", 2),
]
_WRAPPER_PREFIX = re.compile(r"^((_orig_mod|module|_fsdp_wrapped_module|_checkpoint_wrapped_module)\.)+")


class OptimConfigError(ValueError):
    """A parameter without a role, or an invalid optimizer / schedule setting."""


def param_role(name: str, param: Tensor) -> str:
    """The optimizer role of a parameter, from its state-dict name (checked against its ndim)."""
    bare = _WRAPPER_PREFIX.sub("", name)
    for pattern, role, ndim in _RULES:
        if pattern.match(bare):
            if ndim is not None and param.ndim != ndim:
                raise OptimConfigError(f"parameter {name!r} looks like a {role} but has shape {tuple(param.shape)} "
                                       f"(expected {ndim}-D)")
            return role
    raise OptimConfigError(f"parameter {name!r} (shape {tuple(param.shape)}) has no optimizer role; "
                           f"add a rule in rungs/optim.py")


class MuonAdamW:
    """Muon and AdamW behind one optimizer interface; param_groups is every group of both."""

    def __init__(self, muon: Muon | None, adamw: torch.optim.AdamW | None):
        self.muon, self.adamw = muon, adamw
        self.convention = muon.convention if muon is not None else "none (no Muon parameters)"

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.muon, self.adamw) if o is not None]

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for o in self.optimizers for p, s in o.state.items()}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.optimizers:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def set_lr_multiplier(self, multiplier: float) -> None:
        """lr of every group = its initial_lr * multiplier (what a schedule from `lr_at` applies)."""
        for g in self.param_groups:
            g["lr"] = g["initial_lr"] * multiplier

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict() if self.muon else None,
                "adamw": self.adamw.state_dict() if self.adamw else None, "convention": self.convention}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict.get("convention") != self.convention:
            raise OptimConfigError(f"optimizer state uses update scale {state_dict.get('convention')!r}, "
                                   f"this optimizer uses {self.convention!r}")
        for key, opt in (("muon", self.muon), ("adamw", self.adamw)):
            if (state_dict[key] is None) != (opt is None):
                raise OptimConfigError(f"optimizer state has{'' if state_dict[key] else ' no'} {key} part, "
                                       f"this model differs")
            if opt is not None:
                opt.load_state_dict(state_dict[key])


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, adam_lr: float | None = None,
                    adam_betas: tuple[float, float] = (0.9, 0.95), adam_eps: float = 1e-8,
                    muon_momentum: float = 0.95, adjust_lr: str = "match_rms_adamw",
                    no_decay_roles: Iterable[str] = DEFAULT_NO_DECAY_ROLES) -> MuonAdamW:
    """One param group per role present (each with "role", "lr", "initial_lr", "weight_decay")."""
    if lr < 0 or weight_decay < 0 or (adam_lr is not None and adam_lr < 0):
        raise OptimConfigError(f"learning rates and weight decay must be >= 0, got lr={lr}, adam_lr={adam_lr}, "
                               f"weight_decay={weight_decay}")
    no_decay = set(no_decay_roles)
    unknown = no_decay - set(MUON_ROLES) - set(ADAMW_ROLES)
    if unknown:
        raise OptimConfigError(f"no_decay_roles has unknown roles {sorted(unknown)}")
    adam_lr = lr if adam_lr is None else adam_lr
    by_role: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            by_role.setdefault(param_role(name, p), []).append(p)

    def groups(roles, base_lr):
        return [{"params": by_role[r], "role": r, "lr": base_lr, "initial_lr": base_lr,
                 "weight_decay": 0.0 if r in no_decay else weight_decay} for r in roles if r in by_role]

    muon_groups, adam_groups = groups(MUON_ROLES, lr), groups(ADAMW_ROLES, adam_lr)
    muon = Muon(muon_groups, lr=lr, weight_decay=weight_decay, momentum=muon_momentum,
                adjust_lr=adjust_lr) if muon_groups else None
    adamw = torch.optim.AdamW(adam_groups, lr=adam_lr, betas=adam_betas, eps=adam_eps, weight_decay=weight_decay,
                              **adamw_implementation([p for g in adam_groups for p in g["params"]])) if adam_groups else None
    return MuonAdamW(muon, adamw)


def adamw_implementation(params: list[Tensor]) -> dict[str, bool]:
    """AdamW's kernels: fused (one kernel per step for every tensor of a dtype) where every parameter
    is a floating CUDA tensor, the multi-tensor (foreach) path elsewhere. The embedding and head of
    mai-base-2 L18 are 400M float32 values: the per-tensor loop torch picks by default off CUDA, and
    the foreach path everywhere, read and write them several times a step; fused reads each state
    once (torch.optim.AdamW's `fused`)."""
    if params and all(p.is_cuda and p.is_floating_point() for p in params):
        return {"fused": True}
    return {"foreach": True}


def lr_at(step: int, *, total_steps: int, warmup_steps: int, schedule: str = "cosine",
          min_lr_ratio: float = 0.1, decay_fraction: float = 0.2) -> float:
    """LR multiplier in [0, 1] for 0-based `step`.

    Warmup: (step + 1) / warmup_steps for step < warmup_steps. Then
    cosine: min + (1 - min) * (1 + cos(pi * p)) / 2, p = (step - warmup) / (total - warmup);
    wsd: 1 until the last decay_fraction * total steps, then linear down to min_lr_ratio at total.
    """
    if total_steps < 1 or not 0 <= warmup_steps <= total_steps or step < 0:
        raise OptimConfigError(f"need total_steps >= 1, 0 <= warmup_steps <= total_steps and step >= 0; "
                               f"got step={step}, total_steps={total_steps}, warmup_steps={warmup_steps}")
    if not 0 <= min_lr_ratio <= 1 or not 0 < decay_fraction <= 1:
        raise OptimConfigError(f"min_lr_ratio must be in [0, 1] and decay_fraction in (0, 1], "
                               f"got {min_lr_ratio}, {decay_fraction}")
    if schedule not in ("cosine", "wsd"):
        raise OptimConfigError(f"schedule must be 'cosine' or 'wsd', got {schedule!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    decay_start = max(warmup_steps, total_steps - decay_fraction * total_steps)
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start) / max(1e-12, total_steps - decay_start))
    return 1.0 - (1.0 - min_lr_ratio) * progress


def clip_grad_norm_(model_or_params: nn.Module | Iterable[Tensor], max_norm: float) -> float:
    """Scale all weight gradients so their global L2 norm is <= max_norm; returns the norm before
    clipping (max_norm = inf only measures). Non-finite norms are returned, gradients left as is."""
    return float(clip_grad_norm_on_device_(model_or_params, max_norm))


def clip_grad_norm_on_device_(model_or_params: nn.Module | Iterable[Tensor], max_norm: float) -> Tensor:
    """`clip_grad_norm_` without a host read: the norm stays a 0-d device tensor and the scale is
    applied on the device (1 where the norm is within `max_norm` or not finite), so a training step
    can read it once at its end (no host synchronisation inside the step)."""
    params = model_or_params.parameters() if isinstance(model_or_params, nn.Module) else model_or_params
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.zeros(())
    if max_norm <= 0:
        raise OptimConfigError(f"max_norm must be > 0, got {max_norm}")
    grads = [p.grad for p in params]
    norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=True)
    if math.isfinite(max_norm):
        clip = torch.isfinite(norm) & (norm > max_norm)
        scale = torch.where(clip, max_norm / (norm.double() + 1e-6), 1.0)
        torch._foreach_mul_(grads, scale.to(grads[0].dtype))
    return norm
