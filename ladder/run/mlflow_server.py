"""Serve one MLflow tracking store over HTTP in one process: `python -m ladder.run.mlflow_server`.

Why not `mlflow server`: that CLI imports MLflow and checks the store's schema, then starts uvicorn
as a second process that imports MLflow and opens the store again. Measured on the 2-core dev
machine (MLflow 3.17): the CLI's two processes take 8.8-10.9 CPU-s and 7.7-9.6 s until healthy;
serving the same FastAPI app in the process that opened the store takes 4.5-4.9 CPU-s and
4.3-4.9 s. Every sweep, nightly run and trial-logging test waits for this start.

What runs is MLflow's own app (`mlflow.server.fastapi_app:app`) configured the way `mlflow server
--backend-store-uri S --serve-artifacts --artifacts-destination D --workers 1` configures it: the
server's settings go in the environment variables MLflow's handlers read, the stores are opened (and
a fresh SQLite schema created) before the port opens, then uvicorn serves on the given host. Those
settings' names are MLflow internals: where this MLflow lacks one (or a signature differs), the
module runs the `mlflow server` CLI instead (`--cli` asks for it), so a changed MLflow costs start-up
time, never a server.
"""

from __future__ import annotations

import argparse
import os
import sys


def cli_command(args: argparse.Namespace) -> list[str]:
    """The `mlflow server` invocation equal to this module's."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", args.backend_store_uri,
            "--host", args.host, "--port", str(args.port), "--workers", "1",
            "--serve-artifacts", "--artifacts-destination", args.artifacts_destination]


def _in_process_settings(args: argparse.Namespace) -> tuple[dict[str, str], str]:
    """The environment `mlflow server` gives its uvicorn worker for these arguments, and the default
    artifact root (ImportError where this MLflow names them differently)."""
    from mlflow.server import (ARTIFACT_ROOT_ENV_VAR, ARTIFACTS_DESTINATION_ENV_VAR, BACKEND_STORE_URI_ENV_VAR,
                               REGISTRY_STORE_URI_ENV_VAR, SERVE_ARTIFACTS_ENV_VAR)
    from mlflow.utils.server_cli_utils import resolve_default_artifact_root

    artifact_root = resolve_default_artifact_root(True, None, args.backend_store_uri)  # mlflow-artifacts:/
    return {BACKEND_STORE_URI_ENV_VAR: args.backend_store_uri, REGISTRY_STORE_URI_ENV_VAR: args.backend_store_uri,
            ARTIFACT_ROOT_ENV_VAR: artifact_root, SERVE_ARTIFACTS_ENV_VAR: "true",
            ARTIFACTS_DESTINATION_ENV_VAR: args.artifacts_destination}, artifact_root


def _open_stores_in_process(args: argparse.Namespace) -> str | None:
    """Set the worker's environment and open the stores here (a fresh SQLite schema is created before
    the port opens: a client that finds the server healthy finds the schema there; the app's handlers
    reuse these stores). None when done; else why not: a name or a signature this MLflow lacks."""
    try:
        settings, artifact_root = _in_process_settings(args)
        from mlflow.server.handlers import initialize_backend_stores

        os.environ.update(settings)
        os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")  # (the CLI's job runner; unused)
        initialize_backend_stores(args.backend_store_uri, args.backend_store_uri, artifact_root)
    except (ImportError, TypeError) as err:
        return repr(err)
    return None


def serve(args: argparse.Namespace) -> None:
    """Serve until stopped (SIGTERM: uvicorn shuts down cleanly)."""
    # uvicorn before anything of mlflow.server: that package decides at import whether it runs as a
    # server (uvicorn loaded, as in the CLI's worker) and only then installs its Flask security
    # middleware (allowed hosts, CORS).
    import uvicorn

    why_not = "--cli given" if args.cli else _open_stores_in_process(args)
    if why_not is not None:
        command = cli_command(args)
        print(f"ladder.run.mlflow_server: serving through the mlflow server CLI ({why_not})", file=sys.stderr,
              flush=True)
        os.execv(command[0], command)  # the same process: a watchdog ending its session ends the server
    import mlflow
    from mlflow.server.fastapi_app import app

    print(f"ladder.run.mlflow_server: MLflow {mlflow.__version__} serving {args.backend_store_uri} on "
          f"http://{args.host}:{args.port} in one process", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, workers=1, log_level="warning")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ladder.run.mlflow_server", description=__doc__.splitlines()[0])
    parser.add_argument("--backend-store-uri", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--artifacts-destination", required=True)
    parser.add_argument("--cli", action="store_true", help="run the `mlflow server` CLI (two processes) instead")
    return parser.parse_args(argv)


if __name__ == "__main__":
    serve(parse_args())
