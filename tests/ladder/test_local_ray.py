"""The private local Ray a sweep starts (`connect_ray(None)`): who can talk to it, and its workers' env.

Ray 2.60 cannot be told to listen on loopback only: `ray.init` maps 127.0.0.1 to the machine's
address, and its GCS, raylet and worker gRPC servers listen on every interface (measured: `::`).
What keeps another machine out is Ray's token authentication, on by default for a new local
cluster; this test holds the sweep driver to it (nothing may set RAY_AUTH_MODE=disabled) and
records what listens where.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

GUARD_SECONDS = 1800  # ends a hung start; never a judgement of speed

PROBE = textwrap.dedent("""
    import json, os, psutil
    from ladder.run.orchestrate import connect_ray
    assert connect_ray(None)
    me = psutil.Process()
    listening = []
    for proc in me.children(recursive=True):
        try:
            listening += [[proc.name(), c.laddr.ip] for c in proc.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            pass
    import ray
    from rungs.host_memory import ALLOCATOR_ENV
    worker_env = ray.get(ray.remote(lambda: {k: os.environ.get(k) for k in ALLOCATOR_ENV}).remote())
    ray.shutdown()
    print(json.dumps({"auth_mode": os.environ.get("RAY_AUTH_MODE"), "listening": listening,
                      "worker_env": worker_env}))
""")


def test_the_private_local_ray_requires_its_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # a token of its own, not one left in the user's ~/.ray
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=GUARD_SECONDS)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["auth_mode"] == "token", report
    assert report["listening"], "found none of Ray's listening sockets"
    # and its workers start with the allocator policy that keeps a step's freed memory (rungs.host_memory)
    from rungs.host_memory import ALLOCATOR_ENV

    assert report["worker_env"] == ALLOCATOR_ENV
