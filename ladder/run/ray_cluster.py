"""The Ray a sweep runs on: an --address checked before anything is written, a private local Ray or a
cluster connected to, and the checks that a sweep's trials fit the machine or the cluster's nodes.

Ray is imported inside the functions that need it: planning, a sweep's status and a finished sweep's
rerun never load it.
"""

from __future__ import annotations

import logging
import math
import os

from ladder.errors import LadderInputError
from rungs.host_memory import ALLOCATOR_ENV
from sweeps.plan import PlannedTrial, check_fits_cluster

RAY_PROBE_SECONDS = 3.0
RAY_CLIENT_PORT = 10001  # the port `ray://host` means (Ray Client's default)


def ray_endpoint(address: str | None) -> tuple[str, int] | None:
    """The (host, port) an --address names, as ray.init reads it: `host:port` (the GCS) or
    `ray://host[:port]` (Ray Client). None for a private local Ray (None, "local") and for "auto"
    (ray.init finds the cluster itself) and for forms it does not name a port by."""
    if not address or address in ("local", "auto"):
        return None
    rest = address
    default_port = None
    if "://" in address:
        scheme, _, rest = address.partition("://")
        if scheme != "ray":
            return None
        default_port = RAY_CLIENT_PORT
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or "]" in port:  # no port (or a bare IPv6 address)
        host, port = rest, ""
    host = host.strip("[]")
    if not port:
        return (host, default_port) if host and default_port else None
    if not port.isdigit() or not host:
        return None
    return host, int(port)


def check_ray_address(address: str | None, *, timeout: float = RAY_PROBE_SECONDS) -> None:
    """Refuse, in one line and before anything is written, an --address at which nothing answers (ray.init
    would retry the connection for a minute or more). A TCP connect with a short timeout; no-op for a
    private local Ray and for "auto"."""
    import socket

    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    try:
        with socket.create_connection(endpoint, timeout=timeout):
            pass
    except OSError:
        raise LadderInputError(f"no Ray cluster answers at {address}: start one with `ray start --head` or "
                               "leave --address out", field="--address") from None


def check_fits_this_machine(trials: list[PlannedTrial], *, where: str) -> None:
    """Trials that a private local Ray (no --address) could never place, refused before Ray starts or data
    is prepared: that Ray gets this machine's CPUs (`connect_ray`). GPUs are left to the cluster check
    after Ray starts: Ray, not this process, decides which GPUs it sees."""
    check_fits_cluster(trials, [{"CPU": float(os.cpu_count() or 1), "GPU": math.inf}], where=where)


def connect_ray(address: str | None) -> bool:
    """Connect to `address` or start a private local Ray; True when this call started Ray. An address
    at which nothing answers is refused first (`check_ray_address`)."""
    import ray

    if ray.is_initialized():
        return False
    check_ray_address(address)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # The trial workers keep freed host memory for reuse (rungs.host_memory): glibc reads
    # ALLOCATOR_ENV when a worker process starts.
    kwargs = dict(log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING,
                  runtime_env={"env_vars": {"RAY_CHDIR_TO_TRIAL_DIR": "0", **ALLOCATOR_ENV}})
    if address:
        ray.init(address=address, **kwargs)
    else:
        # "local", not None: never attach silently to some other cluster running on this machine.
        ray.init(address="local", num_cpus=os.cpu_count(), **kwargs)
    return True


def cluster_nodes() -> list[dict[str, float]]:
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
