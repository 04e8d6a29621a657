"""The sharded job runs the one training loop: it writes what the single-process job writes
(eval.json at every eval, data_report.json), sums its wall clock over restarts, marks a crashed
MLflow run FAILED, and logs the same metric names as the single-process job; a JAX job on several
Ray workers is one job over one mesh, with one run.

The sharded PyTorch tests share one 2-rank launch (tests/rungs/parallel/shared_launch.py): each test's
jobs run in turn in the same rank processes, each in its own run directory and MLflow store, and the
test checks what they wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rungs.launch import train_sharded
from rungs.train import train
from tests.rungs.parallel.shared_launch import PartTable, SharedLaunch, launch_selected
from tests.rungs.train_helpers import tiny_config
from tests.xla_flags import jax_subprocess_env


# Each held-out domain's eval windows (at most 102 here: one document of up to 6.5k tokens, 64 tokens a
# window) in one forward instead of up to 13 of the default 8: in a sharded job each forward's FSDP
# all-gathers and the Python around them cost more than its arithmetic, and these jobs run 7 evals on each
# rank (an eval 1.5 -> 0.8 CPU s). The BPBs are the same numbers (padding is causal and masked), and what
# these tests check of the evals (at which steps, in which files and metrics, equal to the result's) does
# not depend on how the windows are batched. (Not for the JAX job: it pads every batch to eval_batch_size
# rows, so a larger batch computes more padding; measured, 8 -> 32 saved under 1 CPU-s a worker.)
ONE_FORWARD_A_DOMAIN = {"eval_batch_size": 128}


def _runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def _preempted_then_resumed(rank, world, cfg, run_dir, out):
    first = train_sharded(cfg, run_dir=run_dir, stop_after=1)
    saved = json.loads((run_dir / "dist_checkpoint" / "extra.json").read_text())["state"]
    res = train_sharded(cfg, run_dir=run_dir)
    if rank == 0:
        out.write_text(json.dumps({"first": first.to_json(), "saved_wall_seconds": saved["wall_seconds"],
                                   "final": res.to_json()}))


def _restart_part(tmp: Path) -> tuple:
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cfg = tiny_config(max_steps=3, eval_interval=1, tracking_uri=uri, experiment_name="sharded",
                      **ONE_FORWARD_A_DOMAIN)
    return cfg, tmp / "run", tmp / "out.json"


def test_two_workers_write_evals_data_report_and_sum_wall_seconds_over_a_restart(sharded: SharedLaunch):
    name = "test_two_workers_write_evals_data_report_and_sum_wall_seconds_over_a_restart"
    sharded.check(name)
    tmp = sharded.out / name
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    run_dir = tmp / "run"
    out = json.loads((tmp / "out.json").read_text())
    first, final = out["first"], out["final"]
    # the first invocation's clock up to its checkpoint travels in the checkpoint, and the resumed job
    # adds its own to it (what ran after the checkpoint is rerun, as the single-process job counts it)
    assert first["steps"] == 1 and 0 < out["saved_wall_seconds"] <= first["wall_seconds"]
    assert final["wall_seconds"] > out["saved_wall_seconds"]
    evals = json.loads((run_dir / "eval.json").read_text())
    assert [e["step"] for e in evals["evals"]] == [1, 2, 3] and evals["unigram_bpb"]
    assert evals["evals"][-1]["bpb"] == final["bpb"]
    report = json.loads((run_dir / "data_report.json").read_text())
    assert set(report) and final["devices"] == 2 and final["unigram_bpb"] == evals["unigram_bpb"]
    (run,) = _runs(uri, "sharded")
    assert run.info.status == "FINISHED" and run.data.metrics["wall_seconds"] == final["wall_seconds"]


def _crashing_job(rank, world, cfg, run_dir, out):
    from rungs.parallel.engine import ShardedTorchEngine

    real_step = ShardedTorchEngine.train_step

    def train_step(self, step, lr_multiplier):  # fault injection: every rank fails at its second step
        if step == 1:
            raise RuntimeError("injected failure in the second step")
        return real_step(self, step, lr_multiplier)

    ShardedTorchEngine.train_step = train_step
    try:
        with pytest.raises(RuntimeError, match="injected"):
            train_sharded(cfg, run_dir=run_dir)
    finally:  # the rank process may run other tests' jobs after this one
        ShardedTorchEngine.train_step = real_step


def _crash_part(tmp: Path) -> tuple:
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    return tiny_config(max_steps=3, tracking_uri=uri, experiment_name="crash"), tmp / "run", tmp / "out.json"


def test_a_crashed_sharded_job_leaves_its_mlflow_run_failed(sharded: SharedLaunch):
    name = "test_a_crashed_sharded_job_leaves_its_mlflow_run_failed"
    sharded.check(name)
    tmp = sharded.out / name
    (run,) = _runs(f"sqlite:///{tmp / 'mlflow.db'}", "crash")
    assert run.info.status == "FAILED"
    assert not (tmp / "run" / "result.json").exists()


def _sharded_job(rank, world, cfg, run_dir, out):
    train_sharded(cfg, run_dir=run_dir)


def _metric_names_config(uri: str, experiment: str) -> dict:
    return tiny_config(max_steps=2, eval_interval=1, tracking_uri=uri, agc=True, expert_bias=True,
                       experiment_name=experiment, **ONE_FORWARD_A_DOMAIN)


def _metric_names_part(tmp: Path) -> tuple:
    return _metric_names_config(f"sqlite:///{tmp / 'mlflow.db'}", "two"), tmp / "two", None


def test_one_process_and_two_workers_log_the_same_metric_names(sharded: SharedLaunch):
    name = "test_one_process_and_two_workers_log_the_same_metric_names"
    sharded.check(name)  # the two workers' job ran in the shared launch, into this test's store
    tmp = sharded.out / name
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    train(_metric_names_config(uri, "one"), run_dir=tmp / "one", progress=False)
    (one,), (two,) = _runs(uri, "one"), _runs(uri, "two")
    names_one, names_two = set(one.data.metrics), set(two.data.metrics)
    assert {n for n in names_one if n.startswith(("final_", "unigram_bpb/", "total_"))} >= {
        "final_mfu", "final_loss", "final_tokens_per_second", "final_achieved_tflops_per_device"}
    # the sharded run also logs its worker count per step (once a metric; its tag says it too)
    assert names_two - names_one == {"workers"} and names_one <= names_two
    assert two.data.tags["workers"] == "2" and one.data.tags.keys() <= two.data.tags.keys()


def _jax_config(uri: str, experiment: str) -> dict:
    # AGC on and the router bias step: their host reads (the clip readout, the router counts) and the
    # losses, grad norm and eval logits are what a process cannot read whole from a global mesh
    return tiny_config(backend="jax", max_steps=3, eval_interval=2, tracking_uri=uri, experiment_name=experiment,
                       agc=True, expert_bias=True)


def _one_jax_process_on_four_devices(cfg_json: str, run_dir: str) -> None:
    import jax

    assert jax.device_count() == 4
    train(json.loads(cfg_json), run_dir=Path(run_dir), progress=False)


@pytest.mark.slow
def test_two_jax_workers_on_ray_train_as_one_process_on_four_devices_and_write_one_run(tmp_path):
    """A backend=jax job on 2 Ray Train workers x 2 host devices (one jax.distributed job, one mesh
    of 4) trains as one process on 4 devices does, and only rank 0 writes its files and its run."""
    import subprocess
    import sys

    import ray

    from rungs.launch import launch_ray
    from tests.rungs.train_helpers import REPO

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = jax_subprocess_env(4)
    one_cfg = _jax_config(uri, "one")
    proc = subprocess.run([sys.executable, "-c", "from tests.rungs.parallel.test_one_loop import "
                           f"_one_jax_process_on_four_devices as f; f({json.dumps(one_cfg)!r}, "
                           f"{str(tmp_path / 'one')!r})"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    one = json.loads((tmp_path / "one" / "result.json").read_text())

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        two = launch_ray(_jax_config(uri, "two"), run_dir=tmp_path / "two", num_workers=2,
                         cpu_devices_per_worker=2).to_json()
    finally:
        ray.shutdown()
    assert two["devices"] == one["devices"] == 4 and two["steps"] == 3
    # the same program on the same 4-device mesh; only the collectives' transport differs (gloo)
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
    # BPB is read after 3 updates, each Newton-Schulz iteration amplifying the reassociated sums:
    # measured up to 1.09e-5 relative apart (2026-12-03, XLA's default level); the losses above,
    # at 1e-5, are what catch a wrong collective
    assert two["bpb"] == pytest.approx(one["bpb"], rel=1e-4) and set(two["bpb"])
    assert json.loads((tmp_path / "two" / "result.json").read_text()) == two
    evals = json.loads((tmp_path / "two" / "eval.json").read_text())
    assert [e["step"] for e in evals["evals"]] == [2, 3]
    (run_one,), (run_two,) = _runs(uri, "one"), _runs(uri, "two")  # one MLflow run, not one per worker
    assert run_two.info.run_id == two["run_id"] and run_two.info.status == "FINISHED"
    assert (run_two.data.tags["workers"], run_two.data.tags["dp"], run_two.data.tags["ep"]) == ("2", "1", "4")
    assert run_two.data.tags.keys() == run_one.data.tags.keys()
    assert set(run_two.data.metrics) == set(run_one.data.metrics)
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    # the loss at 1e-5, as above; the gradient norm sums squares of small gradients, whose reassociated
    # sums differ more: measured 5.4e-5 relative apart at step 2 (2026-12-03, XLA's default level)
    for name, rel in (("loss", 1e-5), ("grad_norm", 1e-4), ("agc_clip_rate", 1e-4), ("moe_overload_max", 1e-4)):
        history = [m.value for m in sorted(client.get_metric_history(two["run_id"], name), key=lambda m: m.step)]
        expected = [m.value for m in sorted(client.get_metric_history(one["run_id"], name), key=lambda m: m.step)]
        assert len(history) == 3 and history == pytest.approx(expected, rel=rel, abs=1e-7), name


def _resumed_without_drawing(rank, world, cfg, run_dir, out):
    from rungs.model import Transformer

    train_sharded(cfg, run_dir=run_dir, stop_after=2)
    draw = Transformer.init_weights

    def refuse(self, *args, **kwargs):  # a resume must not walk the random stream for replaced weights
        raise AssertionError("a resumed sharded job drew initial weights")

    Transformer.init_weights = refuse
    try:
        resumed = train_sharded(cfg, run_dir=run_dir)
    finally:
        Transformer.init_weights = draw
    whole = train_sharded(cfg, run_dir=run_dir.with_name("whole"), resume=False)
    if rank == 0:
        out.write_text(json.dumps({"resumed": resumed.losses, "whole": whole.losses}))


def _resume_part(tmp: Path) -> tuple:
    return tiny_config(max_steps=4, checkpoint_interval=2, **ONE_FORWARD_A_DOMAIN), tmp / "run", tmp / "out.json"


def test_a_resumed_sharded_job_loads_weights_it_did_not_draw_and_equals_an_uninterrupted_one(sharded: SharedLaunch):
    name = "test_a_resumed_sharded_job_loads_weights_it_did_not_draw_and_equals_an_uninterrupted_one"
    sharded.check(name)
    out = json.loads((sharded.out / name / "out.json").read_text())
    assert out["resumed"] == pytest.approx(out["whole"], rel=1e-6) and len(out["whole"]) == 4


# The shared 2-rank launch: each selected test's rank function and its arguments (made from the test's
# own directory), in this order. The crash goes last: its failure is the job's, by design.
SHARDED_PARTS: PartTable = {
    "test_two_workers_write_evals_data_report_and_sum_wall_seconds_over_a_restart":
        (_preempted_then_resumed, _restart_part),
    "test_one_process_and_two_workers_log_the_same_metric_names": (_sharded_job, _metric_names_part),
    "test_a_resumed_sharded_job_loads_weights_it_did_not_draw_and_equals_an_uninterrupted_one":
        (_resumed_without_drawing, _resume_part),
    "test_a_crashed_sharded_job_leaves_its_mlflow_run_failed": (_crashing_job, _crash_part),
}


@pytest.fixture(scope="module")
def sharded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedLaunch:
    return launch_selected(request, tmp_path_factory.mktemp("sharded"), 2, SHARDED_PARTS)
