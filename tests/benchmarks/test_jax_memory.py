"""benchmarks/jax_memory.py's parts that need no L18 compile: the largest buffers read from a compiled
program's HLO, the linear-growth ratio, and bad input refused (exit 2). The programs it compiles are
the engine's (`rungs.jaxjob.programs`), tested through the engine."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from benchmarks import jax_memory


def test_the_largest_buffers_of_a_compiled_program_are_read_from_its_hlo():
    def f(a, b):
        return jnp.tanh(a[:, :, None] * b[None]).sum()           # an f32[64,32,128] intermediate
    hlo = jax.jit(jax.grad(f)).lower(jnp.ones((64, 32)), jnp.ones((32, 128))).compile().as_text()
    top = jax_memory.largest_buffers(hlo, count=2)
    assert top[0]["shape"] == "f32[64,32,128]" and top[0]["bytes"] == 64 * 32 * 128 * 4
    assert top[0]["bytes"] >= top[1]["bytes"]


@pytest.mark.parametrize("temps,ratio", [({1: 10, 2: 14, 4: 22}, 1.0), ({1: 10, 2: 14, 4: 30}, 2.0),
                                         ({1: 10, 2: 10, 4: 10}, 1.0)])
def test_growth_ratio_is_one_for_linear_growth(temps, ratio):
    assert jax_memory.growth_ratio(temps) == pytest.approx(ratio)


def test_bad_input_exits_2_with_one_line(capsys):
    assert jax_memory.main(["--paths", "blocks,cublas", "--json"]) == 2
    assert jax_memory.main(["--layers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("jax_memory: ") for line in err)
