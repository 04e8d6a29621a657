"""Sweeps on a real Ray cluster: resumable after a killed driver, retries, divergence, bad specs.

The cluster is real and multi-node on loopback: a head node (`ray start --head`) plus a second node
joined to it (`ray start --address`), each in a process session of its own so teardown ends exactly
the processes this test started. Trials are real training jobs (`rungs.train.train`) on the
smallest cpu-demo rung, a few steps each.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ladder.cli import main
from ladder.run.sweep_runs import find_runs, trial_state
from ladder.run.tracking_server import free_port
from sweeps.spec import SWEEPS_DIR
from tests.ladder.test_sweep_checks import bad_spec
# What these tests check is where trials end up (finished, resumed, retried, diverged), never their BPB:
# their trials evaluate one held-out document per domain.
from tests.rungs.train_helpers import ONE_DOC_EVAL

RAY = str(Path(sys.executable).parent / "ray")
LADDER = [sys.executable, "-m", "ladder"]


def _ray_node(args: list[str], temp_dir: Path) -> subprocess.Popen:
    log = open(temp_dir.parent / f"ray-{len(list(temp_dir.parent.glob('ray-*')))}.log", "wb")  # noqa: SIM115
    # Two things of Ray's that nothing here uses: the log monitor, which pushes the node's log files to
    # the drivers that ask for them (none here: `connect_ray` sets log_to_driver=False and the probes print
    # their own answer) and polled them for the module's whole length (5-15 s of CPU); and the workers a
    # node starts for its first driver (a probe), which carry no runtime env while every sweep and prepare
    # driver sets one (`connect_ray`), so no task of theirs could run in them (~1.3 s of CPU each).
    return subprocess.Popen([RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                             "--include-log-monitor=false", f"--temp-dir={temp_dir}", *args],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_prestart_worker_first_driver": "0"})


# Guards against a hang, far above any plausible run (a node joins in seconds; a smoke sweep takes
# minutes on 2 busy cores): they end a stuck test, they never judge a slow one.
GUARD_SECONDS = 3600


def _wait_in_probe(address: str, condition: str, why: str, timeout_seconds: float = GUARD_SECONDS) -> None:
    """Until `condition` (Python, with `ray` connected to the cluster) holds. One probe process polls it
    in a loop, so each wait pays for one Python start and `import ray`, not one per poll; a probe
    that cannot connect yet (the head is still starting) exits and the next one tries again."""
    probe = textwrap.dedent(f"""
        import time
        import ray
        ray.init(address="{address}", logging_level="ERROR")
        while not ({condition}):
            time.sleep(0.5)
        print("ready")
    """)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                 env={**os.environ, "RAY_AUTH_MODE": "disabled"},
                                 timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
        if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == ["ready"]:
            return
        time.sleep(1)
    raise TimeoutError(f"Ray cluster at {address} {why}")


def _wait_for_port(host: str, port: int, proc: subprocess.Popen, timeout_seconds: float = GUARD_SECONDS) -> None:
    """Until something accepts TCP connections at host:port (a connect attempt, no process started)."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Ray head exited with code {proc.returncode} before listening on port {port}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listens on {host}:{port}")


def _wait_for_nodes(address: str, count: int) -> None:
    _wait_in_probe(address, f'sum(1 for n in ray.nodes() if n["Alive"]) == {count}',
                   f"did not reach {count} nodes")


def _wait_for_idle_cluster(address: str) -> None:
    """Until every CPU of the cluster is free again (no trial of a dead driver still holds one)."""
    _wait_in_probe(address, 'ray.available_resources().get("CPU", 0.0) >= ray.cluster_resources().get("CPU", 0.0)',
                   "still runs the killed driver's trials")


@pytest.fixture(scope="module")
def ray_cluster():
    """A two-node Ray cluster on loopback (2 + 1 CPUs); its address."""
    short = Path(f"/tmp/lt{os.getpid()}")  # Ray's unix sockets need a short path
    short.mkdir(exist_ok=True)
    port = free_port()
    head = _ray_node(["--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false"], short / "ray")
    address = f"127.0.0.1:{port}"
    nodes = [head]
    try:
        # The second node is started once the head's GCS port answers (a TCP connect, where a probe is a
        # Python start, `import ray` and a driver: ~2 s of CPU); one probe then waits for both nodes.
        _wait_for_port("127.0.0.1", port, head)
        nodes.append(_ray_node([f"--address={address}", "--num-cpus=1"], short / "ray"))
        _wait_for_nodes(address, 2)
        # The sweep drivers started from here inherit it (the cluster takes no token); set for this
        # module only, so that no later test in this worker inherits it.
        with pytest.MonkeyPatch.context() as env:
            env.setenv("RAY_AUTH_MODE", "disabled")
            yield address
    finally:
        # Only the sessions this fixture started, killed outright. SIGTERM bought nothing: a node drains
        # for ~30 s before it exits (measured 31-33 s), so the 5 s of grace it was given always ended in
        # SIGKILL anyway. Ray's workers run in process groups of their own and exit when their raylet dies.
        for proc in reversed(nodes):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in nodes:
            proc.wait(timeout=60)
        shutil.rmtree(short, ignore_errors=True)


def _peek(db: Path) -> list[str]:
    """Run statuses read straight from the SQLite file (read-only: an MLflow client here could
    race the driver creating the schema)."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return [row[0] for row in con.execute("SELECT status FROM runs")]
    except sqlite3.OperationalError:  # schema not created yet, or a writer holds the lock
        return []


def _sweep(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*LADDER, "sweep", *args], capture_output=True, text=True, timeout=GUARD_SECONDS, **kw)


def _sweep_here(args: list[str], capsys) -> tuple[int, str, str]:
    """`ladder sweep ...` in this process: (exit code, stdout, stderr). For the commands that start no Ray
    and no server (status, a spec refused by the plan, a rerun with every trial finished): a process of
    their own would add only its imports (~5 s of torch, MLflow and Ray)."""
    capsys.readouterr()
    rc = main(["sweep", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# The smoke sweep, one trial at a time and long enough that the third trial spends many polls between
# its first checkpoint and its end: the kill below waits for that state, whatever the machine's speed
# (with two trials at once and 20 steps the window was a few seconds and a loaded machine missed it).
# One at a time, the window is every step after the first checkpoint (step 5): 25 steps here, 2.5-5 s at
# the 0.1-0.2 s a step measured on the 2-core box (under a load of 10, too), while the poll saw the state
# at its first 0.2 s poll after the checkpoint appeared. 60 steps only trained ~90 more steps across the
# three trials and the resumed one (~15 s of CPU); what is checked does not depend on the count.
KILL_STEPS = 30


def _kill_spec(tmp_path: Path) -> str:
    spec = yaml.safe_load((SWEEPS_DIR / "smoke.yaml").read_text())
    spec.update(max_steps=KILL_STEPS, max_concurrent=1, overrides={**spec["overrides"], **ONE_DOC_EVAL})
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.slow
def test_killed_driver_rerun_finishes_every_trial_exactly_once(ray_cluster, tmp_path, capsys):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    smoke = _kill_spec(tmp_path)
    cmd = [*LADDER, "sweep", "run", smoke, "--address", ray_cluster, "--tracking-uri", store, "--new-store", "--json"]
    driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Kill once two trials are finished and the third has a checkpoint (every 5 steps) to resume from.
    deadline = time.monotonic() + GUARD_SECONDS
    while time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.2)  # many polls in the window (~3 s of steps on the idle machine, longer under load)
        dirs = list((tmp_path / "sweeps" / "smoke").glob("*"))
        done = [d for d in dirs if (d / "result.json").exists()]
        resumable = [d for d in dirs if (d / "checkpoint.pt").exists() and not (d / "result.json").exists()]
        if len(done) >= 2 and resumable and _peek(tmp_path / "mlflow.db").count("RUNNING") == 1:
            break
    assert driver.poll() is None, f"the sweep ended before it could be killed: {driver.communicate()}"
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    _wait_for_idle_cluster(ray_cluster)  # Ray has ended the dead driver's trials: nothing may finish after this
    states = {k: trial_state(rs).state for k, rs in find_runs(store, "sweep-smoke").items()}
    finished_before = {k for k, s in states.items() if s == "finished"}
    interrupted = {k for k, s in states.items() if s == "running"}
    assert len(finished_before) == 2 and len(interrupted) == 1, states
    rc, out, err = _sweep_here(["status", smoke, "--tracking-uri", store, "--json"], capsys)
    assert rc == 0, err
    status = json.loads(out)
    (running,) = [t for t in status["trials"] if t["state"] == "running"]
    step, total = re.match(r"step (\d+)/(\d+), \d+ s ago$", running["progress"]).groups()
    assert int(step) < int(total)  # the steps up to its checkpoint are in MLflow; the rest were not run

    rerun = _sweep(["run", smoke, "--address", ray_cluster, "--tracking-uri", store, "--json"])
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert summary["trials"] == 3
    assert summary["skipped"] == len(finished_before)
    assert summary["completed"] == 3 - len(finished_before)
    assert summary["failed"] == summary["diverged"] == 0

    # Exactly once in MLflow: one run per key, finished, its final metrics logged once.
    records = find_runs(store, "sweep-smoke")
    keys = {t["key"] for t in summary["results"]}
    assert set(records) == keys
    client = MlflowClient(store)
    for key in keys:
        assert len(records[key]) == 1, f"trial {key} has {len(records[key])} runs"
        run = records[key][0]
        assert run.status == "FINISHED" and run.tags["sweep"] == "smoke" and run.tags["outcome"] == "finished"
        assert len(client.get_metric_history(run.run_id, "final_loss")) == 1
        assert run.tags["attempt"] == ("2" if key in interrupted else "1")  # resumed into the same run
        history = [m.step for m in client.get_metric_history(run.run_id, "loss")]
        steps = set(history)
        assert len(history) == len(steps)  # no step logged twice, the resumed stretch included
        if key in interrupted:
            # The job buffers per-step metrics and the kill dropped the unflushed ones; every step
            # after the checkpoint it resumed from is in the store, once.
            resumed_from = min(steps) - 1  # a checkpoint step (every 5), or 0 once the job flushes at checkpoints
            assert resumed_from % 5 == 0 and steps == set(range(resumed_from + 1, KILL_STEPS + 1))
        else:
            assert steps == set(range(1, KILL_STEPS + 1))

    # Every trial finished: the rerun decides from MLflow alone and starts neither Ray nor a server.
    rc, out, _ = _sweep_here(["run", smoke, "--address", ray_cluster, "--tracking-uri", store, "--json"], capsys)
    assert rc == 0
    counts = {k: v for k, v in json.loads(out).items() if k in ("trials", "completed", "skipped", "failed",
                                                                "diverged")}
    assert counts == {"trials": 3, "completed": 0, "skipped": 3, "failed": 0, "diverged": 0}


# One trial at a time: Ray Tune reuses the one trial actor (its process start and torch/rungs imports,
# ~5 s of CPU) for the next trial; what is checked is each trial's outcome and attempts, not concurrency.
FAULTS = {
    "name": "faults", "recipe": "cpu-demo", "max_steps": 6, "max_failures": 1, "max_concurrent": 1,
    "resources": {"cpus": 1}, "overrides": ONE_DOC_EVAL,
    "blocks": [{"name": "f", "rungs": [3], "arms": {
        "ok": {},
        "broken": {"data_manifest": "BROKEN_MANIFEST"},  # passes the plan's checks, then raises at run time
        "blowup": {"lr": 1.0e4, "adam_lr": 10.0},  # loss goes non-finite within a few steps
    }}],
}


@pytest.mark.slow
def test_raising_trial_is_retried_then_failed_and_diverged_trial_is_not_retried(ray_cluster, tmp_path, capsys):
    spec_path = tmp_path / "faults.yaml"
    # A manifest the plan accepts (it exists, its files exist, it has cpu-demo's sources) whose documents are
    # not JSON: only preparing it, on the worker, finds that out.
    names = ("code", "web", "stem", "books", "math", "qa")
    (tmp_path / "broken.jsonl").write_text("not json\n")
    manifest = tmp_path / "broken_manifest.yaml"
    manifest.write_text(yaml.safe_dump({"sources": [{"name": n, "share": 1 / 6, "files": ["broken.jsonl"]}
                                                    for n in names]}))
    broken = {**FAULTS["blocks"][0]["arms"]["broken"], "data_manifest": str(manifest)}
    faults = {**FAULTS, "blocks": [{**FAULTS["blocks"][0], "arms": {**FAULTS["blocks"][0]["arms"], "broken": broken}}]}
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Diverged is a result: a sweep whose trials finished or diverged exits 0.
    FAULTS_NO_CRASH = {**FAULTS, "blocks": [{**FAULTS["blocks"][0], "arms": {
        k: v for k, v in FAULTS["blocks"][0]["arms"].items() if k != "broken"}}]}
    spec_path.write_text(yaml.safe_dump(FAULTS_NO_CRASH))
    out = _sweep(["run", str(spec_path), "--address", ray_cluster, "--tracking-uri", store, "--new-store", "--json"])
    assert out.returncode == 0, out.stderr
    assert {k: json.loads(out.stdout)[k] for k in ("completed", "diverged", "failed")} == {
        "completed": 1, "diverged": 1, "failed": 0}
    # A failed trial does not take the sweep down, but the sweep exits 1 so cron and CI see it.
    spec_path.write_text(yaml.safe_dump(faults))
    out = _sweep(["run", str(spec_path), "--address", ray_cluster, "--tracking-uri", store, "--json"])
    assert out.returncode == 1, out.stderr
    assert "1 trial(s) failed" in out.stderr.splitlines()[-1]  # (Ray Tune logs the trial's own traceback above)
    summary = json.loads(out.stdout)
    by_arm = {r["trial"].split()[-2]: r for r in summary["results"]}
    assert {k: summary[k] for k in ("trials", "completed", "skipped", "failed", "diverged")} == {
        "trials": 3, "completed": 0, "skipped": 2, "failed": 1, "diverged": 0}
    assert by_arm["ok"]["state"] == "finished"
    assert by_arm["broken"]["state"] == "failed" and by_arm["broken"]["attempts"] == 2  # 1 try + 1 retry
    assert "broken.jsonl" in (by_arm["broken"]["error"] or "") and "\n" not in by_arm["broken"]["error"]
    assert by_arm["blowup"]["state"] == "diverged" and by_arm["blowup"]["attempts"] == 1

    rc, out, err = _sweep_here(["status", str(spec_path), "--tracking-uri", store, "--json"], capsys)
    assert rc == 0, err
    status = json.loads(out)
    assert status["counts"] == {"finished": 1, "failed": 1, "diverged": 1}
    failed = [t for t in status["trials"] if t["state"] == "failed"]
    assert "broken.jsonl" in failed[0]["error"]  # the reason, not just the state
    runs = find_runs(store, "sweep-faults")
    diverged = runs[by_arm["blowup"]["key"]][0]
    assert diverged.tags["outcome"] == "diverged" and diverged.tags["diverged"] == "true"
    assert all(r.tags["outcome"] == "failed" for r in runs[by_arm["broken"]["key"]])


@pytest.mark.slow
def test_resources_larger_than_the_cluster_exit_2_before_any_trial(ray_cluster, tmp_path):
    # A batch that splits over 4 workers, so the cluster check (not the batch check) is what refuses.
    spec = bad_spec(tmp_path, resources={"cpus": 2, "workers": 4},
                     overrides={"checkpoint_interval": 5, "batch_sequences": 8})
    store = tmp_path / "mlflow.db"
    out = _sweep(["run", spec, "--address", ray_cluster, "--tracking-uri", f"sqlite:///{store}", "--new-store",
                  "--json"])
    assert out.returncode == 2
    assert "cluster has 3 CPU" in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""
    assert find_runs(f"sqlite:///{store}", "sweep-smoke") == {}


@pytest.mark.slow
def test_multi_worker_trial_runs_as_one_torchtrainer_job_and_one_mlflow_run(ray_cluster, tmp_path, capsys):
    spec = {"name": "two_workers", "recipe": "cpu-demo", "max_steps": 4, "max_failures": 0,
            "resources": {"cpus": 1, "workers": 2}, "blocks": [{"name": "b", "rungs": [3]}]}
    path = tmp_path / "two.yaml"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # A batch the two ranks cannot split evenly is refused before launch; an even one runs.
    spec["overrides"] = {"batch_sequences": 7, **ONE_DOC_EVAL}
    path.write_text(yaml.safe_dump(spec))
    rc, _, err = _sweep_here(["run", str(path), "--address", ray_cluster, "--tracking-uri", store, "--json"], capsys)
    assert rc == 2 and "does not split over 2 workers" in err
    spec["overrides"] = {"batch_sequences": 8, **ONE_DOC_EVAL}
    path.write_text(yaml.safe_dump(spec))
    out = _sweep(["run", str(path), "--address", ray_cluster, "--tracking-uri", store, "--new-store", "--json"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["completed"] == 1, out.stdout
    (runs,) = find_runs(store, "sweep-two_workers").values()
    assert len(runs) == 1  # rank 0 alone tracks
    assert runs[0].tags["workers"] == "2" and runs[0].tags["outcome"] == "finished"
    assert runs[0].tags["ep"] == "2"  # no ep in the spec: the memory planner's (ladder.run.trial.expert_parallel_size)


TWIN = {"name": "twin", "recipe": "cpu-demo", "max_steps": 6, "max_failures": 0, "max_concurrent": 1,
        "resources": {"cpus": 1}, "overrides": {"checkpoint_interval": 3, **ONE_DOC_EVAL},
        "blocks": [{"name": "lr", "rungs": [3], "lr_wd": {"log_lr": {"spacing": 0.7, "points": 2}}}]}


@pytest.mark.slow
def test_two_drivers_of_one_spec_on_one_fresh_store_train_each_trial_once(ray_cluster, tmp_path):
    """Started together on a store that does not exist yet: neither crashes creating MLflow's schema
    or the experiment, and each trial is trained once (one run, one loss point per step)."""
    path = tmp_path / "twin.yaml"
    path.write_text(yaml.safe_dump(TWIN))
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [*LADDER, "sweep", "run", str(path), "--address", ray_cluster, "--tracking-uri", store, "--new-store",
           "--json"]
    drivers = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [d.communicate(timeout=GUARD_SECONDS) for d in drivers]
    for driver, (out, err) in zip(drivers, outs):
        assert driver.returncode == 0, err
        assert "already exists" not in err and "Traceback" not in err
        summary = json.loads(out)
        assert summary["trials"] == 2 and summary["failed"] == 0
    records = find_runs(store, "sweep-twin")
    assert len(records) == 2
    client = MlflowClient(store)
    for key, runs in records.items():
        assert len(runs) == 1, f"trial {key} has {len(runs)} runs"
        assert runs[0].status == "FINISHED" and runs[0].tags["outcome"] == "finished"
        history = [m.step for m in client.get_metric_history(runs[0].run_id, "loss")]
        assert sorted(history) == list(range(1, TWIN["max_steps"] + 1)), f"trial {key} logged steps {history}"


@pytest.mark.slow
def test_data_prepare_on_the_cluster_writes_the_same_bytes_as_one_process(ray_cluster, tmp_path):
    """`ladder data prepare --address`: the segments of each file (several per file at this shard size) run
    as tasks on the two-node cluster (the sweep's cluster) and the shards, indices and manifest are the
    bytes a single process writes."""
    from rungs.data.prepare import prepare

    from tests.rungs.data.conftest import demo_words

    words = demo_words()[:8_000]  # real text without repeats: the held-out document shares no 13-gram with b
    corpus = tmp_path / "corpus"
    for k in range(3):  # source a: 3 files, source b: 2; each file is one unit of work
        lines = [json.dumps({"id": f"a{k}-{i}", "text": " ".join(words[(k * 40 + i) * 25:(k * 40 + i + 1) * 25])})
                 for i in range(40)]
        (corpus / "a").mkdir(parents=True, exist_ok=True)
        (corpus / "a" / f"part-{k}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for k in range(2):
        (corpus / "b").mkdir(parents=True, exist_ok=True)
        (corpus / "b" / f"doc-{k}.txt").write_text(" ".join(words[6_000 + k * 900:6_000 + (k + 1) * 900]),
                                                   encoding="utf-8")
    (corpus / "held.jsonl").write_text(json.dumps({"id": "h", "text": " ".join(words[-400:])}) + "\n",
                                       encoding="utf-8")
    manifest = corpus / "manifest.yaml"
    manifest.write_text("name: cluster\nsources:\n"
                        "  - {name: a, share: 0.6, files: ['a/*.jsonl']}\n"
                        "  - {name: b, share: 0.4, files: ['b/*.txt']}\n"
                        "eval:\n  - {domain: x, files: [held.jsonl]}\n")
    local = prepare(manifest, tmp_path / "local", vocab_size=300, shard_bytes=2_000)
    out = subprocess.run([*LADDER, "data", "prepare", str(manifest), "--out", str(tmp_path / "cluster"),
                          "--vocab-size", "300", "--address", ray_cluster, "--shard-bytes", "2000", "--json"],
                         capture_output=True, text=True, timeout=GUARD_SECONDS,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert out.returncode == 0, out.stderr
    remote = tmp_path / "cluster"

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert files(remote) == files(local)
    assert len(json.loads((local / "meta.json").read_text())["sources"][0]["shards"]) >= 6  # 3 files, split
