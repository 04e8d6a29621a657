"""The install step (scripts/install_env.py, run by `make`): uv configured from pip's settings, pip when uv fails."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import venv
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest

from tests.scripts.helpers import load_script

install_env = load_script("install_env")

LISTING = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/other-wheels'
global.index-url='https://mirror.example/simple'
install.index-url='https://install-section.example/simple'
site.no-index='false'
"""


def test_pip_settings_take_pips_precedence_environment_over_install_over_global():
    settings = install_env.pip_settings(LISTING)
    assert settings["find-links"] == "/opt/wheels"  # PIP_FIND_LINKS wins over the file
    assert settings["index-url"] == "https://install-section.example/simple"  # [install] over [global]
    assert settings["extra-index-url"] == "file:///opt/pypi/simple file:///opt/pypi-more/simple"
    assert "no-index" not in settings  # `site.` is a file's scope name pip does not print; ignored


def test_uv_gets_every_setting_that_decides_what_is_installed():
    args, env = install_env.uv_arguments(install_env.pip_settings(LISTING))
    pairs = list(zip(args[::2], args[1::2]))
    assert pairs == [("--index-strategy", "unsafe-best-match"),
                     ("--index-url", "https://install-section.example/simple"),
                     ("--extra-index-url", "file:///opt/pypi/simple"),
                     ("--extra-index-url", "file:///opt/pypi-more/simple"),
                     ("--find-links", "/opt/wheels"),
                     ("--constraint", "/etc/xdg/pip/constraints.txt")]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}
    args, _ = install_env.uv_arguments({"no-index": "true", "trusted-host": "a.example b.example"})
    assert args[2:] == ["--allow-insecure-host", "a.example", "--allow-insecure-host", "b.example", "--no-index"]


def _wheel(directory: Path) -> Path:
    """A one-module wheel written by hand (no build backend needed, so the install runs offline)."""
    files = {"tinyprobe/__init__.py": b"ANSWER = 42\n",
             "tinyprobe-0.0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinyprobe\nVersion: 0.0.1\n",
             "tinyprobe-0.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
                                                b"Tag: py3-none-any\n"}
    record = "".join(f"{name},sha256={urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items())
    path = directory / "tinyprobe-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("tinyprobe-0.0.1.dist-info/RECORD", record + "tinyprobe-0.0.1.dist-info/RECORD,,\n")
    return path


@pytest.fixture(scope="module")
def tiny_project(tmp_path_factory) -> tuple[Path, Path]:
    """A fresh venv (pip, nothing of this project's) and a one-module wheel to install into it offline."""
    root = tmp_path_factory.mktemp("install")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    return env_dir, _wheel(root)


def _installed(env_dir: Path) -> bool:
    out = subprocess.run([env_dir / "bin" / "python", "-c", "import tinyprobe; print(tinyprobe.ANSWER)"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() == "42"


def _offline(wheel: Path) -> list[str]:
    return ["--no-index", str(wheel)]


def test_a_failing_uv_falls_back_to_pip_and_the_package_installs(tiny_project, tmp_path):
    env_dir, wheel = tiny_project
    subprocess.run([env_dir / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", "tinyprobe"], check=False)
    broken_uv = tmp_path / "uv"
    broken_uv.write_text("#!/bin/sh\necho 'uv: broken on purpose' >&2\nexit 1\n")
    broken_uv.chmod(0o755)
    status = install_env.install(_offline(wheel), python=env_dir / "bin" / "python", uv=broken_uv)
    assert status == 0 and _installed(env_dir)


def test_uv_installs_into_the_environment_it_is_given(tiny_project):
    env_dir, wheel = tiny_project
    uv = Path(sys.executable).parent / "uv"  # the project's own, installed by `make`
    if not uv.is_file():
        uv_path = shutil.which("uv")
        assert uv_path is not None, "uv is missing: `make` installs it into .venv/bin"
        uv = Path(uv_path)
    subprocess.run([env_dir / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", "tinyprobe"], check=False)
    status = install_env.install(_offline(wheel), python=env_dir / "bin" / "python", uv=uv)
    assert status == 0 and _installed(env_dir)
    assert not _installed_in_this_environment()


def _installed_in_this_environment() -> bool:
    import importlib.util
    return importlib.util.find_spec("tinyprobe") is not None
