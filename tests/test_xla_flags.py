"""The suite's XLA flags: added to what XLA_FLAGS gives, never over it; a subprocess gets its own device count."""

from __future__ import annotations

import os

from tests.xla_flags import SUITE_XLA_FLAGS, jax_subprocess_env, with_suite_flags


def test_suite_flags_are_added_and_a_given_flag_keeps_its_value():
    assert with_suite_flags("") == " ".join(SUITE_XLA_FLAGS)
    level = "--xla_backend_optimization_level"
    others = [f for f in SUITE_XLA_FLAGS if not f.startswith(level + "=")]
    assert with_suite_flags(f"{level}=3").split() == [f"{level}=3", *others]
    assert with_suite_flags("--foo=1").split() == ["--foo=1", *SUITE_XLA_FLAGS]


def test_this_session_compiles_under_the_suite_flags():
    # tests/conftest.py set it before any test imported jax (a level the caller gave wins)
    assert "--xla_backend_optimization_level=" in os.environ["XLA_FLAGS"]


def test_a_subprocess_gets_its_device_count_and_the_other_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --foo=1")
    env = jax_subprocess_env(4, EXTRA="x")
    assert env["XLA_FLAGS"].split() == ["--foo=1", "--xla_force_host_platform_device_count=4", *SUITE_XLA_FLAGS]
    assert env["JAX_PLATFORMS"] == "cpu" and env["EXTRA"] == "x"
    assert "device_count" not in jax_subprocess_env()["XLA_FLAGS"]
