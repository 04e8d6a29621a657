"""The rung generator against the report's numbers and an independent hand count."""

from __future__ import annotations

import math

import pytest

from ladder.plan.compute import plan_compute
from ladder.plan.generator import plan_ladder, plan_rung
from ladder.plan.recipe import load_recipe

MAI = load_recipe("mai-base-2")


@pytest.fixture(scope="module")
def l102():
    return plan_rung(MAI, 102)


def test_l102_architecture_is_the_reports_final_model(l102):
    a = l102.arch
    assert (a.n_layers, a.d_model, a.n_heads) == (102, 8704, 96)
    assert (a.n_kv_heads_global, a.n_kv_heads_local, a.global_every) == (2, 16, 6)
    assert (a.n_experts, a.top_k, a.n_shared_experts) == (512, 7, 1)
    assert (a.latent_dim, a.expert_hidden) == (4096, 4352)
    assert not a.tied_embeddings
    assert a.n_global_layers == 17  # layers 6, 12, ..., 102 (1-based)


def test_l102_parameter_counts_match_report_within_few_percent(l102):
    assert l102.params_total == pytest.approx(2.8e12, rel=0.03)
    assert l102.params_active == pytest.approx(80e9, rel=0.04)


def hand_count_l102(vocab: int) -> tuple[int, int]:
    """Independent count from the report's description (not via ladder.plan.counting)."""
    d, q, hd = 8704, 96 * 128, 128
    attn_local = d * q + 2 * d * 16 * hd + q * d
    attn_global = d * q + 2 * d * 2 * hd + q * d
    attn = 85 * attn_local + 17 * attn_global
    expert = 3 * 4096 * 4352
    per_layer_dense = 512 * d + 3 * d * 4352 + 2 * d * 4096 + 2 * d  # router, shared, latent, norms
    total = attn + 102 * (per_layer_dense + 512 * expert) + 2 * vocab * d + d
    active_nonemb = attn + 102 * (per_layer_dense + 7 * expert) + d
    return total, active_nonemb


def test_l102_counts_equal_independent_hand_count(l102):
    total, active = hand_count_l102(MAI.vocab_size)
    assert l102.params_total == total
    assert l102.params_active == active


def test_l102_tokens_and_tpp(l102):
    assert l102.tpp == MAI.tpp
    assert l102.tokens == pytest.approx(50e12, rel=0.01)
    assert l102.tokens <= MAI.full_scale_tokens
    assert l102.tokens % l102.batch_tokens == 0
    assert l102.steps * l102.batch_tokens == l102.tokens


def test_l102_flops_per_token_hand_count(l102):
    a = l102.arch
    d, q = 8704, 96 * 128
    proj = 85 * 2 * (2 * d * q + 2 * d * 2048) + 17 * 2 * (2 * d * q + 2 * d * 256)
    s, w = a.seq_len, a.window_tokens
    ctx_global = (s + 1) / 2
    ctx_local = (w * (w + 1) / 2 + (s - w) * w) / s
    scores = 4 * 96 * 128 * (17 * ctx_global + 85 * ctx_local)
    moe = 102 * 2 * (512 * d + 3 * d * 4352 + 2 * d * 4096 + 7 * 3 * 4096 * 4352)
    head = 2 * d * MAI.vocab_size
    forward = proj + scores + moe + head
    assert l102.flops_per_token_forward == pytest.approx(forward, rel=1e-12)
    assert l102.flops_per_token == pytest.approx(3 * forward, rel=1e-12)
    assert l102.train_flops == pytest.approx(3 * forward * l102.tokens, rel=1e-12)
    # Exact count sits a few percent above the 6·N_active shortcut (attention scores, LM head).
    assert 1.0 < l102.flops_per_token / (6 * l102.params_active) < 1.1


def test_compute_planner_reproduces_reported_38_days(l102):
    plan = plan_compute(l102.train_flops, gpus=16_000, peak_flops_per_gpu=2.5e15, mfu=0.21, goodput=0.89)
    assert plan.wall_clock_days == pytest.approx(38, rel=0.06)
    six_nd_days = 6 * l102.params_active * l102.tokens / plan.effective_flops_per_second / 86_400
    assert six_nd_days == pytest.approx(38, rel=0.02)
    assert plan.gpu_hours == pytest.approx(16_000 * plan.wall_clock_days * 24)


@pytest.mark.parametrize(
    "L,d_model,heads", [(18, 1536, 16), (24, 2048, 32), (30, 2560, 32), (36, 3072, 32), (42, 3584, 48), (102, 8704, 96)]
)
def test_width_and_head_rules(L, d_model, heads):
    arch = plan_rung(MAI, L).arch
    assert arch.d_model == d_model == 256 * L // 3
    assert arch.n_heads == heads
    assert arch.n_heads % 16 == 0


def test_tpp_constant_and_counts_monotone_across_rungs():
    rungs = plan_ladder(MAI, [18, 24, 30, 36, 42, 102])
    assert {r.tpp for r in rungs} == {MAI.tpp}
    for r in rungs:  # tokens = TPP × active, up to rounding to whole batches
        assert r.tokens / r.params_active == pytest.approx(MAI.tpp, rel=r.batch_tokens / r.tokens + 1e-9)
    for key in ("params_total", "params_active", "flops_per_token", "train_flops", "tokens", "steps"):
        values = [getattr(r, key) for r in rungs]
        assert values == sorted(values) and len(set(values)) == len(values), key


def test_default_lr_wd_follow_the_reports_laws():
    r = plan_rung(MAI, 24)
    assert r.lr * r.weight_decay == pytest.approx(17.04 / r.steps, rel=1e-12)
    expected_log_lr = -1.51 + 0.175 * math.log(r.tpp) - 0.573 * math.log(r.steps)
    assert math.log(r.lr) == pytest.approx(expected_log_lr, rel=1e-12)


def test_tpp_override_scales_tokens():
    base, doubled = plan_rung(MAI, 18), plan_rung(MAI, 18, tpp=2 * MAI.tpp)
    assert doubled.tpp == 2 * MAI.tpp
    assert doubled.tokens / base.tokens == pytest.approx(2.0, rel=0.02)


def test_cpu_demo_ladder_is_small_and_uses_the_same_rules():
    demo = load_recipe("cpu-demo")
    rungs = plan_ladder(demo)
    assert 4 <= len(rungs) <= 5
    assert all(r.arch.d_model == 16 * r.L for r in rungs)
    assert rungs[-1].train_flops < 5e13  # minutes on 2 CPU cores
    assert all(r.arch.n_experts == 8 and r.arch.top_k == 2 for r in rungs)


def test_kv_heads_always_divide_query_heads():
    from ladder.plan.generator import kv_heads_for

    assert kv_heads_for(96, 16) == 16 and kv_heads_for(96, 2) == 2  # MAI unchanged
    assert kv_heads_for(3, 2) == 1 and kv_heads_for(6, 4) == 3 and kv_heads_for(2, 8) == 2
    demo = load_recipe("cpu-demo")
    for r in plan_ladder(demo, [2, 3, 4, 5, 6, 7, 8]):
        assert r.arch.n_heads == r.L  # cpu-demo: heads = L, query width = d_model
        assert r.arch.n_heads % r.arch.n_kv_heads_global == 0 and r.arch.n_heads % r.arch.n_kv_heads_local == 0


def test_the_plan_the_config_and_the_model_share_one_torch_free_architecture():
    import dataclasses
    import subprocess
    import sys

    from ladder.plan.counting import Architecture as PlanArchitecture
    from ladder.plan.generator import plan_rung
    from rungs.architecture import Architecture, ModelConfig
    from rungs.config import parse_config

    assert PlanArchitecture is Architecture and issubclass(ModelConfig, Architecture)
    spec = plan_rung(load_recipe("cpu-demo"), 3)
    built = parse_config({**spec.to_dict(), "tracking_uri": None}).architecture()
    assert isinstance(built, ModelConfig)
    assert {f.name: getattr(built, f.name) for f in dataclasses.fields(Architecture)} == dataclasses.asdict(spec.arch)
    code = "import sys, rungs.architecture, rungs.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
