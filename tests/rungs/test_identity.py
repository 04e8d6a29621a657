"""One identity (rungs.identity.config_key) names a sweep's trial and a job's checkpoints and run, checked
against the formulas the keys were written with; what older code wrote under its own checkpoint key is
still found and resumed."""

import hashlib
import json
import logging

import pytest

from rungs.config import LEGACY_VALUES, TrainConfig, parse_config
from sweeps.keys import trial_key
from tests.rungs.train_helpers import tiny_config

WHERE_IT_RUNS = ("tracking_uri", "experiment_name", "trial_key", "data_cache_root", "checkpoint_interval",
                 "eval_tokens_per_domain")  # (a field added later, in no key: configs then did not have it)


def _kept(config: dict, excluded: tuple[str, ...]) -> dict:
    return {k: v for k, v in config.items()
            if k not in excluded and not (k in LEGACY_VALUES and v == LEGACY_VALUES[k])}


def frozen_trial_key(config: dict) -> str:
    """sweeps.keys.trial_key as it was first written (the shipped trial keys and sweep stores carry it)."""
    payload = _kept(config, WHERE_IT_RUNS + ("log_interval", "threads"))
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def frozen_checkpoint_key(config: dict) -> str:
    """TrainConfig.key() before there was one identity (older run dirs, checkpoints and run names carry it)."""
    payload = _kept(config, WHERE_IT_RUNS + ("peak_flops_per_device",))
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


CHANGES = ({}, {"threads": 3}, {"peak_flops_per_device": 1e12}, {"lr": 0.0123}, {"subset": "prefix"},
           {"tracking_uri": "sqlite:///elsewhere.db"}, {"capacity_factor": 1.5})


@pytest.mark.parametrize("change", CHANGES, ids=[",".join(c) or "default" for c in CHANGES])
def test_a_job_and_a_trial_of_one_config_have_one_key(change):
    cfg = parse_config(tiny_config(**change))
    assert cfg.key() == trial_key(cfg.to_dict()) == frozen_trial_key(cfg.to_dict())
    assert cfg.legacy_key() == frozen_checkpoint_key(cfg.to_dict())
    assert cfg.resume_keys() == (cfg.key(), cfg.legacy_key())


def test_what_a_key_leaves_out_and_keeps():
    config = tiny_config()
    cfg = parse_config(config)
    for where in ({"threads": 2}, {"tracking_uri": "sqlite:///x.db"}, {"data_cache_root": "/elsewhere"},
                  {"checkpoint_interval": 7}, {"experiment_name": "other"}):
        assert parse_config({**config, **where}).key() == cfg.key(), where  # reruns nothing
        assert trial_key({**config, **where}) == trial_key(config), where
    for trained in ({"lr": 0.001}, {"seed": 1}, {"max_steps": 5}, {"agc": False}, {"peak_flops_per_device": 1e12}):
        assert parse_config({**config, **trained}).key() != cfg.key(), trained
    # the legacy key kept the thread count and left the MFU denominator out: read only, never written
    assert parse_config({**config, "threads": 2}).legacy_key() != cfg.legacy_key()
    assert parse_config({**config, "peak_flops_per_device": 1e12}).legacy_key() == cfg.legacy_key()


@pytest.mark.slow
def test_a_run_directory_and_checkpoint_made_the_old_way_are_found_and_resumed(tmp_path, monkeypatch, caplog):
    """Older code named `ladder train`'s run directory and wrote the checkpoint with its own key; the
    same config now finds that directory (not a fresh one) and resumes its checkpoint."""
    from ladder.cli.train import DEFAULT_RUNS_ROOT, default_run_dir
    from rungs.train import train

    monkeypatch.chdir(tmp_path)
    config = tiny_config(max_steps=3)
    cfg = parse_config(config)
    assert cfg.key() != cfg.legacy_key()
    with monkeypatch.context() as old_code:
        old_code.setattr(TrainConfig, "key", lambda self: frozen_checkpoint_key(self.to_dict()))
        old_dir = DEFAULT_RUNS_ROOT / f"{cfg.recipe}-L{cfg.L}-{parse_config(config).key()}"
        assert default_run_dir(config) == old_dir
        first = train(config, run_dir=old_dir, progress=False, stop_after=1)
    assert first.steps == 1
    assert default_run_dir(config) == old_dir  # the old directory, not runs/train/...-<key>
    caplog.set_level(logging.INFO, logger="rungs.loop")
    resumed = train(config, run_dir=default_run_dir(config), progress=False)
    assert resumed.steps == 3 and resumed.losses[0] == first.losses[0]
    assert any("resumed" in r.getMessage() and "at step 1" in r.getMessage() for r in caplog.records)
    # a config the old directory was not made for gets its own directory, named by its key
    other = tiny_config(max_steps=3, lr=0.001)
    assert default_run_dir(other) == DEFAULT_RUNS_ROOT / f"{cfg.recipe}-L{cfg.L}-{parse_config(other).key()}"
