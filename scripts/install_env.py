"""Install the project and its dependencies into the virtual environment: with uv, configured from
pip's own configuration; with pip when uv is missing or fails.

`make` runs `.venv/bin/python scripts/install_env.py -e '.[dev]'`. pip resolves and unpacks the ~240
packages one after another: 430 s of wall clock (149 s of CPU) for a fresh `.venv` on the shared
2-core machine; uv installs the same set in 32 s (11 s of CPU), measured back to back on 2026-12-06.

uv does not read pip's configuration, and these machines keep theirs there: a `find-links`
directory holding the CPU build of torch (without it the `torch==2.13.0` pin pulls the multi-GB CUDA
build from PyPI), local package indexes, and a constraints file. So this reads `pip config list` and
passes the settings that decide what gets installed (index-url, extra-index-url, find-links,
constraint, no-index, trusted-host, cert, timeout) to uv. `--index-strategy unsafe-best-match` makes
uv choose among all indexes by version as pip does (uv's default takes the first index that has a
package), so both pick the same builds.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

# pip settings that change what is installed, and the uv option each becomes (None: handled apart)
LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint",
                "trusted-host": "--allow-insecure-host"}
SINGLE_OPTIONS = {"index-url": "--index-url"}
SECTIONS = ("global", "install")  # pip reads [global], then [install] for `pip install`


def pip_settings(listing: str) -> dict[str, str]:
    """`pip config list` output -> the value pip uses for each key.

    Lines read `global.find-links='/opt/wheels'` (a configuration file) or `:env:.find-links='...'`
    (a PIP_FIND_LINKS variable). pip lets [install] override [global], and the environment override
    both; later files of one section override earlier ones, as the listing orders them.
    """
    by_scope: dict[str, dict[str, str]] = {scope: {} for scope in (*SECTIONS, ":env:")}
    for line in listing.splitlines():
        name, sep, raw = line.partition("=")
        scope, dot, key = name.rpartition(".")
        if not sep or not dot or scope not in by_scope:
            continue
        value = raw.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        by_scope[scope][key] = value
    merged: dict[str, str] = {}
    for scope in (*SECTIONS, ":env:"):
        merged.update(by_scope[scope])
    return merged


def uv_arguments(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv options and environment variables equivalent to pip's `settings`."""
    args = ["--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {}
    for key, option in SINGLE_OPTIONS.items():
        if settings.get(key):
            args += [option, settings[key]]
    for key, option in LIST_OPTIONS.items():
        for value in settings.get(key, "").split():  # pip separates a list by whitespace or newlines
            args += [option, value]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("timeout") or settings.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = settings.get("timeout") or settings["default-timeout"]
    return args, env


def install(requirements: list[str], *, python: Path, uv: Path | None) -> int:
    """Install `requirements` into `python`'s environment with uv, falling back to pip; the exit status."""
    pip = [str(python), "-m", "pip"]
    if uv is not None and uv.is_file():
        listing = subprocess.run([*pip, "config", "list"], capture_output=True, text=True, check=False).stdout
        args, env = uv_arguments(pip_settings(listing))
        cmd = [str(uv), "pip", "install", "--quiet", "--python", str(python), *args, *requirements]
        print("install_env:", shlex.join(cmd), flush=True)
        if subprocess.run(cmd, env={**os.environ, **env}, check=False).returncode == 0:
            return 0
        print("install_env: uv failed (above); installing with pip", file=sys.stderr, flush=True)
    return subprocess.run([*pip, "install", "--quiet", "--no-compile", *requirements], check=False).returncode


def main(argv: list[str] | None = None) -> int:
    requirements = sys.argv[1:] if argv is None else argv  # verbatim, as `pip install` would take them
    if not requirements or requirements[0] in ("-h", "--help"):
        print(f"usage: python {Path(__file__).name} REQUIREMENT...  (e.g. -e '.[dev]')\n\n{__doc__.splitlines()[0]}")
        return 0 if requirements else 2
    python = Path(sys.executable)  # the environment's own interpreter (not resolved: a venv's is a link)
    return install(requirements, python=python, uv=python.parent / "uv")


if __name__ == "__main__":
    raise SystemExit(main())
