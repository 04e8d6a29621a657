"""Where a JAX job keeps its compiled programs: JAX_COMPILATION_CACHE_DIR when set, else runs/jax_cache for a
run under a folder named runs, else beside the run."""

from __future__ import annotations

from pathlib import Path

from rungs.jaxjob.train import compilation_cache_dir


def test_the_nearest_runs_folder_holds_the_cache_else_the_run_s_parent(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert compilation_cache_dir(tmp_path / "runs" / "sweeps" / "demo" / "t1") == tmp_path / "runs" / "jax_cache"
    assert compilation_cache_dir(tmp_path / "runs" / "a" / "runs" / "t1") == tmp_path / "runs" / "a" / "runs" / "jax_cache"
    assert compilation_cache_dir(tmp_path / "elsewhere" / "t1") == tmp_path / "elsewhere" / "jax_cache"


def test_jax_compilation_cache_dir_names_one_cache_for_every_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "shared"))
    assert compilation_cache_dir(tmp_path / "runs" / "t1") == tmp_path / "shared"
    assert compilation_cache_dir(tmp_path / "elsewhere" / "t2") == tmp_path / "shared"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")  # set but empty: as if unset
    assert compilation_cache_dir(tmp_path / "runs" / "t1") == tmp_path / "runs" / "jax_cache"
