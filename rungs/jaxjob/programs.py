"""The two programs of one JAX training step, built from a config: gradients and update.

`JaxEngine` compiles these (`jax.jit(...).lower(...).compile()`), and `benchmarks/jax_memory.py`
compiles the same functions on abstract arguments (`abstract_arguments`: no array is allocated) to
read XLA's memory analysis of a rung that does not fit the machine it runs on; what it measures is
what the engine runs.

- `grads_function`: (params, AGC probes, buffers, AGC thresholds, inputs, targets) → (gradients,
  AGC readout, step statistics): the loss of `rungs.jaxjob.model.loss` in the compute dtype, over
  fp32 master weights, scaled by 1 / accumulation steps.
- `update_function`: (params, optimizer state, gradients) → (params, state, gradient norm): global
  norm clipping, then Muon + AdamW by role.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rungs.jaxjob import model as jmodel
from rungs.jaxjob.agc import AGC
from rungs.jaxjob.optim import clip_by_global_norm, global_norm
from rungs.jaxjob.params import bias_name, shapes

__all__ = ["MemoryFigures", "abstract_arguments", "grads_function", "memory_figures", "update_function"]


def grads_function(cfg: Any, agc: AGC | None, compute_dtype: Any, *, param_shardings: Any = None,
                   moe_backend: str | None = None) -> Callable:
    """The gradient program of `cfg` (a `rungs.config.TrainConfig`). `moe_backend`: the routed
    experts' grouped-matmul path (`rungs.jaxjob.moe.BACKENDS`; None: the platform's default)."""
    arch = cfg.architecture()
    scale = 1.0 / cfg.accumulation_steps

    def objective(params, probes, buffers, thresholds, inputs, targets):
        params = jmodel.compute_params(params, compute_dtype)  # bf16: matmuls in bf16, master weights fp32
        clip = agc.bind(probes, thresholds) if agc is not None else None
        total, stats = jmodel.loss(params, buffers, inputs, targets, arch, cfg.lb_loss_coef, cfg.z_loss_coef,
                                   clip=clip, backend=moe_backend)
        return total * scale, stats

    def grads(params, probes, buffers, thresholds, inputs, targets):
        (_, stats), (g, readout) = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(
            params, probes, buffers, thresholds, inputs, targets)
        if param_shardings is not None:  # gradients laid out as their parameters (reduce-scattered)
            g = jax.lax.with_sharding_constraint(g, param_shardings)
        return g, readout, stats

    return grads


def update_function(cfg: Any, tx: optax.GradientTransformation) -> Callable:
    """The update program: clip the global norm (`cfg.grad_clip`, None: measure only), then `tx`."""
    def update(params, opt_state, g):
        if cfg.grad_clip is not None:
            g, norm = clip_by_global_norm(g, cfg.grad_clip)
        else:
            norm = global_norm(g)
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, norm

    return update


def abstract_arguments(cfg: Any, agc: AGC | None) -> tuple:
    """`grads_function`'s arguments as shapes and dtypes (one micro-batch), nothing allocated."""
    arch = cfg.architecture()
    micro = cfg.micro_batch_sequences or cfg.batch_sequences
    params = {n: jax.ShapeDtypeStruct(s, jnp.float32) for n, s in shapes(arch).items()}
    buffers = {bias_name(i): jax.ShapeDtypeStruct((arch.n_experts,), jnp.float32) for i in range(arch.n_layers)}
    probes = thresholds = None
    if agc is not None:
        probes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), agc.probes(arch.n_layers, micro,
                                                                                            cfg.seq_len))
        thresholds = jax.ShapeDtypeStruct((arch.n_layers, len(agc.points)), jnp.float32)
    tokens = jax.ShapeDtypeStruct((micro, cfg.seq_len), jnp.int32)
    return params, probes, buffers, thresholds, tokens, tokens


@dataclass(frozen=True)
class MemoryFigures:
    """XLA's memory analysis of one compiled program, in bytes (`Compiled.memory_analysis()`)."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int      # outputs written into donated arguments (counted once, in the arguments)
    temp_bytes: int

    @property
    def total_bytes(self) -> int:
        """Arguments, outputs and temporaries, donated outputs counted once."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def as_dict(self) -> dict[str, int]:
        return {"argument_bytes": self.argument_bytes, "output_bytes": self.output_bytes,
                "alias_bytes": self.alias_bytes, "temp_bytes": self.temp_bytes, "total_bytes": self.total_bytes}


def memory_figures(compiled: Any) -> MemoryFigures:
    m = compiled.memory_analysis()
    return MemoryFigures(int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.alias_size_in_bytes),
                         int(m.temp_size_in_bytes))
