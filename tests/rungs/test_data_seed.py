"""`data_seed` sets the data order apart from the initial weights (rungs.config.TrainConfig.order_seed).

Runs on one `seed` and different `data_seed`s start from the same weights and read different streams; runs on
different `seed`s and one `data_seed` read the same stream from different weights. Left unset, the order
follows `seed` and the config key is the key it had before the field existed.
"""

from __future__ import annotations

import pytest
import torch

from rungs.config import LEGACY_VALUES, TrainConfigError, parse_config
from rungs.identity import config_key
from rungs.torch_engine import TorchEngine
from tests.rungs.train_helpers import tiny_config


def _built(**overrides) -> TorchEngine:
    engine = TorchEngine(parse_config(tiny_config(**overrides)))
    engine.build()
    return engine


def _first_batches(engine, n: int = 3) -> list[torch.Tensor]:
    return [engine.sampler.next_batch().inputs.clone() for _ in range(n)]


def _weights(engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_unset_data_seed_keeps_the_key_and_the_order_follows_seed():
    plain, unset = parse_config(tiny_config(seed=3)), parse_config(tiny_config(seed=3, data_seed=None))
    assert plain.key() == unset.key() and plain.legacy_key() == unset.legacy_key()
    before = {k: v for k, v in plain.to_dict().items() if k != "data_seed"}  # a config from before the field
    assert plain.key() == config_key(before, LEGACY_VALUES)
    assert plain.order_seed == 3
    chosen = parse_config(tiny_config(seed=3, data_seed=5))
    assert chosen.order_seed == 5 and chosen.key() != plain.key()  # another stream: another trial


def test_data_seed_changes_the_stream_and_not_the_weights():
    base = _built(seed=0)
    reordered = _built(seed=0, data_seed=7)
    assert _same_weights(_weights(base), _weights(reordered))
    assert not all(torch.equal(a, b) for a, b in zip(_first_batches(base), _first_batches(reordered)))


def test_seed_changes_the_weights_and_not_a_fixed_stream():
    base = _built(seed=0)                       # the order follows seed 0
    reinit = _built(seed=1, data_seed=0)        # seed 1's weights, seed 0's order
    assert not _same_weights(_weights(base), _weights(reinit))
    assert all(torch.equal(a, b) for a, b in zip(_first_batches(base), _first_batches(reinit)))


@pytest.mark.parametrize("bad", [-1, 2**32, True, 1.5])
def test_a_bad_data_seed_is_refused(bad):
    config = tiny_config()
    config["data_seed"] = bad
    with pytest.raises(TrainConfigError, match="data_seed"):
        parse_config(config)
