"""Run a sweep on Ray: skip what MLflow says is finished, run the rest with Ray Tune, report.

Ray does the scheduling: `ray.init(address="local")` on a laptop, `--address` for a cluster; Ray
Tune's `Tuner` runs one trial per resolved config with `tune.with_resources` declaring every CPU
and GPU it uses, `max_concurrent_trials` bounding concurrency, and `FailureConfig(max_failures)`
retrying a trial that raises (a dead worker counts too). A diverged trial returns normally and is
not retried. Trials with more than one worker launch a Ray Train `TorchTrainer` from inside their
Tune trial (`ladder.run.trial`, via `rungs.launch.launch_ray`).

Tracking: a local store (the embedded `sqlite:///runs/mlflow.db`) is fronted by a tracking server
on loopback for the length of the sweep, because SQLite takes one writer at a time
(`ladder.run.tracking_server`); a server URI is used as given. MLflow, not Ray, is the record of what
is done, so a killed driver loses nothing: the rerun skips finished keys and resumes the rest.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from ladder.errors import LadderInputError, StoreError
from sweeps.cost import check_fits_memory, cost_sweep
from sweeps.plan import PlannedTrial, check_fits_cluster, plan_sweep, runs_root_for, spec_recipe
from ladder.run.stores import check_store
from ladder.run.sweep_runs import (TAG_ATTEMPT, TAG_ERROR, TAG_KEY, TAG_LABEL, TAG_OUTCOME, TAG_SWEEP, find_runs,
                                   stored_result_run_id, trial_state)
from ladder.run.sweep_runs import reregister as register_result
from ladder.run.tracking_server import TrackingServer, is_local_store
from rungs.host_memory import ALLOCATOR_ENV
from rungs.tracking import sqlite_path, store_lock
from rungs.tracking_uri import default_tracking_uri
from sweeps.spec import SweepSpec

log = logging.getLogger(__name__)

# Paths in a resolved config that must not depend on the worker's working directory.
_PATH_KEYS = ("data_cache_root", "data_manifest")


@dataclass
class TrialRow:
    key: str
    label: str
    state: str  # pending, running, finished, failed, diverged
    run_id: str | None = None
    attempts: int = 0
    ran_now: bool = False
    bpb_mean: float | None = None
    wall_seconds: float | None = None  # driver-observed, start to end of the Tune trial
    train_wall_seconds: float | None = None
    train_loop_seconds: float | None = None
    train_call_seconds: float | None = None  # the train() call inside the worker, set-up and evals included
    error: str | None = None
    progress: str | None = None  # running trials in `status`: last logged step of the planned steps, and when


@dataclass
class SweepOutcome:
    sweep: str
    experiment: str
    tracking_uri: str
    rows: list[TrialRow] = field(default_factory=list)
    tune_seconds: float | None = None  # wall time of the Tune experiment (Tuner.fit), when one ran

    def counts(self) -> dict:
        now = [r for r in self.rows if r.ran_now]
        return {"trials": len(self.rows),
                "completed": sum(r.state == "finished" for r in now),
                "skipped": sum(not r.ran_now for r in self.rows),
                "failed": sum(r.state not in ("finished", "diverged") for r in now),
                "diverged": sum(r.state == "diverged" for r in now)}


def default_store(tracking_uri: str | None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI (set on cluster pods), else the embedded SQLite store
    (`rungs.tracking_uri.default_tracking_uri`, as every command resolves it). An empty --tracking-uri stays
    empty (check_store refuses it) rather than meaning the default."""
    return default_tracking_uri(tracking_uri)


def launch_config(planned: PlannedTrial, *, tracking_uri: str, experiment: str) -> dict:
    """The keyed config plus where it is tracked and how many threads it may use."""
    config = dict(planned.config)
    for name in _PATH_KEYS:
        if config.get(name):
            config[name] = str(Path(config[name]).resolve())
    config.update(tracking_uri=tracking_uri, experiment_name=experiment, trial_key=planned.key)
    res = planned.trial.resources
    if res.cpus >= 1:
        config["threads"] = int(res.cpus)
    return config


def _payload(planned: PlannedTrial, spec: SweepSpec, *, tracking_uri: str, runs_root: Path) -> dict:
    res = planned.trial.resources
    return {
        "key": planned.key, "sweep": spec.name, "label": planned.label,
        "coordinates": planned.trial.coordinates(),
        "config": launch_config(planned, tracking_uri=tracking_uri, experiment=spec.experiment_name),
        "run_dir": str(runs_root / "sweeps" / spec.name / planned.key),
        "resources": {"cpus": res.cpus, "gpus": res.gpus, "workers": res.workers, "ep": res.ep},
        "storage_path": str(runs_root / "ray_results"),
    }


def ensure_experiment(tracking_uri: str, name: str) -> str:
    """Create the sweep's experiment once, here, so concurrent trials do not race to create it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else client.create_experiment(name)


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


def _new_local_store(store: str) -> bool:
    """A local SQLite store whose file does not exist yet: reading it would create it."""
    db = sqlite_path(store)
    return db is not None and not db.exists()


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


def _tune_trainable(config: dict, payloads: list[dict]) -> None:
    from ray import tune

    from ladder.run.trial import run_trial

    tune.report(run_trial(payloads[config["index"]]))


def _resources_for(payload: dict):
    from ray.tune import PlacementGroupFactory

    res = payload["resources"]
    if res["workers"] > 1:
        # The coordinator only waits on the TorchTrainer, whose workers declare their CPUs/GPUs; it
        # holds a token of memory (Ray refuses an empty bundle) so it takes no CPU from them.
        return PlacementGroupFactory([{"memory": 64 * 2**20}])
    bundle = {"CPU": res["cpus"]}
    if res["gpus"]:
        bundle["GPU"] = res["gpus"]
    return PlacementGroupFactory([bundle])


def run_on_tune(payloads: list[dict], *, name: str, storage_path: Path, max_concurrent: int | None,
                max_failures: int, progress) -> dict[int, dict]:
    """One Tune experiment over the payloads; returns {index: {metrics, error, wall_seconds}}."""
    from ray import tune
    from ray.tune import FailureConfig, RunConfig, TuneConfig

    class _Progress(tune.Callback):
        def __init__(self) -> None:
            self.started: dict[str, float] = {}
            self.ended: dict[int, float] = {}
            self.done = 0

        def on_trial_start(self, iteration, trials, trial, **info):
            self.started.setdefault(trial.trial_id, time.monotonic())
            progress(f"start  {payloads[trial.config['index']]['label']}")

        def on_trial_recover(self, iteration, trials, trial, **info):
            progress(f"retry  {payloads[trial.config['index']]['label']} (attempt failed; Ray Tune restarts it)")

        def _end(self, trial, word: str, detail: str) -> None:
            self.done += 1
            index = trial.config["index"]
            self.ended[index] = time.monotonic() - self.started.get(trial.trial_id, time.monotonic())
            progress(f"[{self.done}/{len(payloads)}] {word:8s} {payloads[index]['label']} {detail} "
                     f"({self.ended[index]:.0f} s)")

        def on_trial_complete(self, iteration, trials, trial, **info):
            r = trial.last_result or {}
            bpb = r.get("bpb_mean")
            self._end(trial, r.get("outcome", "done"), f"bpb {bpb:.4f}" if isinstance(bpb, float) else "")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._end(trial, "failed", "")

    callback = _Progress()
    trainable = tune.with_resources(tune.with_parameters(_tune_trainable, payloads=payloads),
                                    resources=lambda config: _resources_for(payloads[config["index"]]))
    tuner = tune.Tuner(
        trainable,
        param_space={"index": tune.grid_search(list(range(len(payloads))))},
        # Reused actors skip a process start and the torch/rungs imports per trial (the bulk of the
        # fixed overhead); a trial that kills its process gets a fresh actor anyway.
        tune_config=TuneConfig(max_concurrent_trials=max_concurrent, num_samples=1, reuse_actors=True),
        run_config=RunConfig(name=name, storage_path=str(storage_path), verbose=0, callbacks=[callback],
                             failure_config=FailureConfig(max_failures=max_failures)),
    )
    t0 = time.perf_counter()
    grid = tuner.fit()
    out: dict[int, dict] = {-1: {"tune_seconds": time.perf_counter() - t0}}
    for result in grid:
        index = result.config["index"]
        out[index] = {"metrics": dict(result.metrics or {}), "error": repr(result.error) if result.error else None,
                      "wall_seconds": callback.ended.get(index)}
    return out


def run_sweep(spec: SweepSpec, *, where: str = "sweep spec", address: str | None = None,
              tracking_uri: str | None = None, max_concurrent: int | None = None,
              progress=lambda msg: log.info(msg), create_store: bool = True,
              reregister: bool = False, on_todo: Callable[[list[str]], None] | None = None) -> SweepOutcome:
    """Run every trial of `spec` that MLflow does not already hold as finished.

    `create_store`: a SQLite file or store directory that does not exist may be created (the CLI
    allows it for the default store and `--new-store` only). `reregister`: trials whose finished
    result sits in their run directory but whose MLflow run is missing from the store are recorded
    in it as new runs (else that is refused: it means the store was replaced or mistyped). `on_todo`
    is told the labels of the trials this run will train, before any starts (the demo's time left).
    """
    planned = plan_sweep(spec, where=where)  # bad specs fail here, before anything starts
    if any(p.trial.resources.gpu_memory for p in planned):  # a trial that cannot fit its GPU: before launch
        check_fits_memory(cost_sweep(planned, spec_recipe(spec, where=where)), where=where)
    store = default_store(tracking_uri)
    check_store(store, create=create_store)  # a missing, damaged or locked store: before anything is written
    ray_module = sys.modules.get("ray")  # no import of ray here: a finished sweep reruns in seconds
    local_ray = address is None and (ray_module is None or not ray_module.is_initialized())
    if local_ray and _new_local_store(store):
        # A store not yet made holds nothing finished: every trial is to run, so one a private local Ray could
        # never place is bad input, refused before the store is created (else only the trials left to run are
        # checked, below: a finished sweep reruns on any machine).
        check_fits_this_machine(planned, where=where)
    if ray_module is None or not ray_module.is_initialized():
        check_ray_address(address)  # a cluster that does not answer: before the store is read (or created)
    runs_root = runs_root_for(store)
    # A read needs no server: decide what to run first, so a finished sweep reruns in seconds.
    records = find_runs(store, spec.experiment_name)
    rows = {p.key: _row(p, records.get(p.key, [])) for p in planned}
    orphans = _orphaned_results(planned, rows, records, spec, runs_root)
    if orphans and not reregister:
        raise StoreError(
            f"{len(orphans)} trial(s) finished earlier (their result.json is in {runs_root / 'sweeps' / spec.name}) "
            f"but their MLflow runs are not in {store}: the store was replaced, or --tracking-uri names another one "
            f"(e.g. {orphans[0][1].name}: run {orphans[0][2]}). Point --tracking-uri at the store they were "
            f"recorded in; or rerun with --reregister to record their finished results in this store; or move "
            f"{runs_root / 'sweeps' / spec.name} aside to train them again from scratch", field="--tracking-uri")
    if orphans:
        for p, run_dir, old_id in orphans:
            run_id = register_result(store, spec.experiment_name, run_dir, _trial_tags(p, spec, run_dir))
            progress(f"re-registered {p.label}: run {old_id} (not in the store) → {run_id}")
        records = find_runs(store, spec.experiment_name)
        rows = {p.key: _row(p, records.get(p.key, [])) for p in planned}
    todo = [p for p in planned if rows[p.key].state not in ("finished", "diverged")]
    progress(f"sweep {spec.name}: {len(planned)} trials, {len(planned) - len(todo)} already finished, "
             f"{len(todo)} to run; tracking {store}")
    if on_todo is not None:
        on_todo([p.label for p in todo])
    if not todo:
        return SweepOutcome(sweep=spec.name, experiment=spec.experiment_name, tracking_uri=store,
                            rows=[rows[p.key] for p in planned])
    if local_ray:
        check_fits_this_machine(todo, where=where)  # a private local Ray would never place them: before it starts
    started = connect_ray(address)
    try:
        check_fits_cluster(todo, cluster_nodes(), where=where)  # before any trial is launched
        server = TrackingServer(store) if is_local_store(store) else None
        with server if server is not None else nullcontext(store) as uri:
            with store_lock(store):  # two drivers on one fresh store: one creates the experiment
                ensure_experiment(uri, spec.experiment_name)
            payloads = [_payload(p, spec, tracking_uri=uri, runs_root=runs_root) for p in todo]
            results = run_on_tune(payloads, name=f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                                  storage_path=runs_root / "ray_results",
                                  max_concurrent=max_concurrent or spec.max_concurrent,
                                  max_failures=spec.max_failures, progress=progress)
            records = find_runs(uri, spec.experiment_name)
    finally:
        if started:
            import ray

            ray.shutdown()
    for i, p in enumerate(todo):
        row = _row(p, records.get(p.key, []))
        row.ran_now = True
        got = results.get(i, {})
        m = got.get("metrics", {})
        row.wall_seconds = got.get("wall_seconds")
        row.train_wall_seconds = m.get("train_wall_seconds")
        row.train_loop_seconds = m.get("train_loop_seconds")
        row.train_call_seconds = m.get("train_call_seconds")
        # The job's own one line (the `error` tag of its failed run) says more than Tune's wrapped repr.
        row.error = row.error or one_line(got.get("error"))
        if got.get("error") and row.state not in ("finished", "diverged"):
            row.state = "failed"
        rows[p.key] = row
    return SweepOutcome(sweep=spec.name, experiment=spec.experiment_name, tracking_uri=store,
                        rows=[rows[p.key] for p in planned], tune_seconds=results[-1]["tune_seconds"])


def _orphaned_results(planned: list[PlannedTrial], rows: dict[str, TrialRow], records: dict, spec: SweepSpec,
                      runs_root: Path) -> list[tuple[PlannedTrial, Path, str]]:
    """Trials not finished in the store whose run directory holds a finished result naming a run the
    store does not have. Left alone, each would fail forever: the job returns its stored result and
    the wrapper tags a run that does not exist."""
    out = []
    for p in planned:
        if rows[p.key].state in ("finished", "diverged"):
            continue
        run_dir = runs_root / "sweeps" / spec.name / p.key
        run_id = stored_result_run_id(run_dir)
        if run_id and run_id not in {r.run_id for r in records.get(p.key, [])}:
            out.append((p, run_dir, run_id))
    return out


def _trial_tags(planned: PlannedTrial, spec: SweepSpec, run_dir: Path) -> dict:
    """The tags the trial wrapper (ladder.run.trial) puts on a finished trial's run."""
    import json
    import math

    result = json.loads((run_dir / "result.json").read_text())
    attempts = run_dir / "attempts"
    attempt = attempts.read_text().strip() if attempts.is_file() else "1"
    bpb = [v for v in (result.get("bpb") or {}).values() if isinstance(v, (int, float)) and math.isfinite(v)]
    tags = {TAG_KEY: planned.key, TAG_SWEEP: spec.name, TAG_LABEL: planned.label, TAG_ATTEMPT: attempt or "1",
            TAG_OUTCOME: "diverged" if result.get("diverged") else "finished",
            **{f"coord.{k}": v for k, v in planned.trial.coordinates().items() if v is not None}}
    if bpb:
        tags["bpb_mean"] = f"{sum(bpb) / len(bpb):.6f}"
    return tags


def _row(planned: PlannedTrial, records) -> TrialRow:
    st = trial_state(records)
    bpb = None
    if st.run_id and st.state in ("finished", "diverged"):
        bpb = next((r.tags.get("bpb_mean") for r in records if r.run_id == st.run_id), None)
    error = None
    if st.state == "failed":  # the trial wrapper tags a failed attempt's run with its error (ladder.run.trial)
        error = one_line(next((r.tags.get(TAG_ERROR) for r in reversed(records) if r.tags.get(TAG_ERROR)), None))
    return TrialRow(key=planned.key, label=planned.label, state=st.state, run_id=st.run_id, attempts=st.attempts,
                    bpb_mean=float(bpb) if bpb else None, error=error)


ERROR_CHARS = 300


def one_line(text: str | None) -> str | None:
    """The first non-empty line of an error, at most ERROR_CHARS long: what a status table can show."""
    if not text:
        return None
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= ERROR_CHARS else line[:ERROR_CHARS - 1] + "…"


def sweep_status(spec: SweepSpec, *, where: str = "sweep spec", tracking_uri: str | None = None) -> SweepOutcome:
    """Each trial's state from MLflow alone (no Ray, no server: a read)."""
    planned = plan_sweep(spec, where=where)
    store = default_store(tracking_uri)
    check_store(store, create=False)  # a missing store is refused: "pending" would claim what nobody knows
    records = find_runs(store, spec.experiment_name)
    rows = [_row(p, records.get(p.key, [])) for p in planned]
    for p, row in zip(planned, rows):
        if row.state == "running" and row.run_id:
            row.progress = _progress(store, row.run_id, _run_steps(p.config))
    return SweepOutcome(sweep=spec.name, experiment=spec.experiment_name, tracking_uri=store, rows=rows)


def _run_steps(config: dict) -> int | None:
    """The steps a trial's job runs: its planned steps, cut short by max_steps (a cap above them cuts nothing)."""
    steps, cap = config.get("steps"), config.get("max_steps")
    return min(steps, cap) if steps and cap else (steps or cap)


# A RUNNING run whose job logged nothing for this long was probably killed (a rerun resumes it).
STALE_AFTER_SECONDS = 900.0


def _progress(store: str, run_id: str, total_steps: int | None) -> str:
    """"step 400/1192, 35 s ago" from the run's loss history; a run silent for STALE_AFTER_SECONDS is
    marked as such, since a killed job leaves its MLflow run RUNNING."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient(store).get_metric_history(run_id, "loss")
    if not history:
        return "starting"
    last = max(history, key=lambda m: m.step)
    ago = max(0.0, time.time() - last.timestamp / 1000.0)
    text = f"step {last.step}/{total_steps or '?'}, {ago:.0f} s ago"
    return text + " (stale: killed? a rerun resumes it)" if ago > STALE_AFTER_SECONDS else text
