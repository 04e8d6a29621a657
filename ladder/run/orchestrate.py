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

Where each part lives: the Ray connection and the checks that trials fit (`ladder.run.ray_cluster`), the
Tune experiment (`ladder.run.tune_experiment`), the trials' rows, the outcome and a sweep's status
(`ladder.run.sweep_status`); their public names are importable from here too.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from ladder.errors import StoreError
from sweeps.cost import check_fits_memory, cost_sweep
from sweeps.plan import PlannedTrial, check_fits_cluster, plan_sweep, runs_root_for, spec_recipe
from ladder.run.ray_cluster import (RAY_CLIENT_PORT, RAY_PROBE_SECONDS, check_fits_this_machine, check_ray_address,
                                   cluster_nodes, connect_ray, ray_endpoint)
from ladder.run.stores import check_store
from ladder.run.sweep_runs import (TAG_ATTEMPT, TAG_KEY, TAG_LABEL, TAG_OUTCOME, TAG_SWEEP, find_runs,
                                   stored_result_run_id)
from ladder.run.sweep_runs import reregister as register_result
from ladder.run.sweep_status import (ERROR_CHARS, STALE_AFTER_SECONDS, SweepOutcome, TrialRow, default_store, one_line,
                                     sweep_status, trial_row)
from ladder.run.tracking_server import TrackingServer, is_local_store
from ladder.run.tune_experiment import run_on_tune
from rungs.tracking import model_experiment_id, sqlite_path, store_lock
from sweeps.spec import SweepSpec

__all__ = ["ERROR_CHARS", "RAY_CLIENT_PORT", "RAY_PROBE_SECONDS", "STALE_AFTER_SECONDS", "SweepOutcome", "TrialRow",
           "check_fits_this_machine", "check_ray_address", "cluster_nodes", "connect_ray", "default_store",
           "ensure_experiment", "launch_config", "one_line", "ray_endpoint", "run_on_tune", "run_sweep",
           "sweep_status", "trial_row"]

log = logging.getLogger(__name__)

# Paths in a resolved config that must not depend on the worker's working directory.
_PATH_KEYS = ("data_cache_root", "data_manifest")


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
    """Create the sweep's experiment once, here, tagged as model training, so concurrent trials neither race
    to create it nor to tag it: two trials tagging one untagged experiment through a tracking server both
    insert the tag, and the second fails on the store's unique key (its attempt then reran)."""
    from mlflow.tracking import MlflowClient

    return model_experiment_id(MlflowClient(tracking_uri), name)


def _new_local_store(store: str) -> bool:
    """A local SQLite store whose file does not exist yet: reading it would create it."""
    db = sqlite_path(store)
    return db is not None and not db.exists()


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
    rows = {p.key: trial_row(p, records.get(p.key, [])) for p in planned}
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
        rows = {p.key: trial_row(p, records.get(p.key, [])) for p in planned}
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
        row = trial_row(p, records.get(p.key, []))
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
