"""How the chunked loss cuts a micro-batch (rungs.loss_chunks): by the device's memory on a GPU, by
a fixed count of logits on the CPU, into the fewest equal chunks."""

from __future__ import annotations

import math

import pytest

from rungs.loss_chunks import (BYTES_PER_LOGIT, DEVICE_MEMORY_FRACTION, LOGITS_PER_CHUNK, MAX_CHUNK_BYTES, ROW_ALIGN,
                               chunk_tokens, max_chunk_tokens)

V = 131_072  # mai-base-2's vocabulary


def test_without_a_device_budget_a_chunk_is_the_cpus_fixed_count_of_logits():
    assert max_chunk_tokens(V) == LOGITS_PER_CHUNK // V == 256
    assert chunk_tokens(2_688, 512) == 2_688                    # a cpu-demo micro-batch: one chunk
    assert max_chunk_tokens(V, logits_per_chunk=10 * V) == 10


@pytest.mark.parametrize("memory_bytes,tokens", [(150_109_880_320, 4_096), (85_899_345_920, 2_560),
                                                  (24 * 10**9, 712)])
def test_on_a_gpu_a_chunk_takes_a_share_of_its_memory(memory_bytes, tokens):
    """H200 (the measured device's total), an 80 GiB H100, a 24 GB card: the share, capped, in whole
    multiples of ROW_ALIGN tokens."""
    budget = min(memory_bytes * DEVICE_MEMORY_FRACTION, MAX_CHUNK_BYTES)
    assert tokens == budget // (BYTES_PER_LOGIT * V) // ROW_ALIGN * ROW_ALIGN
    assert max_chunk_tokens(V, memory_bytes) == tokens
    assert tokens * V * BYTES_PER_LOGIT <= memory_bytes * DEVICE_MEMORY_FRACTION


@pytest.mark.parametrize("n_tokens", [1, 255, 256, 257, 4_096, 4_097, 32_768, 32_769, 100_003])
@pytest.mark.parametrize("memory_bytes", [None, 150_109_880_320, 2 * 10**9])
def test_a_micro_batch_is_cut_into_the_fewest_equal_chunks(n_tokens, memory_bytes):
    most = max_chunk_tokens(V, memory_bytes)
    chunk = chunk_tokens(n_tokens, V, memory_bytes)
    n_chunks = math.ceil(n_tokens / chunk)
    assert chunk <= most and n_chunks == math.ceil(n_tokens / most)   # within the budget, no extra chunk
    last = n_tokens - (n_chunks - 1) * chunk
    assert 0 < last <= chunk and chunk - last < n_chunks * ROW_ALIGN   # the others equal, the last close


def test_bad_sizes_are_refused():
    for call, match in ((lambda: chunk_tokens(0, V), "n_tokens"), (lambda: max_chunk_tokens(0), "vocab"),
                        (lambda: max_chunk_tokens(V, 0), "device_memory_bytes"),
                        (lambda: max_chunk_tokens(V, logits_per_chunk=0), "logits_per_chunk")):
        with pytest.raises(ValueError, match=match):
            call()
