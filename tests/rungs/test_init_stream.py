"""rungs.init_stream against torch's own ops: any part of a normal_ tensor drawn without the tensor is
bit-identical to the whole tensor's slice, and the generator ends where the whole op leaves it.

These pin down the properties of torch's CPU kernels that the module relies on; a torch version that
changes them fails here, not silently in a sharded model's initialisation. The model-level check
(Transformer's init_weights = one whole-tensor normal_ per parameter, bit for bit) is in
tests/rungs/test_model_init.py.
"""

from __future__ import annotations

import pytest
import torch

from rungs.init_stream import normal_part, skip

SIZES = [1, 7, 15, 16, 17, 31, 32, 33, 100, 1000, 4099]


def _pair(seed: int = 7) -> tuple[torch.Generator, torch.Generator]:
    a, b = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for g in (a, b):  # leave a cached double-precision normal in both (what small tensors' normal_ uses)
        torch.empty(3).normal_(generator=g)
    return a, b


@pytest.mark.parametrize("numel", SIZES)
def test_any_part_equals_the_whole_tensors_slice_and_the_generator_ends_in_the_same_place(numel):
    for start, stop in [(0, numel), (0, numel // 2), (numel // 3, numel), (numel // 4, 3 * numel // 4),
                        (numel - 1, numel), (0, 0), (numel, numel)]:
        for std in (1.0, 0.02):
            whole_gen, part_gen = _pair()
            whole = torch.empty(numel).normal_(0.0, std, generator=whole_gen)
            part = torch.empty(stop - start)
            normal_part(part_gen, numel, start, part, std=std, chunk=48)  # several chunks per part
            assert torch.equal(part, whole[start:stop]), (numel, start, stop, std)
            assert torch.equal(part_gen.get_state(), whole_gen.get_state()), (numel, start, stop)
            # and the next draw agrees (the cached double sample included)
            assert torch.equal(torch.empty(5).normal_(generator=part_gen), torch.empty(5).normal_(generator=whole_gen))


@pytest.mark.parametrize("draws", [0, 1, 15, 16, 17, 100, 5000])
def test_skip_advances_like_uniform_on_that_many_elements(draws):
    a, b = _pair(1)
    torch.empty(draws).uniform_(generator=a)
    skip(b, draws, chunk=64)
    assert torch.equal(a.get_state(), b.get_state())


def test_bad_parts_are_refused():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="not inside"):
        normal_part(gen, 10, 8, torch.empty(4))
    with pytest.raises(ValueError, match="contiguous float32"):
        normal_part(gen, 10, 0, torch.empty(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="negative"):
        skip(gen, -1)
