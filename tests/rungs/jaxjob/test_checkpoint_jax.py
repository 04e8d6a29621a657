"""JAX checkpoints: N steps + restart + N steps equal 2N steps; another config's
checkpoint is refused naming the file; a kill mid-save leaves the previous checkpoint."""

from __future__ import annotations

import pytest

from rungs.jaxjob import checkpoint as jax_ckpt
from rungs.jaxjob.train import train_jax
from rungs.run_files import CheckpointError
from tests.rungs.train_helpers import tiny_config


def _cfg(**overrides):
    # AGC in median mode and the router bias both carry state across steps: the checkpoint must hold them.
    # Two of the rung's three layers: what is saved does not depend on depth, but more than one layer's
    # state (biases, AGC thresholds per layer) must come back; each of the 4 jobs traces the model anew.
    return tiny_config(max_steps=6, deterministic=True, expert_bias=True, agc_threshold=2.0, n_layers=2,
                       **overrides)


def test_n_steps_restart_n_steps_equals_2n_and_another_config_is_refused(tmp_path):
    cache = tmp_path / "cache"
    whole = train_jax(_cfg(), tmp_path / "whole", progress=False, cache_dir=cache)
    stopped = train_jax(_cfg(), tmp_path / "split", progress=False, stop_after=3, cache_dir=cache)
    assert stopped.steps == 3 and jax_ckpt.exists(tmp_path / "split")
    with pytest.raises(CheckpointError, match=r"checkpoint_jax/meta.json.*another run directory"):
        train_jax(_cfg(lr=0.001), tmp_path / "split", progress=False, cache_dir=cache)
    resumed = train_jax(_cfg(), tmp_path / "split", progress=False, cache_dir=cache)
    assert resumed.steps == whole.steps == 6
    assert resumed.losses == whole.losses  # bit for bit
    assert resumed.bpb == whole.bpb
    assert any(cache.iterdir())  # the persistent compilation cache was written


def test_a_failed_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    import jax.numpy as jnp

    state = {"w": jnp.arange(4.0)}
    jax_ckpt.save(tmp_path, state=state, config_key="k", meta={"step": 1})

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jax_ckpt.Path, "write_text", disk_full)
    with pytest.raises(OSError):
        jax_ckpt.save(tmp_path, state={"w": jnp.arange(4.0) + 1}, config_key="k", meta={"step": 2})
    monkeypatch.undo()
    restored, meta = jax_ckpt.load(tmp_path, template=state, config_key="k")
    assert meta["step"] == 1 and restored["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
