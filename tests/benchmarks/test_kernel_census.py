"""The kernel censuses of benchmarks/block_kernels.py and benchmarks/muon.py count the GEMM FLOPs an
independent count gives: the planner's for a block, `rungs.muon.ns_flops` for Newton-Schulz."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.block_kernels import block_flops, census_case
from ladder.plan.counting import count_flops_per_token
from rungs.model import ModelConfig

SMALL = ModelConfig(n_layers=6, d_model=64, n_heads=4, head_dim=16, n_kv_heads_global=1, n_kv_heads_local=4,
                    global_every=6, window_tokens=16, seq_len=32, n_experts=16, top_k=4, n_shared_experts=1,
                    latent_dim=32, expert_hidden=48, shared_hidden=64, vocab_size=256)


@pytest.mark.parametrize("fuse", [False, True])
def test_a_blocks_census_counts_the_planners_gemm_flops(fuse):
    """Forward and backward of every projection, router, shared and routed expert: 3x the planner's
    forward FLOPs but the attention scores (attention kernels, not GEMMs) and the head."""
    layer = SMALL.global_every - 1
    census = census_case(SMALL, layer, sequences=2, fuse_pointwise=fuse)
    one = dataclasses.replace(SMALL, n_layers=1, global_every=1)
    counts = count_flops_per_token(one)
    gemms = counts.forward - counts.lm_head - counts.attention_scores
    assert census["gemm_flops"] == pytest.approx(3 * gemms * 2 * SMALL.seq_len, rel=1e-12)
    assert block_flops(SMALL, layer, 2) == pytest.approx(3 * (counts.forward - counts.lm_head) * 2 * SMALL.seq_len)
    assert 0 < census["modelled_mfu"] < 1


def test_the_muon_census_counts_newton_schulz_flops():
    from benchmarks.muon import census_l18_muon_step

    census = census_l18_muon_step()
    assert census["census_gemm_flops"] == pytest.approx(census["ns_gemm_flops"], rel=1e-12)
    assert census["modelled_step_over_ns_gemms"] > 1


def test_a_later_micro_batch_moves_fewer_expert_weight_bytes_with_the_stacks_held():
    """A later micro-batch of an accumulating step: plain, the stacks are cast twice and the weight
    gradients widened and added; held, only the in-place adds of the gradients touch stack-sized
    tensors. Same GEMM FLOPs either way."""
    layer = SMALL.global_every - 1
    plain, held = (census_case(SMALL, layer, sequences=2, accumulating=how) for how in ("plain", "held"))
    assert plain["gemm_flops"] == held["gemm_flops"]
    assert held["expert_weight_kernels_between_gemms"] == 3 < plain["expert_weight_kernels_between_gemms"]
    stack = 3 * SMALL.n_experts * SMALL.expert_hidden * SMALL.latent_dim   # values in the three stacks
    # plain: 2 casts (fp32 read, bf16 write), 3 widenings (bf16 read, fp32 write), 3 adds (2 fp32 reads, 1 write)
    assert plain["expert_weight_bytes_between_gemms"] == 2 * 6 * stack + 6 * stack + 12 * stack
    assert held["expert_weight_bytes_between_gemms"] == (2 + 4 + 4) * stack   # add_: bf16 + fp32 in, fp32 out
