"""One Ray Tune experiment over a sweep's trial payloads: one Tune trial per payload, each declaring the
CPUs and GPUs it holds, at most `max_concurrent` at once, a trial that raises retried `max_failures` times;
a progress line as each trial starts, is retried and ends. The trial itself is `ladder.run.trial`'s.
"""

from __future__ import annotations

import time
from pathlib import Path


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
