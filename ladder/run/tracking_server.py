"""A local MLflow tracking server on loopback, owned by one sweep driver.

Why: the embedded store is one SQLite file (`runs/mlflow.db`), and SQLite takes one writer at a
time: many trials writing the file directly at once get "database is locked" and lose points. So
the driver starts one MLflow server (one process, `ladder.run.mlflow_server`: the file's only writer) on 127.0.0.1,
and trials log over HTTP through it; the server serialises the writes and the MLflow client
retries transient HTTP errors.

Lifecycle: the server runs under a small watchdog (`python -m ladder.run.tracking_server --watch-pid`)
in a session of its own. The watchdog kills the whole session when the driver process disappears,
so a driver killed with SIGKILL does not leave a server holding the port and the database.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ladder.errors import LadderInputError
from rungs.run_files import process_alive
from rungs.tracking import sqlite_path, store_lock
from rungs.tracking_uri import DEFAULT_TRACKING_URI

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_SECONDS = 600.0  # a hang guard: a server starts in seconds, minutes on a very busy machine
WATCH_INTERVAL_SECONDS = 0.5


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_local_store(uri: str) -> bool:
    """A store the driver must front with a server (SQLite or a plain directory), not one already served."""
    return not uri.startswith(("http://", "https://", "databricks", "postgresql", "mysql"))


def healthy(uri: str, timeout_seconds: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=timeout_seconds) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class TrackingServer:
    """`with TrackingServer("sqlite:///runs/mlflow.db") as uri:` → an http:// URI trials log to."""

    def __init__(self, store_uri: str = DEFAULT_TRACKING_URI, *, artifacts_dir: Path | None = None,
                 host: str = "127.0.0.1", port: int | None = None, via_cli: bool = False) -> None:
        if not is_local_store(store_uri):
            raise LadderInputError(f"{store_uri} is already a server or database; trials can log to it directly",
                                   field="--tracking-uri")
        self.store_uri = store_uri
        db = sqlite_path(store_uri)
        base = db.parent if db is not None else Path("runs")
        self.artifacts_dir = Path(artifacts_dir) if artifacts_dir else base / "mlartifacts"
        self.host = host
        self.port = port
        self.via_cli = via_cli  # through the `mlflow server` CLI (why not by default: ladder.run.mlflow_server)
        self.uri: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log_path = base / "mlflow-server.log"

    def start(self) -> str:
        db = sqlite_path(self.store_uri)
        if db is not None:
            with store_lock(self.store_uri):  # a new store starts from the schema template (rungs.tracking)
                pass
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        self.uri = f"http://{self.host}:{self.port}"
        server = [sys.executable, "-m", "ladder.run.mlflow_server", "--backend-store-uri", self.store_uri,
                  "--host", self.host, "--port", str(self.port),
                  "--artifacts-destination", str(self.artifacts_dir.resolve()), *(["--cli"] if self.via_cli else [])]
        cmd = [sys.executable, "-m", "ladder.run.tracking_server", "--watch-pid", str(os.getpid()), "--", *server]
        log_file = open(self._log_path, "ab")  # noqa: SIM115 (the child owns it for its lifetime)
        t0 = time.monotonic()
        # The server's job runner (GenAI evaluation jobs) is a second heavy process we never use.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self._proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env=env)
        log_file.close()
        while not healthy(self.uri):
            if self._proc.poll() is not None:
                raise RuntimeError(f"MLflow server exited with code {self._proc.returncode}; see {self._log_path}")
            if time.monotonic() - t0 > STARTUP_TIMEOUT_SECONDS:
                self.stop()
                raise RuntimeError(f"MLflow server not healthy after {STARTUP_TIMEOUT_SECONDS:.0f} s; see {self._log_path}")
            time.sleep(0.2)
        log.info("MLflow tracking server %s over %s (%.1f s to start)", self.uri, self.store_uri, time.monotonic() - t0)
        return self.uri

    def stop(self) -> None:
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGTERM)
            self._proc.wait(timeout=15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=5)
        self._proc = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _watchdog(argv: list[str] | None = None) -> int:
    """Run the server as a child; end the whole session when the driver or the server goes away."""
    parser = argparse.ArgumentParser(prog="python -m ladder.run.tracking_server")
    parser.add_argument("--watch-pid", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    child = subprocess.Popen(command)

    def end_session(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)  # the server, its workers, and this watchdog
        sys.exit(0)

    signal.signal(signal.SIGTERM, end_session)
    # Reparenting (getppid changes) catches a SIGKILLed driver even before anyone reaps it.
    while child.poll() is None and os.getppid() == args.watch_pid and process_alive(args.watch_pid):
        time.sleep(WATCH_INTERVAL_SECONDS)
    end_session()
    return 0


if __name__ == "__main__":
    sys.exit(_watchdog())
