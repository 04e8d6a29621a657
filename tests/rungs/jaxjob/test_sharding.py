"""The JAX engine sharded over a (data, expert) mesh equals one device, under
routing that needs at least two MoE rounds; a trial (`rungs.train.train`, what `ladder train
--set backend=jax` runs) trains on every device it sees, on the mesh its `jax_mesh_expert` names;
and a job saved on 4 devices resumes on 2.

Four host devices need XLA_FLAGS set before jax is imported, so the work runs in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rungs.metrics import CPU_PEAK_FLOPS_PER_CORE
from tests.rungs.train_helpers import REPO, tiny_config
from tests.xla_flags import jax_subprocess_env

STEPS = 4
MESHES = [(4, 1), (2, 2), (1, 4)]
SAVED_AT, SAVED_ON, RESUMED_ON = 2, (4, 1), (2, 1)  # a checkpoint of 4 devices after 2 steps, resumed on 2


def _cfg(**overrides):
    # capacity 8 rows per expert in blocks of 4: the 256 tokens x top-2 of a step need several rounds.
    # Two layers, not the rung's three: one sliding-window layer and one global layer (global_every=2),
    # the two kinds of block the rung has (its third layer is a second window layer, the same code),
    # every one of them an MoE layer with its own round plan, all-to-all and expert-stack Muon. A build
    # traces and compiles one block fewer and a step or an eval runs one fewer.
    return tiny_config(max_steps=4, deterministic=True, capacity_per_expert=8, group_size=4, expert_bias=True,
                       n_layers=2, global_every=2, **overrides)


def _worker(out: str) -> None:
    import jax
    import jax.numpy as jnp

    from rungs.config import parse_config
    from rungs.jaxjob.engine import JaxEngine
    from rungs.jaxjob.sharding import make_mesh
    from rungs.jaxjob.train import compilation_cache_dir, enable_compilation_cache
    from rungs.torch_engine import lr_schedule
    from rungs.train import train

    assert len(jax.devices()) == 4
    cfg = parse_config(_cfg())
    schedule = lr_schedule(cfg)
    result: dict = {}
    run = Path(out).parent
    # The trials below compile through the persistent cache the job keeps beside its run directory
    # (here in tmp_path, new each run). Open it from the start: the gradient program does not depend
    # on Newton-Schulz's dtype, so the bf16 reference and the trials on (1, 4) and (2, 2) load the
    # fp32 engines' compiled gradient programs instead of compiling them again.
    enable_compilation_cache(compilation_cache_dir(run / "trialNone"))
    for mesh in [None, *MESHES]:
        engine = JaxEngine(cfg, mesh=None if mesh is None else make_mesh(*mesh), ns_dtype=jnp.float32)
        engine.build()
        stats = []
        for step in range(STEPS):
            stats.append(engine.train_step(step, schedule(step)))
            engine.update_router_bias()
            if mesh == SAVED_ON and step + 1 == SAVED_AT:  # as rungs.loop saves after a step (its state: the step)
                engine.save(run / "moved", {"step": SAVED_AT})
        result[str(mesh)] = {"loss": [s["loss"] for s in stats], "rounds": [s["moe_rounds_max"] for s in stats],
                             "params": {n: float(abs(p).sum()) for n, p in engine.host_params().items()},
                             "sharded": [str(getattr(engine.params[n].sharding, "spec", "")) for n in sorted(engine.params)],
                             # expert parallelism in shard_map (fixed-size exchanges), not GSPMD's own partitioning
                             "all_to_all": "all-to-all" in engine._grads.as_text()}
    # Resume onto another device count: the 4-device checkpoint restored into a 2-device engine's
    # layout (orbax reshards on load), then the remaining steps.
    moved = JaxEngine(cfg, mesh=make_mesh(*RESUMED_ON), ns_dtype=jnp.float32)
    moved.build()
    assert moved.load(run / "moved")["step"] == SAVED_AT
    resumed = []
    for step in range(SAVED_AT, STEPS):
        resumed.append(moved.train_step(step, schedule(step))["loss"])
        moved.update_router_bias()
    result["resume"] = {"moved": resumed, "devices": moved.world}
    # the trial's reference: one device, the job's own (bf16) Newton-Schulz, no mesh
    engine = JaxEngine(cfg)
    engine.build()
    one = []
    for step in range(cfg.run_steps):
        one.append(engine.train_step(step, schedule(step))["loss"])
        engine.update_router_bias()
    one_bpb = {domain: score.bpb for domain, score in engine.evaluate(final=True).items()}
    trials = {}
    for expert in (None, 2):  # the default mesh over 4 devices, and (2, 2)
        res = train(_cfg(backend="jax", jax_mesh_expert=expert, tracking_uri=f"sqlite:///{run / 'mlflow.db'}"),
                    run_dir=run / f"trial{expert}", progress=False)
        trials[str(expert)] = {"loss": res.losses, "devices": res.devices, "run_id": res.run_id, "bpb": res.bpb,
                               "peak": res.peak_flops_per_device, "cores": len(os.sched_getaffinity(0))}
    # The runs' tags as MLflow stored them, read back here, where MLflow is imported already (the
    # trials tracked to it), instead of importing it and opening the store again in the test process.
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    for got in trials.values():
        got["tags"] = client.get_run(got["run_id"]).data.tags
    result["trial"] = {"one": one, "one_bpb": one_bpb, "meshes": trials}
    Path(out).write_text(json.dumps(result))


@pytest.mark.slow
def test_sharded_meshes_equal_one_device_a_trial_shards_over_every_device_and_4_devices_resume_on_2(tmp_path):
    out = tmp_path / "result.json"
    env = jax_subprocess_env(4)
    proc = subprocess.run([sys.executable, "-c", f"from tests.rungs.jaxjob.test_sharding import _worker; "
                                                 f"_worker({str(out)!r})"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    single = result["None"]
    assert min(single["rounds"]) >= 2
    for mesh in MESHES:
        got = result[str(mesh)]
        # each data row is its own expert-parallel group with its own round plan (as the torch job)
        assert min(got["rounds"]) >= 2, mesh
        np.testing.assert_allclose(got["loss"], single["loss"], rtol=1e-5, err_msg=str(mesh))
        for name, value in single["params"].items():
            np.testing.assert_allclose(got["params"][name], value, rtol=1e-4, err_msg=f"{mesh} {name}")
        assert any("data" in s or "expert" in s for s in got["sharded"]), mesh
        assert got["all_to_all"] or mesh[1] == 1, mesh
    assert "expert" in " ".join(result["(1, 4)"]["sharded"])
    trial, tags = result["trial"], {}
    for expert, got in trial["meshes"].items():
        tags[expert] = got["tags"]  # the MLflow run's tags (read in the worker by run_id)
        assert got["devices"] == 4, expert
        # the 4 host devices share the process's cores: each device's MFU peak is a quarter of theirs
        assert got["peak"] == pytest.approx(got["cores"] / 4 * CPU_PEAK_FLOPS_PER_CORE), expert
        # the tolerance of the job's bf16 Newton-Schulz (the resume check below)
        np.testing.assert_allclose(got["loss"], trial["one"], rtol=1e-4, err_msg=expert)
        # the final eval runs on the mesh as the step does (expert parallelism in its MoE layers) and
        # scores what one device scores, to the same tolerance
        assert got["bpb"].keys() == trial["one_bpb"].keys() and got["bpb"], expert
        for domain, bpb in trial["one_bpb"].items():
            assert got["bpb"][domain] == pytest.approx(bpb, rel=1e-4), (expert, domain)
    # 8 experts over 4 devices: all 4 on the expert axis by default; jax_mesh_expert=2 asks (2, 2)
    assert {k: (t["dp"], t["ep"], t["workers"]) for k, t in tags.items()} == {"None": ("1", "4", "1"),
                                                                               "2": ("2", "2", "1")}
    resume = result["resume"]
    assert resume["devices"] == 2
    # the steps after the checkpoint, on 2 devices, are the uninterrupted one-device run's steps
    np.testing.assert_allclose(resume["moved"], single["loss"][SAVED_AT:], rtol=1e-5)
