"""The routed experts' gradient program keeps its memory from growing with the expert count beyond
a few copies of the expert weights (XLA's memory analysis of the compiled program; the L18 figures
are `benchmarks/jax_memory.py`'s). The dense lowering of `lax.ragged_dot` (an (E, rows, K) operand)
is the failure this catches: it grows ~50x the weights here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from rungs.jaxjob.expert_parallel import routed_experts
from rungs.jaxjob.moe import dispatch_for

T, K_SLOTS, LATENT, HIDDEN = 256, 2, 32, 32
# fp32 weight gradients accumulated over rounds, the compute-dtype copies, the blocks' gathered
# weights (one per expert and projection at most): measured 2.9x (pallas) and 4.6x (blocks)
WEIGHT_COPIES = 6.0


def _temp_bytes(n_experts: int, backend: str) -> int:
    d = dispatch_for(T, K_SLOTS, n_experts, backend=backend, block_rows=16)

    def f(x, gate, idx, wg, wu, wd):
        return routed_experts(d, x, gate, idx, wg, wu, wd).astype(jnp.float32).sum()
    S = jax.ShapeDtypeStruct
    args = (S((T, LATENT), jnp.bfloat16), S((T, K_SLOTS), jnp.bfloat16), S((T, K_SLOTS), jnp.int32),
            S((n_experts, HIDDEN, LATENT), jnp.float32), S((n_experts, HIDDEN, LATENT), jnp.float32),
            S((n_experts, LATENT, HIDDEN), jnp.float32))
    compiled = jax.jit(jax.grad(f, argnums=(0, 1, 3, 4, 5))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def _growth_over_weights(backend: str) -> float:
    small, large = 8, 64
    weights = 3 * (large - small) * LATENT * HIDDEN * 4                  # fp32 bytes of the added experts
    return (_temp_bytes(large, backend) - _temp_bytes(small, backend)) / weights


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["blocks", "pallas"])
def test_temporaries_grow_with_the_experts_no_more_than_a_few_weight_copies(backend):
    assert _growth_over_weights(backend) <= WEIGHT_COPIES


@pytest.mark.slow
def test_the_dense_ragged_dot_lowering_is_caught():
    assert _growth_over_weights("ragged") > 5 * WEIGHT_COPIES
