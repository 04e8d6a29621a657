"""Parameters of the JAX rung model: a flat dict keyed by the PyTorch state-dict names.

Names, shapes and layouts are those of `rungs.model.Transformer` (Linear weights are (out, in),
expert stacks (E, hidden, latent) and (E, latent, hidden)), so the shapes come straight from
`rungs.architecture.parameter_shapes` and a torch state dict converts by identity. The routers'
aux-loss-free expert biases are buffers, not parameters: they live in a second dict under their
state-dict names (`layers.{i}.moe.router.expert_bias`), which no optimizer sees.

`cfg` everywhere is a `rungs.model.ModelConfig` or any object with the same fields; nothing here
imports torch except the two conversion functions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rungs.architecture import Architecture, init_std, parameter_shapes

__all__ = ["Params", "Buffers", "shapes", "init_std", "init_params", "init_buffers",
           "from_torch_state_dict", "to_torch_state_dict"]

Params = dict[str, jax.Array]
Buffers = dict[str, jax.Array]

_ARCH_FIELDS = tuple(Architecture.__dataclass_fields__)


def architecture(cfg: Any) -> Architecture:
    return Architecture(**{f: getattr(cfg, f) for f in _ARCH_FIELDS})


def shapes(cfg: Any) -> dict[str, tuple[int, ...]]:
    """Every trainable tensor by state-dict name: `rungs.architecture.parameter_shapes` by identity."""
    return parameter_shapes(architecture(cfg))


def bias_name(layer: int) -> str:
    return f"layers.{layer}.moe.router.expert_bias"


def init_params(cfg: Any, key: jax.Array, dtype=jnp.float32) -> Params:
    """Fresh parameters by the torch model's rule (`rungs.architecture.init_std`); tensor i draws from
    fold_in(key, i)."""
    out: Params = {}
    for i, (name, shape) in enumerate(shapes(cfg).items()):
        std = init_std(name, cfg)
        if std is None:
            out[name] = jnp.ones(shape, dtype)
        else:
            out[name] = std * jax.random.normal(jax.random.fold_in(key, i), shape, dtype)
    return out


def init_buffers(cfg: Any) -> Buffers:
    """Zero expert biases, one (E,) vector per layer, as the torch routers register them."""
    return {bias_name(i): jnp.zeros((cfg.n_experts,), jnp.float32) for i in range(cfg.n_layers)}


def from_torch_state_dict(state: dict, cfg: Any) -> tuple[Params, Buffers]:
    """A `Transformer.state_dict()` → (params, buffers); refuses missing, extra or misshapen tensors."""
    want = shapes(cfg)
    buffers = {bias_name(i) for i in range(cfg.n_layers)}
    extra = set(state) - set(want) - buffers
    missing = set(want) - set(state)
    if extra or missing:
        raise ValueError(f"state dict does not match the config: missing {sorted(missing)}, "
                         f"unexpected {sorted(extra)}")
    params: Params = {}
    for name, shape in want.items():
        array = state[name].detach().cpu().float().numpy()
        if array.shape != shape:
            raise ValueError(f"{name}: shape {array.shape}, the config needs {shape}")
        params[name] = jnp.asarray(array)
    biases = {n: jnp.asarray(state[n].detach().cpu().float().numpy()) if n in state
              else jnp.zeros((cfg.n_experts,), jnp.float32) for n in sorted(buffers)}
    return params, biases


def to_torch_state_dict(params: Params, buffers: Buffers | None = None) -> dict:
    """(params, buffers) → a dict of torch tensors `Transformer.load_state_dict` accepts."""
    import torch

    state = {n: torch.from_numpy(np.array(a, dtype=np.float32)) for n, a in params.items()}
    for n, a in (buffers or {}).items():
        state[n] = torch.from_numpy(np.array(a, dtype=np.float32))
    return state
