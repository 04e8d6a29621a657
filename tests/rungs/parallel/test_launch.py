"""Sharded training jobs end to end: a cpu-demo rung on 2 workers (torchrun-style processes, and a
Ray Train TorchTrainer) learns, logs exactly one MLflow run, and resumes from its sharded checkpoint.

The tests that run jobs in gloo processes of their own (spawn.py) share one 2-rank launch
(tests/rungs/parallel/shared_launch.py): each test's jobs run in turn in the same rank processes, each
in its own run directory, with the assertions the test made in its own launch."""

from __future__ import annotations

import json

import pytest

from rungs.launch import train_sharded
from tests.rungs.parallel.shared_launch import PartTable, SharedLaunch, launch_selected
from tests.rungs.train_helpers import tiny_config

# Each held-out domain's eval windows (at most 102 here: one document of up to 6.5k tokens, 64 tokens a
# window) in one forward instead of up to 13 of the default 8: in a sharded job each forward's FSDP
# all-gathers and the Python around them cost more than its arithmetic (an eval 1.5 -> 0.8 CPU s a rank).
# The BPBs are the same numbers (padding is causal and masked), and what these tests check of the evals
# (at which steps, over which domains, positive, stored with the result) does not depend on how the
# windows are batched.
ONE_FORWARD_A_DOMAIN = {"eval_batch_size": 128}


def _job(rank, world, cfg, run_dir, out):
    first = train_sharded(cfg, run_dir=run_dir, ep=2, stop_after=1)  # preempted after one step
    assert first.steps == 1 and not first.bpb
    # restarted on a different layout (dp=2 instead of ep=2): the sharded checkpoint reshards
    res = train_sharded(cfg, run_dir=run_dir, ep=1)
    assert res.steps == cfg["max_steps"] and res.losses[0] == first.losses[0] and len(res.losses) == 2
    assert set(res.bpb) and all(v > 0 for v in res.bpb.values()) and 0 < res.mfu < 1
    again = train_sharded(cfg, run_dir=run_dir)  # finished: the stored result, no training
    assert again.losses == res.losses and again.bpb == res.bpb
    if rank == 0:
        out.write_text(json.dumps(res.to_json()))


def _layout_part(tmp_path):
    cfg = tiny_config(max_steps=2, precision="fp32", agc=True, micro_batch_sequences=2,  # 2 micro-batches, AGC state resumed
                      expert_bias=True,  # the bias step all-reduces the stacked router counts
                      **ONE_FORWARD_A_DOMAIN)
    return cfg, tmp_path / "run", tmp_path / "out.json"


def test_two_workers_job_stops_and_resumes_on_another_layout(sharded: SharedLaunch):
    name = "test_two_workers_job_stops_and_resumes_on_another_layout"
    sharded.check(name)  # the assertions of `_job`, on both ranks
    tmp_path = sharded.out / name
    stored = json.loads((tmp_path / "run" / "result.json").read_text())
    assert stored == json.loads((tmp_path / "out.json").read_text())
    extra = json.loads((tmp_path / "run" / "dist_checkpoint" / "extra.json").read_text())
    assert extra["state"]["agc"]["history"]  # the clipper's running medians travel with the checkpoint


@pytest.mark.slow
def test_ray_train_two_workers_trains_cpu_demo_rung_and_logs_one_mlflow_run(tmp_path):
    import ray
    from mlflow import MlflowClient

    from rungs.launch import launch_ray

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny_config(max_steps=4, tracking_uri=uri, experiment_name="sharded", **ONE_FORWARD_A_DOMAIN)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        res = launch_ray(cfg, run_dir=tmp_path / "run", num_workers=2)
    finally:
        ray.shutdown()
    assert res.steps == 4 and res.run_id
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("sharded").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == res.run_id
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["workers"] == "2"
    assert len(client.get_metric_history(res.run_id, "loss")) == 4
    assert set(res.bpb) and all(f"final_bpb/{d}" in run.data.metrics for d in res.bpb)


@pytest.mark.slow
def test_torchrun_entry_point_trains_one_rung_expert_parallel(tmp_path):
    """`torchrun -m rungs.launch` (the debugging path for one rung) with 2 workers and ep=2."""
    import subprocess
    import sys

    from tests.rungs.parallel.spawn import free_port

    cfg = tiny_config(max_steps=2, agc=False, **ONE_FORWARD_A_DOMAIN)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "rungs.launch", "--config", str(tmp_path / "config.json"), "--run-dir", str(tmp_path / "run"),
           "--ep", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)  # a far guard, not a speed bound
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])  # rank 0 prints the result
    assert printed["steps"] == 2 and printed == json.loads((tmp_path / "run" / "result.json").read_text())


def _evals_and_spike_job(rank, world, good, bad, run_dir, out):
    res = train_sharded(good, run_dir=run_dir / "good", ep=1)
    assert res.steps == 4 and not res.diverged and set(res.bpb)
    blown = train_sharded(bad, run_dir=run_dir / "bad", ep=1)
    (out / f"rank{rank}.json").write_text(json.dumps({"steps": blown.steps, "diverged": blown.diverged,
                                                       "reason": blown.diverged_reason, "bpb": blown.bpb}))


def _evals_and_spike_part(tmp_path):
    good = tiny_config(max_steps=4, eval_interval=2, precision="fp32", agc=True,  # AGC on: job-wide statistics
                       **ONE_FORWARD_A_DOMAIN)
    # A learning rate 10^4 times too large blows the loss up within a few steps: the spike rule (or
    # the non-finite check) must stop every rank at the same step and mark the run diverged.
    bad = tiny_config(max_steps=8, lr=50.0, adam_lr=50.0, spike_factor=1.5, spike_warmup_steps=1, precision="fp32",
                      agc=False, **ONE_FORWARD_A_DOMAIN)
    return good, bad, tmp_path / "run", tmp_path


def test_sharded_job_evaluates_periodically_and_stops_on_a_loss_spike(sharded: SharedLaunch):
    name = "test_sharded_job_evaluates_periodically_and_stops_on_a_loss_spike"
    sharded.check(name)  # the assertions of `_evals_and_spike_job`, on both ranks
    tmp_path = sharded.out / name
    evals = json.loads((tmp_path / "run" / "good" / "eval.json").read_text())["evals"]
    assert [e["step"] for e in evals] == [2, 4] and all(set(e["bpb"]) == set(evals[-1]["bpb"]) for e in evals)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]  # the same decision at the same step on both ranks
    assert ranks[0]["diverged"] and ranks[0]["steps"] < 8 and not ranks[0]["bpb"]
    assert "spike" in ranks[0]["reason"] or "non-finite" in ranks[0]["reason"]
    stored = json.loads((tmp_path / "run" / "bad" / "result.json").read_text())
    assert stored["diverged"] and stored["diverged_reason"] == ranks[0]["reason"]


# The shared 2-rank launch: each selected test's rank function and its arguments (made from the test's
# own directory), in this order.
SHARDED_PARTS: PartTable = {
    "test_two_workers_job_stops_and_resumes_on_another_layout": (_job, _layout_part),
    "test_sharded_job_evaluates_periodically_and_stops_on_a_loss_spike": (_evals_and_spike_job, _evals_and_spike_part),
}


@pytest.fixture(scope="module")
def sharded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedLaunch:
    return launch_selected(request, tmp_path_factory.mktemp("sharded"), 2, SHARDED_PARTS)
