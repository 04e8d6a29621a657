"""The JAX engine under the one loop against the PyTorch engine, and the backend field."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from rungs.config import parse_config
from rungs.engine import Engine
from rungs.jaxjob.engine import JaxEngine
from rungs.jaxjob.params import from_torch_state_dict
from rungs.torch_engine import TorchEngine, lr_schedule
from sweeps.keys import trial_key
from tests.rungs.train_helpers import tiny_config

STEPS = 20


def _pair(**overrides):
    cfg = parse_config(tiny_config(deterministic=True, precision="fp32", device="cpu", **overrides))
    torch_engine = TorchEngine(cfg)
    torch_engine.build()
    torch_engine.optimizer.muon.ns_dtype = torch.float32  # both sides fp32 Newton-Schulz for a 1e-5 comparison
    params = from_torch_state_dict(torch_engine.model.state_dict(), cfg.architecture())
    jax_engine = JaxEngine(cfg, ns_dtype=jnp.float32, initial_params=params)
    jax_engine.build()
    return cfg, torch_engine, jax_engine


def _run(cfg, engine, steps):
    schedule = lr_schedule(cfg)
    out = []
    for step in range(steps):
        out.append(engine.train_step(step, schedule(step)))
        if cfg.expert_bias:
            engine.update_router_bias()
        engine.drain_clip_events()
    return out


@pytest.mark.parametrize("agc", [False, True], ids=["agc-off", "agc-on"])
def test_twenty_steps_match_the_pytorch_job_loss_for_loss_and_bpb_per_domain(agc):
    cfg, torch_engine, jax_engine = _pair(agc=agc, agc_threshold=2.0, expert_bias=True, z_loss_coef=1e-3)
    want, got = _run(cfg, torch_engine, STEPS), _run(cfg, jax_engine, STEPS)
    np.testing.assert_allclose([s["loss"] for s in got], [s["loss"] for s in want], rtol=1e-5)
    np.testing.assert_allclose([s["grad_norm"] for s in got], [s["grad_norm"] for s in want], rtol=1e-4)
    assert [s["moe_rounds_max"] for s in got] == [s["moe_rounds_max"] for s in want]
    if agc:
        assert max(s["agc_clip_rate"] for s in want) > 0  # the threshold is low enough to clip
        np.testing.assert_allclose([s["agc_clip_rate"] for s in got], [s["agc_clip_rate"] for s in want])
    bpb_torch, bpb_jax = torch_engine.evaluate(final=True), jax_engine.evaluate(final=True)
    assert bpb_jax.keys() == bpb_torch.keys() and bpb_jax
    for domain in bpb_torch:
        assert abs(bpb_jax[domain].bpb - bpb_torch[domain].bpb) < 1e-3, domain
    assert jax_engine._logits._cache_size() == 1  # windows of every width share one compiled eval


def test_the_jax_engine_implements_the_engine_protocol():
    assert isinstance(JaxEngine(parse_config(tiny_config())), Engine)


def test_backend_torch_keeps_every_key_and_backend_jax_is_another_trial():
    base = tiny_config()
    legacy = dict(base)
    legacy.pop("backend", None)
    torch_cfg, jax_cfg = parse_config(base | {"backend": "torch"}), parse_config(base | {"backend": "jax"})
    assert torch_cfg.key() == parse_config(legacy).key()
    assert jax_cfg.key() != torch_cfg.key()
    assert trial_key(torch_cfg.to_dict()) == trial_key({k: v for k, v in torch_cfg.to_dict().items() if k != "backend"})
    assert trial_key(jax_cfg.to_dict()) != trial_key(torch_cfg.to_dict())


def test_a_jax_run_logs_the_pytorch_runs_metric_names_tagged_backend_jax_with_compile_time_apart(tmp_path):
    from mlflow.tracking import MlflowClient

    from rungs.jaxjob.train import train_jax
    from rungs.train import train

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny_config(max_steps=2, tracking_uri=uri, experiment_name="backends", eval_interval=1)
    torch_res = train(cfg, run_dir=tmp_path / "torch", progress=False)
    jax_res = train_jax(cfg | {"backend": "jax"}, tmp_path / "jax", progress=False, cache_dir=tmp_path / "cache")
    client = MlflowClient(uri)
    torch_run, jax_run = client.get_run(torch_res.run_id), client.get_run(jax_res.run_id)
    assert set(jax_run.data.metrics) == set(torch_run.data.metrics)
    assert set(jax_run.data.params) == set(torch_run.data.params)
    assert jax_run.data.tags["backend"] == "jax" and jax_run.data.tags["jax_version"]
    only_jax = {"backend", "jax_version", "jax_platform", "jax_compile_seconds"}  # one device: no dp/ep tags
    assert set(jax_run.data.tags) - only_jax == set(torch_run.data.tags) - only_jax
    assert float(jax_run.data.tags["jax_compile_seconds"]) > 0  # compiled in build(), outside the timed steps
    assert jax_res.to_json().keys() == torch_res.to_json().keys()
    assert jax_res.steps == 2 and set(jax_res.bpb) == set(torch_res.bpb)
