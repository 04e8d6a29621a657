"""The MLflow store a command names, checked before anything reads or writes it: a file that is missing,
empty, truncated, foreign or locked, a store directory that does not exist, or a tracking server that
does not answer is refused in one line that says the way out (`StoreError`, exit 2).

Every command that reads runs checks its store first (`ladder sweep run|status`, `ladder fit
--experiment`, `ladder extrapolate --experiment`, through `ladder.run.mlflow_runs.read_runs`), so a
mistyped path creates nothing and shows nothing as "pending", and a server that is down fails in
seconds instead of after MLflow's minutes of retries.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

from ladder.errors import StoreError
from rungs.tracking import sqlite_path
from rungs.tracking_uri import DEFAULT_TRACKING_URI, TRACKING_URI_ENV

# What a --tracking-uri may be, in the words a user can act on (MLflow's own list is in its error; file stores
# are refused by MLflow 3 unless MLFLOW_ALLOW_FILE_STORE=true).
TRACKING_URI_FORMS = "sqlite:///path/to/mlflow.db or an MLflow server http(s)://host:port"
SQLITE_MAGIC = b"SQLite format 3\x00"
# How long a reader waits for another process's lock before calling the store locked. A tracking
# server's writes hold it for milliseconds; a process holding it this long is not going to let go.
LOCK_WAIT_SECONDS = 20.0


def check_store(store: str, *, create: bool, command: str = "ladder sweep run SPEC") -> None:
    """`_check_store` (its docstring), a refusal naming $MLFLOW_TRACKING_URI where the store came from it."""
    try:
        _check_store(store, create=create, command=command)
    except StoreError as err:
        if store and store == os.environ.get(TRACKING_URI_ENV) and err.field == "--tracking-uri":
            raise StoreError(err.detail, where=err.where, field=f"--tracking-uri (or ${TRACKING_URI_ENV}, "
                                                                f"which names this store)") from None
        raise


def _check_store(store: str, *, create: bool, command: str) -> None:
    """Refuse a store that cannot be what the user meant, before anything reads or writes it.

    A `sqlite:///` file or a store directory that does not exist is created only when `create` (the
    default store of `ladder sweep run`, or `--new-store`): a mistyped path would otherwise become an
    empty store that shows every trial pending. An existing SQLite file must be a whole, unlocked
    MLflow database. An HTTP(S) tracking server must answer within `SERVER_WAIT_SECONDS`. An in-memory
    SQLite URI keeps nothing and is refused; so are a scheme MLflow does not know, a database whose
    driver is not installed, Databricks without a workspace, and file-store directories (MLflow 3
    refuses them unless MLFLOW_ALLOW_FILE_STORE is set; then an existing one must hold experiments).
    A store to be created may not lie under a file. A database server must accept a connection
    (`check_database_answers`); its credentials MLflow checks when first used. `command` is the one a refusal names for creating a new store (the demo's own, for `ladder demo`).
    """
    if not store.strip():
        raise StoreError("empty tracking URI; leave the flag out for the default store (sqlite:///runs/mlflow.db) "
                         "or name one", field="--tracking-uri")
    if store.startswith(("http://", "https://")):
        check_server(store)
        return
    if _is_in_memory(store):
        raise StoreError(f"{store!r} is an in-memory SQLite store: it keeps nothing once the command ends (every "
                         f"trial would show pending, and a sweep's results would be lost); give a file, "
                         f"sqlite:///path/to/mlflow.db", field="--tracking-uri")
    db = sqlite_path(store)
    if db is None:
        directory = _directory_store(store)
        if directory is None:
            _check_other_scheme(store)
            return
        _check_directory_store(store, directory, create=create, command=command)
        return
    if not str(db) or str(db) == ".":
        raise StoreError(f"{store} names no database file; write sqlite:///path/to/mlflow.db", field="--tracking-uri")
    if not db.exists():
        if create:
            _check_creatable(db)
            return
        if store == DEFAULT_TRACKING_URI:
            raise StoreError(f"no MLflow store at {db}: nothing has been tracked from this directory yet. Run from the "
                             f"directory whose runs/ holds the store, or point --tracking-uri at it; `ladder sweep run "
                             f"SPEC` creates this one, and `ladder sweep plan SPEC` lists a sweep's trials without a "
                             f"store", field="--tracking-uri")
        raise StoreError(f"no MLflow store at {db}: the file does not exist. Check the path (a mistyped one would "
                         f"start an empty store showing every trial pending), or create a new, empty store there with "
                         f"`{command} --tracking-uri {store} --new-store`", field="--tracking-uri")
    _check_sqlite(db)


def _directory_store(store: str) -> Path | None:
    """The directory of a file store (`./mlruns`, `file:///...`); None for servers and databases."""
    if store.startswith("file:"):
        return Path(store[len("file:"):].removeprefix("//"))
    if "://" in store or store.startswith(("databricks", "uc:")):
        return None
    return Path(store)


def _is_in_memory(store: str) -> bool:
    """`sqlite://`, `sqlite:///:memory:` (and `sqlite+driver://` forms): a database that lives and dies with
    the process."""
    scheme, sep, rest = store.partition("://")
    if not sep or scheme.split("+", 1)[0].lower() != "sqlite":
        return False
    path = rest.split("?", 1)[0]
    return path in ("", "/:memory:") or path.startswith("/file::memory:")  # sqlite:/// names no file: refused apart


def _check_other_scheme(store: str) -> None:
    """A database or service URI (postgresql://, mysql://, databricks, foo://): the scheme must be one
    MLflow reads, its database driver installed and, for Databricks, its credentials configured: refused
    before anything runs, where MLflow would raise when its client is made."""
    scheme = store.partition("://")[0] if "://" in store else store.partition(":")[0]
    base = scheme.split("+", 1)[0].lower()
    try:
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry

        known = sorted(s for s in _tracking_store_registry._registry if s)
    except Exception:  # noqa: BLE001 - a private MLflow name; without it, the schemes this MLflow shipped with
        known = ["databricks", "databricks-uc", "file", "http", "https", "mssql", "mysql", "postgresql", "sqlite", "uc"]
    if base not in known:
        raise StoreError(f"{store!r}: MLflow cannot read a store with this scheme; give {TRACKING_URI_FORMS} (schemes "
                         f"MLflow knows: {', '.join(s + '://' for s in known)})", field="--tracking-uri")
    if base in ("postgresql", "mysql", "mssql"):
        try:
            from sqlalchemy.engine import make_url

            url = make_url(store)
            url.get_dialect().import_dbapi()
        except ModuleNotFoundError as err:
            raise StoreError(f"{store!r}: MLflow needs the Python module {err.name!r} to read this store; install it, "
                             f"or give {TRACKING_URI_FORMS}", field="--tracking-uri") from None
        except Exception as err:  # noqa: BLE001 - a URL SQLAlchemy cannot parse, an unknown driver
            raise StoreError(f"{store!r}: not a database URL MLflow can use ({' '.join(str(err).split())}); give "
                             f"{TRACKING_URI_FORMS}", field="--tracking-uri") from None
        check_database_answers(store, url.host, url.port or DEFAULT_DB_PORTS[base])
        return
    if base in ("databricks", "databricks-uc", "uc"):
        import logging

        quiet = logging.getLogger("mlflow.utils.databricks_utils")  # its warning would be a second line
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            from mlflow.utils.databricks_utils import get_databricks_host_creds

            get_databricks_host_creds(store)
        except Exception as err:  # noqa: BLE001 - MlflowException, a missing databricks-sdk
            first = " ".join(str(err).split()).split(". ")[0]
            raise StoreError(f"{store!r}: no Databricks workspace is configured for this URI ({first}); set "
                             f"DATABRICKS_HOST and DATABRICKS_TOKEN or a profile, or give {TRACKING_URI_FORMS}",
                             field="--tracking-uri") from None
        finally:
            quiet.setLevel(level)


DEFAULT_DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def check_database_answers(store: str, host: str | None, port: int) -> None:
    """Refuse a database store whose server accepts no connection within SERVER_WAIT_SECONDS (SQLAlchemy
    would retry, then fail inside MLflow with a traceback). A TCP connect only: credentials and the
    database itself are the server's to judge. No host (a local Unix socket) is left to the driver."""
    import socket

    if not host:
        return
    try:
        with socket.create_connection((host, port), timeout=SERVER_WAIT_SECONDS):
            pass
    except OSError as err:
        why = err.strerror or str(err) or type(err).__name__
        raise StoreError(f"the database server of {store} does not answer at {host}:{port} ({why}); start it, open "
                         f"the tunnel to it, or check the host and port", field="--tracking-uri") from None


def _file_store_allowed() -> bool:
    return os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1")


def _check_directory_store(store: str, directory: Path, *, create: bool, command: str) -> None:
    """A file store (`./mlruns`, `file:///path`): MLflow 3 refuses these unless MLFLOW_ALLOW_FILE_STORE is
    set; an existing path must be a directory that holds an MLflow file store (an empty or foreign one
    would show every trial pending); a missing one is created only when `create`."""
    if directory.exists() and not directory.is_dir():
        hint = ""
        try:
            with open(directory, "rb") as fh:
                if fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:
                    hint = f"; for an SQLite store write sqlite:///{directory}"
        except OSError:
            pass
        raise StoreError(f"{directory} is a file, not an MLflow store directory{hint}; give {TRACKING_URI_FORMS}",
                         field="--tracking-uri")
    if not directory.exists() and not create:  # a mistyped path first: that is the likelier mistake
        raise StoreError(f"no MLflow store at {directory}: the directory does not exist. Check the path, or create "
                         f"a new, empty store there with `{command} --tracking-uri {store} --new-store`",
                         field="--tracking-uri")
    if not _file_store_allowed():
        raise StoreError(f"{store!r} is a file-store directory, and this MLflow refuses file stores (they are in "
                         f"maintenance mode): use an SQLite store, sqlite:///path/to/mlflow.db (`mlflow "
                         f"migrate-filestore` moves an existing one there), or set MLFLOW_ALLOW_FILE_STORE=true",
                         field="--tracking-uri")
    if not directory.exists():
        _check_creatable(directory)
        return
    if not create and not any((child / "meta.yaml").is_file() for child in directory.iterdir() if child.is_dir()):
        raise StoreError(f"{directory} is a directory but not an MLflow file store (no experiment in it holds a "
                         f"meta.yaml); check the path, or start a new store there with --new-store",
                         field="--tracking-uri")


def _check_creatable(path: Path) -> None:
    """A store to be created at `path`: no ancestor of it may be a file (mkdir would fail half-way)."""
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise StoreError(f"cannot create the MLflow store {path}: {parent} is a file, not a directory",
                                 field="--tracking-uri")
            return


def _check_sqlite(db: Path) -> None:
    import sqlite3

    def damaged(why: str) -> StoreError:
        return StoreError(f"the MLflow store {db} is damaged ({why}). Restore it from a copy; or move it aside and "
                          f"rerun with --new-store, then `ladder sweep run SPEC --reregister` to record the finished "
                          f"trials' results (kept in the run directories) in the new store", field="--tracking-uri")

    if db.is_dir():
        raise StoreError(f"{db} is a directory, not an SQLite file", field="--tracking-uri")
    size = db.stat().st_size
    with open(db, "rb") as fh:
        header = fh.read(100)
    if size == 0:
        raise damaged("the file is empty")
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        raise damaged("not an SQLite database: its header is wrong or cut short")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The header's page count is valid when its change counters agree (SQLite file format §1.3.7).
    if header[24:28] == header[92:96] and pages and size < pages * page_size:
        raise damaged(f"truncated: {size:,} bytes of the {pages * page_size:,} its header records")
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=LOCK_WAIT_SECONDS)
        try:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if {"experiments", "runs", "metrics"} - tables:
                raise StoreError(f"{db} is an SQLite database but not an MLflow store (no experiments/runs/metrics "
                                 f"tables); check --tracking-uri", field="--tracking-uri")
            con.execute("SELECT COUNT(*) FROM runs").fetchone()
        finally:
            con.close()
    except sqlite3.OperationalError as err:
        if "locked" in str(err) or "busy" in str(err):
            raise StoreError(f"the MLflow store {db} is locked by another process (waited {LOCK_WAIT_SECONDS:.0f} s). "
                             f"Another sweep or `mlflow` process may be writing it: let it finish or stop it, then "
                             f"rerun", field="--tracking-uri") from None
        raise damaged(str(err)) from None
    except sqlite3.DatabaseError as err:  # "file is not a database", "database disk image is malformed"
        raise damaged(str(err)) from None


# How long a tracking server may take to answer one request before it is called down (MLflow itself
# retries for minutes). DNS, connect and the reply all count: the probe runs in a thread that is
# abandoned at the deadline.
SERVER_WAIT_SECONDS = 5.0


def _probe(url: str, outcome: dict) -> None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=SERVER_WAIT_SECONDS):
            pass
        outcome["answered"] = True
    except urllib.error.HTTPError:  # it answered: an error status is for MLflow to report (auth, a proxy)
        outcome["answered"] = True
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        outcome["error"] = " ".join(str(reason).split()) or type(reason).__name__


def check_server(store: str) -> None:
    """Refuse an HTTP(S) tracking URI whose server does not answer within SERVER_WAIT_SECONDS."""
    outcome: dict = {}
    url = store.rstrip("/") + "/health"  # the MLflow server's liveness route; any HTTP answer will do
    probe = threading.Thread(target=_probe, args=(url, outcome), daemon=True, name="tracking-server-probe")
    probe.start()
    probe.join(SERVER_WAIT_SECONDS)
    if outcome.get("answered"):
        return
    why = outcome.get("error") or "no reply"
    raise StoreError(f"the tracking server at {store} does not answer within {SERVER_WAIT_SECONDS:g} s ({why}). Start "
                     f"it (cluster/mlflow/, or `mlflow server`), open the port-forward to it, or check the address",
                     field="--tracking-uri")
