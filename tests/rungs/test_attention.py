"""Attention without dense masks (rungs.attention) against the dense-mask SDPA the model used before:
outputs and gradients for global and sliding-window layers, a sequence that is not a multiple of the
window, a window longer than the sequence; FlexAttention's block mask against the executed-FLOP count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ladder.plan.counting import attention_context_mean, attention_executed_context_mean
from rungs.attention import (FLEX_BLOCK_TOKENS, _flex_window_attention, attention_mask, causal_attention,
                             flex_padded_tokens, sliding_window_block_mask)

torch.set_num_threads(1)


def dense_reference(q, k, v, window):
    T = q.shape[-2]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(T, window), enable_gqa=True)


def leaves(B, H, kv, T, hd, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, n, T, hd, generator=g, requires_grad=True) for n in (H, kv, kv)]


@pytest.mark.parametrize(("T", "window"), [
    (48, None),   # global layer: is_causal, no mask
    (48, 16),     # sliding window, T a multiple of it
    (37, 8),      # T not a multiple of the window (padded last chunk)
    (20, 64),     # window longer than the sequence: plain causal
    (20, 20),     # window equal to the sequence
    (9, 1),       # each query sees only itself
])
@pytest.mark.parametrize(("H", "kv"), [(4, 2), (4, 4), (4, 1)])
def test_outputs_and_gradients_equal_the_dense_mask(T, window, H, kv):
    mine = leaves(2, H, kv, T, 8)
    ref = [t.detach().clone().requires_grad_() for t in mine]
    upstream = torch.randn(2, H, T, 8, generator=torch.Generator().manual_seed(1))
    got = causal_attention(*mine, window)
    want = dense_reference(*ref, window)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    (got * upstream).sum().backward()
    (want * upstream).sum().backward()
    for name, a, b in zip("qkv", mine, ref):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-5, msg=lambda m, n=name: f"d{n}: {m}")


def test_windowed_attention_is_exact_in_float64():
    q, k, v = (t.detach().double() for t in leaves(1, 4, 2, 50, 8, seed=3))
    torch.testing.assert_close(causal_attention(q, k, v, 12), dense_reference(q, k, v, 12), rtol=0, atol=1e-12)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_mask_rule_equals_the_dense_mask():
    """The mask FlexAttention runs on CUDA, applied here by its eager (forward-only on CPU) kernel."""
    from torch.nn.attention.flex_attention import flex_attention

    T, window = 300, 100
    q, k, v = (t.detach() for t in leaves(1, 4, 2, T, 16, seed=2))
    block_mask = sliding_window_block_mask(T, window, "cpu")
    assert sliding_window_block_mask(T, window, "cpu") is block_mask  # built once, then cached
    got = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    torch.testing.assert_close(got, dense_reference(q, k, v, window), rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_path_pads_ragged_lengths_and_equals_the_dense_mask():
    """The CUDA path (padding, cached block mask, slicing) run by the eager kernel, forward only:
    FlexAttention has no backward on CPU and compiling it here takes minutes."""
    from torch.nn.attention.flex_attention import flex_attention

    for T, window in ((37, 8), (200, 64)):
        q, k, v = (t.detach() for t in leaves(2, 4, 2, T, 16, seed=T))
        got = _flex_window_attention(q, k, v, window, flex=flex_attention)
        torch.testing.assert_close(got, dense_reference(q, k, v, window), rtol=0, atol=1e-5)


def test_flex_lengths_are_few():
    assert {flex_padded_tokens(T) for T in range(1, 4097)} == {128, 256, 512, 1024, 2048, 3072, 4096}
    assert all(flex_padded_tokens(T) >= T for T in range(1, 9000, 7))
    assert flex_padded_tokens(4096) == 4096 and flex_padded_tokens(2048) == 2048


@pytest.mark.parametrize(("T", "window"), [(4096, 1024), (1000, 300), (512, 100), (256, 128), (128, 32)])
def test_executed_context_equals_the_tiles_flex_attention_computes(T, window):
    block_mask = sliding_window_block_mask(T, window, "cpu")
    tiles = int(block_mask.kv_num_blocks.sum()) + int(block_mask.full_kv_num_blocks.sum())
    executed = attention_executed_context_mean(T, window, "flex", block_tokens=FLEX_BLOCK_TOKENS)
    assert executed * T == pytest.approx(tiles * FLEX_BLOCK_TOKENS**2)
    assert attention_context_mean(T, window) <= executed


def test_causal_tiles_are_those_on_and_below_the_diagonal():
    n = 4096 // 128
    assert attention_executed_context_mean(4096, None, "flex") * 4096 == n * (n + 1) // 2 * 128**2


def test_block_local_cpu_path_executes_two_windows_per_query():
    T, window = 128, 32
    assert attention_executed_context_mean(T, window, "block_local") == 2 * window
    # The dense mask executed every query against every key.
    assert attention_executed_context_mean(T, window, "dense") == T
