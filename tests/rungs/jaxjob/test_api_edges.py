"""The JAX job at its edges: a save killed between its two renames still resumes, a damaged meta record
or another engine's checkpoint is refused in one line, and a setting the JAX job cannot train (dropout, a
device JAX does not run on, GPU determinism without XLA's flag) or a run directory or compilation cache that
cannot be a folder is one clear error, not a traceback."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from ladder.cli import main
from rungs.config import TrainConfigError, parse_config
from rungs.jaxjob import engine as engine_module
from rungs.jaxjob import checkpoint as jax_ckpt
from rungs.jaxjob.engine import JaxEngine, check_config
from rungs.jaxjob.train import enable_compilation_cache, train_jax
from rungs.metrics import CPU_PEAK_FLOPS_PER_CORE
from rungs.run_files import CheckpointError, RunDirError
from tests.rungs.train_helpers import tiny_config


def _kill_at_the_second_rename(monkeypatch) -> None:
    """Make the save's `checkpoint_jax.tmp` -> `checkpoint_jax` rename die as a killed process would."""
    real = Path.rename

    def rename(self, target):
        if self.name == jax_ckpt.CHECKPOINT_DIR + ".tmp":
            raise KeyboardInterrupt("killed")
        return real(self, target)

    monkeypatch.setattr(jax_ckpt.Path, "rename", rename)


def test_a_save_killed_between_its_two_renames_resumes_from_the_checkpoint_it_wrote(tmp_path, monkeypatch):
    before = {"w": jnp.arange(4.0)}
    jax_ckpt.save(tmp_path, state=before, config_key="k", meta={"step": 1})
    _kill_at_the_second_rename(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        jax_ckpt.save(tmp_path, state={"w": jnp.arange(4.0) + 1}, config_key="k", meta={"step": 2})
    monkeypatch.undo()
    assert not (tmp_path / jax_ckpt.CHECKPOINT_DIR).exists()  # the old one moved aside, the new one not yet in
    assert jax_ckpt.exists(tmp_path)
    restored, meta = jax_ckpt.load(tmp_path, template=before, config_key="k")
    assert meta["step"] == 2 and restored["w"].tolist() == [1.0, 2.0, 3.0, 4.0]  # the new one: it was whole
    assert (tmp_path / jax_ckpt.CHECKPOINT_DIR / "meta.json").is_file()  # and it is the checkpoint again
    # the checkpoint such a kill left is still refused to another config, not passed over as none
    jax_ckpt.save(tmp_path, state=before, config_key="k", meta={"step": 3})
    _kill_at_the_second_rename(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        jax_ckpt.save(tmp_path, state=before, config_key="k", meta={"step": 4})
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=r"checkpoint_jax/meta.json: checkpoint of config k,"):
        jax_ckpt.load(tmp_path, template=before, config_key="other")


def test_without_a_whole_new_checkpoint_the_previous_one_is_resumed(tmp_path):
    """A `.tmp` whose meta.json was never written holds arrays of an unfinished save: the `.old` is used."""
    state = {"w": jnp.arange(4.0)}
    jax_ckpt.save(tmp_path, state=state, config_key="k", meta={"step": 1})
    (tmp_path / jax_ckpt.CHECKPOINT_DIR).rename(tmp_path / (jax_ckpt.CHECKPOINT_DIR + ".old"))
    (tmp_path / (jax_ckpt.CHECKPOINT_DIR + ".tmp") / "arrays").mkdir(parents=True)
    restored, meta = jax_ckpt.load(tmp_path, template=state, config_key="k")
    assert meta["step"] == 1 and restored["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_meta_record_that_is_not_an_object_is_refused_as_unreadable(tmp_path):
    jax_ckpt.save(tmp_path, state={"w": jnp.arange(2.0)}, config_key="k", meta={"step": 1})
    (tmp_path / jax_ckpt.CHECKPOINT_DIR / "meta.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="unreadable JAX checkpoint.*--fresh"):
        jax_ckpt.load(tmp_path, template={"w": jnp.arange(2.0)}, config_key="k")


def test_a_run_directory_holding_a_torch_checkpoint_is_refused_not_restarted_beside_it(tmp_path):
    """Starting from step 0 beside the PyTorch job's checkpoint would silently discard its progress."""
    (tmp_path / "checkpoint.pt").write_bytes(b"a torch checkpoint")
    cfg = tiny_config(backend="jax", n_layers=1, max_steps=2, agc=False)
    with pytest.raises(CheckpointError, match=r"checkpoint.pt: a checkpoint of the one-process PyTorch job"):
        train_jax(cfg, tmp_path, progress=False, cache_dir=tmp_path / "cache")
    assert not (tmp_path / jax_ckpt.CHECKPOINT_DIR).exists()


def _refused_before_the_run_directory(tmp_path, capsys, key: str, value, match: str) -> None:
    """`train_jax` raises naming `key`, and `ladder train` exits 2 in one line; no run directory is made."""
    with pytest.raises(TrainConfigError, match=match) as err:
        train_jax(tiny_config(backend="jax", **{key: value}), tmp_path / "run", progress=False)
    assert err.value.key == key
    code = main(["train", "cpu-demo", "--rung", "3", "--set", "backend=jax", "--set", f"{key}={value}",
                 "--max-steps", "1", "--run-dir", str(tmp_path / "run")])
    assert code == 2
    out = capsys.readouterr().err
    assert key in out and "Traceback" not in out
    assert not (tmp_path / "run").exists()


def test_dropout_is_refused_naming_the_field_before_the_run_directory_is_made(tmp_path, capsys):
    _refused_before_the_run_directory(tmp_path, capsys, "dropout", 0.1, "dropout")


def test_a_device_jax_does_not_run_on_is_refused_naming_the_field_before_the_run_directory_is_made(tmp_path, capsys):
    # JAX here runs on the CPU: a cuda job would otherwise train on it, in emulated bf16 (precision=auto)
    assert jax.default_backend() == "cpu"
    _refused_before_the_run_directory(tmp_path, capsys, "device", "cuda", "device=cuda, but JAX runs on cpu")
    for device in ("cpu", "auto"):
        check_config(parse_config(tiny_config(backend="jax", device=device)))


def test_on_a_gpu_a_cpu_job_and_a_deterministic_job_without_xlas_flag_are_refused(monkeypatch):
    # The GPU side of the same check, with JAX's platform read as a GPU (none is here to start)
    monkeypatch.setattr(engine_module, "jax_device", lambda: "cuda")
    monkeypatch.setattr(engine_module.jax, "default_backend", lambda: "gpu")
    with pytest.raises(TrainConfigError, match="JAX_PLATFORMS=cpu") as err:
        check_config(parse_config(tiny_config(backend="jax", device="cpu")))
    assert err.value.key == "device"
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0")
    with pytest.raises(TrainConfigError, match="xla_gpu_deterministic_ops") as err:
        check_config(parse_config(tiny_config(backend="jax", device="cuda", deterministic=True)))
    assert err.value.key == "deterministic"
    monkeypatch.setenv("XLA_FLAGS", f"--xla_gpu_autotune_level=0 {engine_module.DETERMINISTIC_GPU_FLAG}")
    check_config(parse_config(tiny_config(backend="jax", device="cuda", deterministic=True)))
    check_config(parse_config(tiny_config(backend="jax", device="auto", deterministic=False)))


def test_the_cpu_peak_counts_the_cores_xlas_pool_uses_not_torchs_threads_setting():
    import os

    engine = JaxEngine(parse_config(tiny_config(backend="jax", threads=1)))
    cores = len(os.sched_getaffinity(0))
    assert engine.cpu_cores == cores
    assert engine.device_peak().flops == cores / jax.local_device_count() * CPU_PEAK_FLOPS_PER_CORE


def test_a_run_directory_or_compilation_cache_under_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(RunDirError, match=r"a_file is a file"):
        train_jax(tiny_config(backend="jax"), tmp_path / "a_file" / "run", progress=False)
    cache_before = jax.config.jax_compilation_cache_dir
    with pytest.raises(RunDirError, match=r"compilation cache: .*a_file is a file.*JAX_COMPILATION_CACHE_DIR"):
        enable_compilation_cache(tmp_path / "a_file" / "cache")
    assert jax.config.jax_compilation_cache_dir == cache_before  # the job's cache is left as it was
