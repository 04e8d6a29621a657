"""One definition of a config's identity (rungs.identity), two named identities built from it, and
neither changed by being moved there: the checkpoint key is checked against the formula it had."""

import hashlib
import json

from rungs.config import LEGACY_VALUES, parse_config
from rungs.identity import CHECKPOINT, TRIAL, identity_key
from sweeps.keys import NON_IDENTITY_KEYS, trial_key
from tests.rungs.train_helpers import tiny_config


def frozen_checkpoint_key(config: dict) -> str:
    """TrainConfig.key() as it was written before rungs.identity (run dirs and checkpoints carry it)."""
    payload = {k: v for k, v in config.items()
               if k not in ("tracking_uri", "experiment_name", "trial_key", "data_cache_root", "checkpoint_interval",
                            "peak_flops_per_device") and not (k in LEGACY_VALUES and v == LEGACY_VALUES[k])}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def test_the_checkpoint_key_is_the_one_it_always_was():
    for change in ({}, {"threads": 3}, {"peak_flops_per_device": 1e12}, {"lr": 0.0123}, {"subset": "prefix"},
                   {"tracking_uri": "sqlite:///elsewhere.db"}):
        cfg = parse_config(tiny_config(**change))
        assert cfg.key() == frozen_checkpoint_key(cfg.to_dict()) == identity_key(cfg.to_dict(), CHECKPOINT,
                                                                                  LEGACY_VALUES), change


def test_the_two_identities_differ_only_where_they_say():
    assert trial_key is not None and NON_IDENTITY_KEYS == TRIAL.excluded
    assert TRIAL.excluded ^ CHECKPOINT.excluded == {"threads", "log_interval", "peak_flops_per_device"}
    config = tiny_config()
    assert trial_key({**config, "threads": 2}) == trial_key(config)  # a sweep does not rerun for threads
    cfg = parse_config(config)
    assert parse_config({**config, "threads": 2}).key() != cfg.key()  # a checkpoint's key kept them
    assert parse_config({**config, "peak_flops_per_device": 1e12}).key() == cfg.key()
    assert trial_key({**config, "peak_flops_per_device": 1e12}) != trial_key(config)
