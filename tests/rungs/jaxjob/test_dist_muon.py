"""Distributed Muon in JAX: traced on a (data, expert) mesh, Muon orthogonalises whole matrices
on their owners and equals single-device Muon within 1e-5 over 3 steps.

"On their owners" is read off the compiled step: no collective inside any loop (Newton-Schulz is a
scan: its iterations run on local, whole matrices), and the expert stacks' Newton-Schulz matmuls
are batched over E / expert matrices of each stack a device owns (those of its own experts), not over all E.

Four host devices need XLA_FLAGS set before jax is imported, so the work runs in a subprocess.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.rungs.train_helpers import REPO
from tests.xla_flags import jax_subprocess_env

MESHES = [(4, 1), (2, 2)]
E = 8
SHAPES = {"layers.0.attn.wq.weight": (32, 16), "layers.1.attn.wq.weight": (32, 16), "layers.0.attn.wo.weight": (16, 32),
          "layers.0.moe.router.weight": (E, 16), "layers.0.moe.experts.w_gate": (E, 24, 16),
          "layers.1.moe.experts.w_gate": (E, 24, 16), "layers.0.moe.experts.w_down": (E, 16, 24)}
COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "collective-permute", "reduce-scatter")


def _worker() -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    from rungs.jaxjob.muon import muon
    from rungs.jaxjob.sharding import make_mesh, param_shardings, shard_params, use_mesh

    assert len(jax.devices()) == 4
    rng = np.random.default_rng(0)
    params = {n: jnp.asarray(rng.standard_normal(s), jnp.float32) for n, s in SHAPES.items()}
    grads = [{n: jnp.asarray(rng.standard_normal(s), jnp.float32) for n, s in SHAPES.items()} for _ in range(3)]
    tx = muon(0.02, 0.1, ns_dtype=jnp.float32)

    def run(params, mesh):
        with use_mesh(mesh):
            state = jax.jit(tx.init)(params)

            def step(p, s, g):
                u, s = tx.update(g, s, p)
                return optax.apply_updates(p, u), s

            layout = None if mesh is None else (param_shardings(params, mesh), jax.tree.map(lambda a: a.sharding, state))
            compiled = jax.jit(step, out_shardings=layout).lower(params, state, params).compile()
        for g in grads:
            params, state = compiled(params, state, g if mesh is None else shard_params(g, mesh))
        return params, compiled.as_text()

    reference, _ = run(params, None)
    out: dict = {}
    for shape in MESHES:
        mesh = make_mesh(*shape)
        got, hlo = run(shard_params(params, mesh), mesh)
        out[str(shape)] = {"error": max(float(jnp.abs(got[n] - reference[n]).max() / jnp.abs(reference[n]).max())
                                        for n in reference),
                           "sharded": sorted(str(got[n].sharding.spec) for n in got), "hlo": hlo}
    return out


def _computations(hlo: str) -> dict[str, str]:
    """name -> body of each HLO computation (ENTRY included)."""
    parts = re.split(r"\n(?=(?:ENTRY )?%[\w.\-]+ )", hlo)
    return {re.match(r"(?:ENTRY )?(%[\w.\-]+)", p).group(1): p for p in parts if re.match(r"(?:ENTRY )?%", p)}


def _loop_computations(hlo: str) -> set[str]:
    """Every computation reachable from a while loop's condition or body."""
    comps = _computations(hlo)
    todo = re.findall(r"(?:condition|body)=(%[\w.\-]+)", hlo)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        todo += re.findall(r"(?:calls|to_apply|condition|body)=(%[\w.\-]+)", comps[name])
    return seen


@pytest.mark.slow
def test_distributed_muon_equals_one_device_with_whole_matrices_on_owners(tmp_path):
    out = tmp_path / "result.json"
    env = jax_subprocess_env(4)
    code = ("import json; from tests.rungs.jaxjob.test_dist_muon import _worker; "
            f"open({str(out)!r}, 'w').write(json.dumps(_worker()))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    for shape in MESHES:
        got = result[str(shape)]
        assert got["error"] < 1e-5, (shape, got["error"])
        assert any("data" in s for s in got["sharded"]), got["sharded"]     # FSDP shards were the input
        hlo = got["hlo"]
        comps = _computations(hlo)
        loops = _loop_computations(hlo)
        assert loops, "Newton-Schulz runs as a loop"
        for name in loops:
            assert not any(c + "(" in comps[name] for c in COLLECTIVES), (shape, name)
        # the stacks' (m, m) Gram products: batched over the stacks this device owns (the three
        # 16 x 24 stacks, tall ones transposed, form one group) and within each over this device's
        # experts only: the expert axis is E / expert, never all E when experts are split
        expert, data = shape[1], shape[0]
        grams = [[int(d) for d in dims.split(",")]
                 for dims in re.findall(r"= f32\[((?:\d+,)*\d+),16,16\]\{[\d,]+\} dot\(", hlo)]
        assert grams and {g[-1] for g in grams} == {E // expert}, (shape, grams)
        assert all(int(np.prod(g[:-1])) == -(-3 // data) for g in grams), (shape, grams)
