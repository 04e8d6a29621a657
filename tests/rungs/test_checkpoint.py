"""Checkpoints: N steps + restart + N steps gives the same losses and weights as 2N straight;
a checkpoint from another config is refused; RNG state round-trips."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from rungs.checkpoint import CheckpointError, load_checkpoint, rng_state, set_rng_state
from rungs.train import train
from tests.rungs.train_helpers import tiny_config


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
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "restarted" / "checkpoint.pt", weights_only=False)
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
    saved = (run / "checkpoint.pt").read_bytes()
    train(cfg, run_dir=run, progress=False, stop_after=3)
    # A crash after step 2 logged its events but before its checkpoint landed: back to step 2's.
    (run / "checkpoint.pt").write_bytes(saved)
    train(cfg, run_dir=run, progress=False)

    def steps(name):
        return [json.loads(line)["step"] for line in (tmp_path / name / "clip_events.jsonl").read_text().splitlines()]

    assert steps("crashed") == steps("straight") and set(steps("straight")) == {0, 1, 2, 3}
