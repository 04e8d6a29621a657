"""Muon + AdamW by parameter role for the JAX engine, with `rungs.optim`'s schedule, decay masks and
global-norm clipping, as one optax transformation whose LR and WD are traced values.

Roles come from `rungs.optim.param_role` applied to the same state-dict names (the JAX parameters
are a flat dict under those names), so the two engines cannot disagree on a role: matrix and
expert_stack go to `rungs.jaxjob.muon.muon`, everything else to AdamW, through `optax.partition`.
Decay is decoupled on both sides (W <- W (1 - lr wd) - lr step), masked by role exactly as
`rungs.optim.build_optimizer` sets each group's weight_decay.

One compiled step serves a whole LR/WD grid: `lr`, `adam_lr` and `weight_decay` live in the
optimizer state (`optax.inject_hyperparams`) as float32 arrays, so a new value is new data, not a
new trace; `with_hyperparams` swaps them. The schedule multiplier is `lr_multiplier` of the update
count (the 0-based step, as `rungs.optim.lr_at` takes it), so the count in a checkpoint carries it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from rungs.jaxjob.muon import SIMPLE_COEFFICIENTS, muon
from rungs.optim import ADAMW_ROLES, DEFAULT_NO_DECAY_ROLES, MUON_ROLES, OptimConfigError, lr_at, param_role

__all__ = ["OptimConfigError", "Schedule", "build_optimizer", "clip_by_global_norm", "decay_mask", "global_norm",
           "hyperparams", "lr_multiplier", "param_roles", "with_hyperparams"]

HYPERPARAMS = ("lr", "adam_lr", "weight_decay")


class _Shape(NamedTuple):
    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _as_shaped(value: Any) -> Any:
    return _Shape(tuple(value)) if isinstance(value, (tuple, list)) else value


def param_roles(params: Mapping[str, Any]) -> dict[str, str]:
    """name -> optimizer role, for a dict of arrays (or of shapes) keyed by state-dict names."""
    return {name: param_role(name, _as_shaped(p)) for name, p in params.items()}


def decay_mask(roles: Mapping[str, str], no_decay_roles: Iterable[str] = DEFAULT_NO_DECAY_ROLES) -> dict[str, bool]:
    """name -> whether weight decay applies (rungs.optim: decay on every role not in no_decay_roles)."""
    no_decay = set(no_decay_roles)
    unknown = no_decay - set(MUON_ROLES) - set(ADAMW_ROLES)
    if unknown:
        raise OptimConfigError(f"no_decay_roles has unknown roles {sorted(unknown)}")
    return {name: role not in no_decay for name, role in roles.items()}


class Schedule(NamedTuple):
    """`rungs.optim.lr_at`'s arguments (the train config's schedule fields)."""

    total_steps: int
    warmup_steps: int
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    decay_fraction: float = 0.2

    def validate(self) -> Schedule:
        lr_at(0, **self._asdict())                                           # raises OptimConfigError
        return self


def lr_multiplier(step: jax.Array, schedule: Schedule) -> jax.Array:
    """`rungs.optim.lr_at(step, ...)` for a traced 0-based step (float32)."""
    total, warmup = schedule.total_steps, schedule.warmup_steps
    s = jnp.asarray(step).astype(jnp.float32)
    low = schedule.min_lr_ratio
    if schedule.schedule == "cosine":
        progress = jnp.minimum(1.0, (s - warmup) / max(1, total - warmup))
        after = low + (1 - low) * 0.5 * (1 + jnp.cos(math.pi * progress))
    else:
        decay_start = max(warmup, total - schedule.decay_fraction * total)
        progress = jnp.minimum(1.0, (s - decay_start) / max(1e-12, total - decay_start))
        after = jnp.where(s < decay_start, 1.0, 1.0 - (1.0 - low) * progress)
    if warmup == 0:
        return after
    return jnp.where(s < warmup, (s + 1) / warmup, after)


def global_norm(grads: Any) -> jax.Array:
    """L2 norm over every leaf (float32)."""
    leaves = jax.tree.leaves(grads)
    return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves))


def clip_by_global_norm(grads: Any, max_norm: float | jax.Array) -> tuple[Any, jax.Array]:
    """`rungs.optim.clip_grad_norm_`: scale by max_norm / (norm + 1e-6) when the norm is finite and
    above max_norm; returns (gradients, norm before clipping). optax.clip_by_global_norm differs
    (no 1e-6, and it scales non-finite norms)."""
    norm = global_norm(grads)
    scale = jnp.where(jnp.isfinite(norm) & (norm > max_norm), max_norm / (norm + 1e-6), 1.0)
    return jax.tree.map(lambda g: (g * scale.astype(g.dtype)).astype(g.dtype), grads), norm


def build_optimizer(params: Mapping[str, Any], *, lr: float, weight_decay: float, schedule: Schedule,
                    adam_lr: float | None = None, adam_betas: tuple[float, float] = (0.9, 0.95),
                    adam_eps: float = 1e-8, muon_momentum: float = 0.95, adjust_lr: str = "match_rms_adamw",
                    no_decay_roles: Iterable[str] = DEFAULT_NO_DECAY_ROLES, nesterov: bool = True,
                    ns_steps: int = 5, ns_coefficients=SIMPLE_COEFFICIENTS,
                    ns_dtype: Any = jnp.bfloat16) -> optax.GradientTransformation:
    """`rungs.optim.build_optimizer` + `lr_at` for a flat dict of parameters keyed by state-dict names.

    Per step t (0-based update count) with m = lr_multiplier(t): Muon roles take lr * m, AdamW
    roles adam_lr * m (adam_lr defaults to lr, the "match_rms_adamw" convention); decay
    weight_decay where `decay_mask` says so. Clip gradients first with `clip_by_global_norm`.
    The returned transformation's state holds lr, adam_lr and weight_decay (`hyperparams`)."""
    if lr < 0 or weight_decay < 0 or (adam_lr is not None and adam_lr < 0):
        raise OptimConfigError(f"learning rates and weight decay must be >= 0, got lr={lr}, adam_lr={adam_lr}, "
                               f"weight_decay={weight_decay}")
    schedule = Schedule(*schedule).validate()
    roles = param_roles(params)
    decay = decay_mask(roles, no_decay_roles)
    labels = {name: "muon" if role in MUON_ROLES else "adamw" for name, role in roles.items()}
    b1, b2 = adam_betas

    def mask(tree):  # the tree partition hands each side (the other side's leaves masked out)
        return {name: decay[name] for name in tree}

    def factory(lr, adam_lr, weight_decay):
        def rate(peak):
            return lambda count: peak * lr_multiplier(count, schedule)

        return optax.partition({
            "muon": muon(rate(lr), weight_decay, weight_decay_mask=mask, momentum=muon_momentum,
                         nesterov=nesterov, ns_steps=ns_steps, ns_coefficients=ns_coefficients,
                         ns_dtype=ns_dtype, adjust_lr=adjust_lr),
            "adamw": optax.chain(optax.scale_by_adam(b1, b2, adam_eps),
                                 optax.add_decayed_weights(weight_decay, mask),
                                 optax.scale_by_learning_rate(rate(adam_lr))),
        }, labels)

    return optax.inject_hyperparams(factory, hyperparam_dtype=jnp.float32)(
        lr=lr, adam_lr=lr if adam_lr is None else adam_lr, weight_decay=weight_decay)


def hyperparams(state: Any) -> dict[str, jax.Array]:
    """The traced lr, adam_lr and weight_decay of a `build_optimizer` state."""
    return dict(state.hyperparams)


def with_hyperparams(state: Any, **values: float | jax.Array) -> Any:
    """A copy of a `build_optimizer` state with some of lr, adam_lr, weight_decay replaced (same
    shapes and dtypes, so a jitted step does not recompile)."""
    unknown = set(values) - set(HYPERPARAMS)
    if unknown:
        raise OptimConfigError(f"unknown optimizer hyperparameter(s) {sorted(unknown)}; known: {list(HYPERPARAMS)}")
    new = dict(state.hyperparams)
    for key, value in values.items():
        new[key] = jnp.asarray(value, dtype=new[key].dtype)
    return state._replace(hyperparams=new)
