"""Multi-process JAX: two processes joined by `jax.distributed` on loopback (coordinator on
127.0.0.1, gloo collectives), each with 2 CPU devices, train on one (2, 2) mesh spanning both:
the steps' losses equal a single-process, single-device run.

AGC is off here, as the engine alone is under test; the whole job on Ray workers with AGC on (its
readout gathered across processes) is tests/rungs/parallel/test_one_loop.py's JAX test.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.rungs.train_helpers import REPO, tiny_config
from tests.xla_flags import jax_subprocess_env

STEPS = 3


def _cfg() -> dict:
    # several MoE rounds per step (capacity 8 rows per expert), as the one-process sharding test
    return tiny_config(max_steps=4, deterministic=True, capacity_per_expert=8, group_size=4, expert_bias=True,
                       agc=False)


def _losses(mesh_shape: tuple[int, int] | None) -> list[float]:
    import jax.numpy as jnp

    from rungs.config import parse_config
    from rungs.jaxjob.engine import JaxEngine
    from rungs.jaxjob.sharding import make_mesh
    from rungs.torch_engine import lr_schedule

    cfg = parse_config(_cfg())
    schedule = lr_schedule(cfg)
    engine = JaxEngine(cfg, mesh=None if mesh_shape is None else make_mesh(*mesh_shape), ns_dtype=jnp.float32)
    engine.build()
    losses = []
    for step in range(STEPS):
        losses.append(engine.train_step(step, schedule(step))["loss"])
        engine.update_router_bias()
    return losses


def _worker(process_id: int, port: int, out: str) -> None:
    from rungs.jaxjob.distributed import initialize

    group = initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id, cpu_devices=2)
    assert (group.local_devices, group.global_devices) == (2, 4), group
    with open(out, "w") as f:
        json.dump(_losses((2, 2)), f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_as_one(tmp_path):
    port = _free_port()
    env = jax_subprocess_env()
    outs = [tmp_path / f"losses{i}.json" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", "from tests.rungs.jaxjob.test_sharding_multiprocess import "
                               f"_worker; _worker({i}, {port}, {str(outs[i])!r})"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = [p.communicate(timeout=1500)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    first, second = (json.loads(o.read_text()) for o in outs)
    assert first == second                      # one program: both processes see the same step results
    np.testing.assert_allclose(first, _losses(None), rtol=1e-5)
