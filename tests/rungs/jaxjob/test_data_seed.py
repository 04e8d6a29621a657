"""The JAX job reads the data order `data_seed` names, the same stream as the PyTorch job's for it."""

from __future__ import annotations

import pytest
import torch

from rungs.config import parse_config
from rungs.jaxjob.engine import JaxEngine
from rungs.torch_engine import TorchEngine
from tests.rungs.train_helpers import tiny_config


@pytest.mark.slow
def test_jax_reads_the_stream_of_its_data_seed_as_torch_does():
    cfg = parse_config(tiny_config(seed=0, data_seed=7))
    engines = [TorchEngine(cfg), JaxEngine(cfg), TorchEngine(parse_config(tiny_config(seed=0)))]
    for engine in engines:
        engine.build()
    batches = [[engine.sampler.next_batch().inputs for _ in range(2)] for engine in engines]
    assert all(torch.equal(a, b) for a, b in zip(batches[0], batches[1]))
    assert not all(torch.equal(a, b) for a, b in zip(batches[0], batches[2]))  # seed 0's own order differs
