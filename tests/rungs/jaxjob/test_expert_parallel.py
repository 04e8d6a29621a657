"""Expert parallelism in shard_map: the sharded routed experts equal the single-device
algorithm (outputs and every gradient) on meshes (4, 1), (2, 2), (1, 4) under skewed and all-to-one
routing that need several rounds, and the memory of the compiled step is set by the capacity, not
by the skew.

Memory is measured as the compiled executable's `memory_analysis().temp_size_in_bytes` (XLA:CPU
reports no runtime peak). Every buffer is a fixed shape, so balanced and worst-skew routing run the
same executable (asserted: one compilation) with the same temp bytes; what the capacity buys is
measured against the same call with capacity None (dropless in one round, buffers sized for all
pairs of the group).

Four host devices need XLA_FLAGS set before jax is imported, so the work runs in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rungs.moe import plan_rounds
from tests.rungs.train_helpers import REPO
from tests.xla_flags import SUITE_XLA_FLAGS, jax_subprocess_env

MESHES = [(4, 1), (2, 2), (1, 4)]
T, K, E, LATENT, HIDDEN, CAPACITY, GROUP = 64, 2, 8, 16, 24, 2, 4


def _routings() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    second = rng.integers(0, E, T)
    skewed = np.stack([np.where(np.arange(T) < T // 2, 3, rng.integers(0, E, T)), second], 1)
    skewed[:, 1] = np.where(skewed[:, 1] == skewed[:, 0], (skewed[:, 0] + 1) % E, skewed[:, 1])
    balanced = np.stack([np.arange(T) % E, (np.arange(T) + 1) % E], 1)
    all_to_one = np.stack([np.zeros(T, int), np.ones(T, int)], 1)  # every token to experts 0 and 1
    return {"skewed": skewed, "balanced": balanced, "all_to_one": all_to_one}


def _worker() -> dict:
    import jax
    import jax.numpy as jnp

    from rungs.jaxjob.expert_parallel import routed_experts_sharded
    from rungs.jaxjob.moe import dispatch_for, local_routed_experts
    from rungs.jaxjob.sharding import make_mesh

    assert len(jax.devices()) == 4
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((T, LATENT)), jnp.float32)
    gate = jnp.asarray(rng.random((T, K)), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((T, LATENT)), jnp.float32)
    ws = [jnp.asarray(rng.standard_normal(s) * 0.2, jnp.float32)
          for s in [(E, HIDDEN, LATENT), (E, HIDDEN, LATENT), (E, LATENT, HIDDEN)]]
    routings = {name: jnp.asarray(idx, jnp.int32) for name, idx in _routings().items()}
    d = dispatch_for(T, K, E, capacity_per_expert=CAPACITY, group_size=GROUP)

    reference = jax.jit(jax.value_and_grad(lambda x, g, idx, *w: (local_routed_experts(d, x, g, idx, *w) * dy).sum(),
                                           argnums=(0, 1, 3, 4, 5)))

    def sharded(disp, mesh):
        def objective(x, g, idx, *w):
            y, rounds = routed_experts_sharded(disp, x, g, idx, *w, mesh=mesh)
            return (y * dy).sum(), rounds
        return jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 3, 4, 5), has_aux=True))

    out: dict = {"errors": {}, "rounds": {}}
    refs = {name: reference(x, gate, idx, *ws) for name, idx in routings.items()}
    for shape in MESHES:
        fn = sharded(d, make_mesh(*shape))
        for name, idx in routings.items():
            (value, rounds), grads = fn(x, gate, idx, *ws)
            ref_value, ref_grads = refs[name]
            errors = [abs(float(value) - float(ref_value)) / abs(float(ref_value))]
            errors += [float(jnp.abs(a - b).max() / jnp.abs(b).max()) for a, b in zip(grads, ref_grads)]
            out["errors"][f"{shape} {name}"] = errors
            out["rounds"][f"{shape} {name}"] = [int(r) for r in rounds]
        out[f"{shape} compilations"] = fn._cache_size()
    mesh = make_mesh(2, 2)
    args = (x, gate, routings["balanced"], *ws)
    out["temp_bytes"] = sharded(d, mesh).lower(*args).compile().memory_analysis().temp_size_in_bytes
    one_round = dispatch_for(T, K, E, capacity_per_expert=None, group_size=GROUP)
    out["temp_bytes_one_round"] = sharded(one_round, mesh).lower(*args).compile().memory_analysis().temp_size_in_bytes
    return out


@pytest.mark.slow
def test_sharded_experts_equal_one_device_and_memory_does_not_grow_with_skew(tmp_path):
    out = tmp_path / "result.json"
    env = jax_subprocess_env(4)
    code = ("import json; from tests.rungs.jaxjob.test_expert_parallel import _worker; "
            f"open({str(out)!r}, 'w').write(json.dumps(_worker()))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    for case, errors in result["errors"].items():
        assert max(errors) < 1e-5, (case, errors)  # loss, dx, dgate, dw_gate, dw_up, dw_down
    rounds = result["rounds"]
    for shape in MESHES:
        assert min(rounds[f"{shape} skewed"]) >= 2, rounds
        assert min(rounds[f"{shape} all_to_one"]) > max(rounds[f"{shape} balanced"]), rounds
        assert result[f"{shape} compilations"] == 1  # one executable for every routing: same buffers
    # every EP group (a data row) runs the torch module's plan on its own pairs
    routings = _routings()
    for data, expert in MESHES:
        for name, idx in routings.items():
            expected = []
            for rows in np.split(idx, data):
                counts = np.bincount(rows.reshape(-1), minlength=E).tolist()
                expected += [len(plan_rounds(counts, CAPACITY, min(GROUP, E // expert)))] * expert
            assert rounds[f"{(data, expert)} {name}"] == expected, (data, expert, name)
    # the fixed capacity bounds memory: well under the buffers a one-round dropless dispatch needs
    assert result["temp_bytes"] <= 0.5 * result["temp_bytes_one_round"], result


# ---- peak memory at run time, worst skew against balanced -------------------------

PEAK_T, PEAK_LATENT, PEAK_HIDDEN, PEAK_CAPACITY, PEAK_GROUP = 8192, 64, 128, 1024, 2


def _peak_rss_growth_bytes(run) -> int:
    """Bytes the process's resident set rose above its level before `run()` at its highest during
    it: the peak (VmHWM) is reset first by writing 5 to /proc/self/clear_refs (Linux)."""
    def status(field: str) -> int:
        line = next(x for x in open("/proc/self/status") if x.startswith(field + ":"))
        return int(line.split()[1]) * 1024
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    run()
    return status("VmHWM") - before


def _peak_worker() -> dict:
    """Forward+backward of the sharded experts on a (2, 2) mesh, one compiled executable per
    capacity, run under balanced and under worst-skew routing (every token to experts 0 and 1:
    the most rounds a group of 2 can need), measuring each run's peak resident memory."""
    import jax
    import jax.numpy as jnp

    from rungs.jaxjob.expert_parallel import routed_experts_sharded
    from rungs.jaxjob.moe import dispatch_for
    from rungs.jaxjob.sharding import make_mesh

    mesh = make_mesh(2, 2)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((PEAK_T, PEAK_LATENT)), jnp.float32)
    gate = jnp.asarray(rng.random((PEAK_T, K)), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((PEAK_T, PEAK_LATENT)), jnp.float32)
    ws = [jnp.asarray(rng.standard_normal(s) * 0.1, jnp.float32) for s in
          [(E, PEAK_HIDDEN, PEAK_LATENT), (E, PEAK_HIDDEN, PEAK_LATENT), (E, PEAK_LATENT, PEAK_HIDDEN)]]
    tokens = np.arange(PEAK_T)
    routings = {"balanced": np.stack([tokens % E, (tokens + 1) % E], 1),
                "worst": np.stack([np.zeros(PEAK_T, int), np.ones(PEAK_T, int)], 1)}
    routings = {name: jnp.asarray(idx, jnp.int32) for name, idx in routings.items()}

    def step_fn(capacity: int):
        d = dispatch_for(PEAK_T, K, E, capacity_per_expert=capacity, group_size=PEAK_GROUP)

        def objective(x, g, idx, *w):
            y, rounds = routed_experts_sharded(d, x, g, idx, *w, mesh=mesh)
            return (y * dy).sum(), rounds
        return jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 3, 4, 5), has_aux=True))

    out: dict = {}
    for label, capacity in (("", PEAK_CAPACITY), ("double_capacity ", 2 * PEAK_CAPACITY)):
        fn = step_fn(capacity)
        jax.block_until_ready(fn(x, gate, routings["balanced"], *ws))  # compile and warm up outside the measurement
        peaks: dict[str, list[int]] = {name: [] for name in routings}
        # Interleaved, and the highest of three: the four devices run concurrently and a short
        # (one-round) step sometimes has their buffers alive at different moments (measured 92 MiB
        # once, 120 MiB twice); the peak is what the process must be able to hold.
        for _ in range(3):
            for name, idx in routings.items():
                result: list = []
                peaks[name].append(_peak_rss_growth_bytes(
                    lambda: result.append(jax.block_until_ready(fn(x, gate, idx, *ws)))))
                out[label + name + " rounds"] = int(result[0][0][1].max())
        for name, values in peaks.items():
            out[label + name] = max(values)
            out[label + name + " all"] = values
        out[label + "compilations"] = fn._cache_size()
    return out


@pytest.mark.slow
def test_peak_memory_under_worst_skew_within_10_percent_of_balanced(tmp_path):
    """Measured at run time, not read off the executable: the resident set's peak during one
    forward+backward. Every allocation above 64 KiB is its own mapping returned at free
    (MALLOC_MMAP_THRESHOLD_), so each run's buffers show up in its own peak and not in a heap that
    an earlier run grew. The control shows the instrument sees the round buffers: the same call
    with twice the capacity (round buffers twice as large) peaks clearly higher."""
    out = tmp_path / "result.json"
    env = jax_subprocess_env(4, MALLOC_MMAP_THRESHOLD_="65536")
    # XLA's default code generation, not the suite's (tests/xla_flags.py): these two programs compile
    # once and run 14 times on 8192 tokens, so their run time is the cost. Measured 2026-12-06: the
    # worker 22.7 -> 16.5 CPU s, the same rounds and peaks within 2%.
    suite = {f.split("=", 1)[0] for f in SUITE_XLA_FLAGS}
    env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split() if f.split("=", 1)[0] not in suite)
    code = ("import json; from tests.rungs.jaxjob.test_expert_parallel import _peak_worker; "
            f"open({str(out)!r}, 'w').write(json.dumps(_peak_worker()))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["balanced rounds"] == 1 and result["worst rounds"] == 4, result
    assert result["compilations"] == 1 and result["double_capacity compilations"] == 1, result
    assert result["worst"] <= 1.1 * result["balanced"], result
    assert result["double_capacity worst"] <= 1.1 * result["double_capacity balanced"], result
    assert result["double_capacity balanced"] >= 1.3 * result["balanced"], result
