"""Checkpoints: N steps + restart + N steps gives the same losses and weights as 2N straight;
a checkpoint from another config is refused; RNG state round-trips; a crafted pickle is refused
unexecuted; a damaged file is refused naming it; a kill mid-write keeps a usable checkpoint; a full
disk says so and leaves nothing half-written; one job per run directory."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from rungs.checkpoint import (CheckpointError, DiskFullError, RunDirBusyError, exclusive_run_dir, load_checkpoint,
                              rng_state, set_rng_state)
from rungs.config import parse_config
from rungs.train import train
from tests.rungs.train_helpers import REPO, tiny_config


def test_rng_state_round_trips():
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    state = rng_state()
    a = (torch.rand(3), random.random(), np.random.rand())
    set_rng_state(state)
    b = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(a[0], b[0]) and a[1:] == b[1:]


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_restart_in_the_middle_equals_a_straight_run(tmp_path, dropout):
    # Dropout draws from the torch RNG, so the 0.1 case also checks that the RNG state is restored.
    cfg = tiny_config(max_steps=8, dropout=dropout, expert_bias=True, router_score="sigmoid")
    straight = train(cfg, run_dir=tmp_path / "straight", progress=False)
    first = train(cfg, run_dir=tmp_path / "restarted", progress=False, stop_after=4)
    assert first.steps == 4 and not first.bpb
    resumed = train(cfg, run_dir=tmp_path / "restarted", progress=False)
    assert resumed.steps == 8
    assert resumed.losses == straight.losses  # bit-for-bit
    assert resumed.bpb == straight.bpb
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)  # tensors and plain data only
    b = torch.load(tmp_path / "restarted" / "checkpoint.pt", weights_only=True)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_a_checkpoint_from_another_config_is_refused(tmp_path):
    train(tiny_config(max_steps=2), run_dir=tmp_path, progress=False, stop_after=1)
    other = tiny_config(max_steps=2, lr=0.001)
    with pytest.raises(CheckpointError, match="different configuration"):
        train(other, run_dir=tmp_path, progress=False)
    # resume=False starts over in the same directory.
    assert train(other, run_dir=tmp_path, progress=False, resume=False).steps == 2


def test_missing_checkpoint_is_none(tmp_path):
    assert load_checkpoint(tmp_path, config_key="x") is None


def test_clip_events_of_steps_run_again_are_not_duplicated(tmp_path):
    # A threshold low enough that every step clips, so every step has events.
    cfg = tiny_config(max_steps=4, agc_mode="median", agc_threshold=1.01)
    train(cfg, run_dir=tmp_path / "straight", progress=False)
    run = tmp_path / "crashed"
    train(cfg, run_dir=run, progress=False, stop_after=2)
    saved = _files(run)
    train(cfg, run_dir=run, progress=False, stop_after=3)
    # A crash after step 2 logged its events but before its checkpoint landed: back to step 2's.
    _put(run, saved)
    train(cfg, run_dir=run, progress=False)

    def steps(name):
        return [json.loads(line)["step"] for line in (tmp_path / name / "clip_events.jsonl").read_text().splitlines()]

    assert steps("crashed") == steps("straight") and set(steps("straight")) == {0, 1, 2, 3}


def _files(run) -> dict[str, bytes]:
    """A checkpoint as it is on disk: the payload and its checksum record."""
    return {name: (run / name).read_bytes() for name in ("checkpoint.pt", "checkpoint.pt.sha256")}


def _put(run, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (run / name).write_bytes(data)


class _CreatesAFile:
    """What a hostile checkpoint carries: unpickling it calls open(path, "w")."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_crafted_pickle_checkpoint_is_refused_and_never_executed(tmp_path):
    cfg = tiny_config(max_steps=3)
    run = tmp_path / "run"
    train(cfg, run_dir=run, progress=False, stop_after=1)
    marker = tmp_path / "pwned"
    payload = {"format_version": 2, "step": 1, "config_key": parse_config(cfg).key(), "extra": _CreatesAFile(marker)}
    torch.save(payload, run / "checkpoint.pt")
    # Whoever can write the checkpoint can write its checksum record too: the record is no defence here.
    digest = hashlib.sha256((run / "checkpoint.pt").read_bytes()).hexdigest()
    (run / "checkpoint.pt.sha256").write_text(json.dumps({"sha256": digest}))
    with pytest.raises(CheckpointError, match="refusing to unpickle") as err:
        train(cfg, run_dir=run, progress=False)
    assert str(run / "checkpoint.pt") in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, damage):
    cfg = tiny_config(max_steps=4)
    train(cfg, run_dir=tmp_path, progress=False, stop_after=2)
    path = tmp_path / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:  # one bit in the middle of the tensors: loads fine unchecked, and used to read as a divergence
        data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch") as err:
        train(cfg, run_dir=tmp_path, progress=False)
    assert str(path) in str(err.value)


def test_a_finished_job_returns_its_result_without_reading_its_checkpoint(tmp_path):
    cfg = tiny_config(max_steps=2)
    done = train(cfg, run_dir=tmp_path, progress=False)
    (tmp_path / "checkpoint.pt").write_bytes(b"damaged after the job finished")
    again = train(cfg, run_dir=tmp_path, progress=False)
    assert again.losses == done.losses and again.steps == 2


def test_a_kill_during_a_checkpoint_write_leaves_a_usable_checkpoint(tmp_path):
    cfg = tiny_config(max_steps=4)
    run = tmp_path / "run"
    key = parse_config(cfg).key()
    train(cfg, run_dir=run, progress=False, stop_after=2)
    at_2 = _files(run)
    train(cfg, run_dir=run, progress=False, stop_after=3)
    at_3 = _files(run)
    tmp = run / "checkpoint.pt.tmp"
    # Killed while writing the payload (before the checksum record, the commit point): step 2's stands.
    _put(run, at_2)
    tmp.write_bytes(at_3["checkpoint.pt"][:1000])
    assert load_checkpoint(run, config_key=key)["step"] == 2
    # Killed after the commit, before the rename: the new payload is complete, and the load finishes the rename.
    _put(run, {"checkpoint.pt": at_2["checkpoint.pt"], "checkpoint.pt.sha256": at_3["checkpoint.pt.sha256"]})
    tmp.write_bytes(at_3["checkpoint.pt"])
    assert load_checkpoint(run, config_key=key)["step"] == 3 and not tmp.exists()
    assert (run / "checkpoint.pt").read_bytes() == at_3["checkpoint.pt"]
    # and the job resumes from it to the same losses as a straight run
    straight = train(cfg, run_dir=tmp_path / "straight", progress=False)
    assert train(cfg, run_dir=run, progress=False).losses == straight.losses


def test_a_full_disk_during_a_checkpoint_write_says_so_and_leaves_no_tmp(tmp_path):
    cfg = tiny_config(max_steps=3, checkpoint_interval=1)
    key = parse_config(cfg).key()
    train(cfg, run_dir=tmp_path, progress=False, stop_after=1)
    # A real ENOSPC: the temporary file the next checkpoint is written to is /dev/full.
    (tmp_path / "checkpoint.pt.tmp").symlink_to("/dev/full")
    with pytest.raises(DiskFullError, match="disk full") as err:
        train(cfg, run_dir=tmp_path, progress=False)
    assert str(tmp_path / "checkpoint.pt") in str(err.value)
    assert not list(tmp_path.glob("*.tmp"))
    assert load_checkpoint(tmp_path, config_key=key)["step"] == 1  # the previous checkpoint is intact
    assert train(cfg, run_dir=tmp_path, progress=False).steps == 3  # space again: it resumes


def test_a_full_disk_while_writing_the_result_says_so_and_leaves_nothing_half_written(tmp_path):
    cfg = tiny_config(max_steps=2)
    (tmp_path / "result.json.tmp").symlink_to("/dev/full")
    with pytest.raises(DiskFullError, match="disk full") as err:
        train(cfg, run_dir=tmp_path, progress=False)
    assert str(tmp_path / "result.json") in str(err.value)
    assert not (tmp_path / "result.json").exists() and not list(tmp_path.glob("*.tmp"))


def test_a_second_job_on_a_run_directory_in_use_is_refused_or_waits(tmp_path, caplog):
    cfg = tiny_config(max_steps=2)
    with exclusive_run_dir(tmp_path):  # a first job holds the directory
        with pytest.raises(RunDirBusyError, match="in use by another job") as err:
            train(cfg, run_dir=tmp_path, progress=False, wait_for_run_dir=False)
        assert f"pid {os.getpid()}" in str(err.value)
        assert not (tmp_path / "checkpoint.pt").exists()
        waiting = threading.Event()

        class _Seen(logging.Handler):
            def emit(self, record):
                if "waiting for it to finish" in record.getMessage():
                    waiting.set()

        handler = _Seen()
        logging.getLogger("rungs.run_files").addHandler(handler)
        try:
            results = []
            second = threading.Thread(target=lambda: results.append(train(cfg, run_dir=tmp_path, progress=False)))
            second.start()
            assert waiting.wait(timeout=3600)
            assert not (tmp_path / "checkpoint.pt").exists()  # it waits; it has not started
        finally:
            logging.getLogger("rungs.run_files").removeHandler(handler)
    second.join(timeout=3600)
    assert results and results[0].steps == 2


def test_a_dead_holder_does_not_keep_the_run_directory(tmp_path):
    script = (f"import os, signal; from rungs.checkpoint import exclusive_run_dir\n"
              f"with exclusive_run_dir({str(tmp_path)!r}):\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=3600)
    assert proc.returncode == -signal.SIGKILL
    assert "pid" in (tmp_path / "job.lock").read_text()  # it did hold the lock
    assert train(tiny_config(max_steps=2), run_dir=tmp_path, progress=False, wait_for_run_dir=False).steps == 2


def test_sigterm_closes_the_mlflow_run_failed_and_exits_143(tmp_path):
    """SIGTERM is how Kubernetes, Slurm and Ray stop a job: Python's default ended the process with no except
    clause run, and the MLflow run stayed RUNNING with no end time."""
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = tmp_path / "run"
    cfg = tiny_config(max_steps=400, checkpoint_interval=1, tracking_uri=store)
    code = ("import json, sys\nfrom rungs.train import train\n"
            f"train(json.loads(sys.argv[1]), run_dir={str(run)!r}, progress=False)\n")
    job = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)], cwd=REPO)
    try:
        for _ in range(1200):  # training: its first checkpoint written (the run id before it)
            if (run / "checkpoint.pt").exists() or job.poll() is not None:
                break
            threading.Event().wait(0.1)
        assert job.poll() is None, "the job ended before it could be stopped"
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=120) == 143
    finally:
        job.kill()
    record = MlflowClient(store).get_run((run / "mlflow_run_id").read_text().strip())
    assert record.info.status == "FAILED" and record.info.end_time is not None


def test_the_data_report_is_written_before_the_result_that_marks_the_job_finished(tmp_path, monkeypatch):
    """A kill between the two writes left a result (so the rerun returned it and wrote nothing) and no data
    report, for good."""
    import rungs.loop

    written = []
    real = rungs.loop.write_json_atomic
    monkeypatch.setattr(rungs.loop, "write_json_atomic", lambda path, *a, **k: (written.append(path.name),
                                                                                  real(path, *a, **k)))
    train(tiny_config(max_steps=2), run_dir=tmp_path / "run", progress=False)
    assert written.index("data_report.json") < written.index("result.json")
