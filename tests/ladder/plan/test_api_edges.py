"""Planning from a notebook: a rung's numbers recomputed by hand, and bad values refused as one
LadderInputError naming the field instead of a TypeError deep in the arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ladder.errors import LadderInputError
from ladder.plan import load_recipe, plan_compute, plan_ladder, plan_rung
from ladder.plan.memory import choose_layout
from ladder.plan.recipe import Source
from ladder.plan.sources import plan_sources

DEMO = load_recipe("cpu-demo")


def test_cpu_demo_l3_counts_match_a_hand_count():
    """d=48, 3 query heads of 16, 1 KV head, latent 24, expert and shared hidden 48, 8 experts top-2,
    vocab 512 untied; layers 0-1 window 32 of seq 128, layer 2 global."""
    s = plan_rung(DEMO, 3)
    layer = 48 + 48 * 48 + 2 * 16 * 48 + 48 * 48 + 48 + 8 * 48 + 3 * 8 * 48 * 24 + 3 * 48 * 48 + 2 * 24 * 48
    routed = 3 * 8 * 48 * 24
    embedding = 2 * 512 * 48
    assert s.params_total == 3 * layer + embedding + 48
    assert s.params_active == 3 * (layer - routed + routed * 2 // 8) + 48
    local_keys, global_keys = (32 * 33 / 2 + 96 * 32) / 128, 129 / 2
    forward = (3 * 2 * 48 * (2 * 48 + 2 * 16) + 4 * 3 * 16 * (2 * local_keys + global_keys) + 3 * 2 * 48 * 8
               + 3 * 2 * 3 * 48 * 48 + 3 * 2 * 2 * 48 * 24 + 3 * 2 * 3 * 24 * 48 * 2 + 2 * 48 * 512)
    assert s.flops_per_token_forward == forward and s.flops_per_token == 3 * forward
    assert s.tokens == s.steps * s.batch_tokens >= 5 * s.params_active
    assert s.train_flops == s.flops_per_token * s.tokens


def test_source_scaling_keeps_full_scale_epochs_for_a_small_mixture():
    mixture = [Source(name="a", share=0.5, unique_tokens=100.0), Source(name="b", share=0.5, unique_tokens=50.0)]
    plan = plan_sources(mixture, 100.0, 1000.0)
    assert {n: (s.tokens, s.unique_tokens, s.epochs) for n, s in plan.items()} == \
        {"a": (50.0, 10.0, 5.0), "b": (50.0, 5.0, 10.0)}


@pytest.mark.parametrize("tpp", ["20", True, False, [20]])
def test_plan_rung_refuses_a_tpp_that_is_not_a_number(tpp):
    with pytest.raises(LadderInputError) as err:
        plan_rung(DEMO, 3, tpp)
    assert err.value.field == "--tpp" and repr(tpp) in err.value.detail


def test_a_recipe_card_with_a_tpp_as_text_is_a_ladder_input_error():
    from ladder.analysis.recipe_card import build_card

    with pytest.raises(LadderInputError) as err:
        build_card("cpu-demo", 3, {}, tpp="20")
    assert err.value.field == "--tpp"


@pytest.mark.parametrize("tpp", [np.int64(20), np.float32(20.0), 20])
def test_a_numpy_or_int_tpp_plans_as_the_float_and_serialises(tpp):
    spec = plan_rung(DEMO, 3, tpp)
    assert type(spec.tpp) is float and spec.to_dict() == plan_rung(DEMO, 3, 20.0).to_dict()
    json.dumps(spec.to_dict())


def test_plan_ladder_of_no_rungs_is_empty_not_the_recipes_ladder():
    assert plan_ladder(DEMO, []) == []
    assert [r.L for r in plan_ladder(DEMO)] == DEMO.ladder_rungs


@pytest.mark.parametrize("change, field", [
    ({"mfu": True}, "--mfu"), ({"goodput": True}, "--goodput"), ({"mfu": "0.4"}, "--mfu"),
    ({"gpus": True}, "--gpus"), ({"gpus": 2.5}, "--gpus"),
    ({"train_flops": float("nan")}, "gpu_pool"), ({"train_flops": "1e20"}, "gpu_pool"),
    ({"peak_flops_per_gpu": float("inf")}, "gpu_pool"),
])
def test_plan_compute_refuses_what_is_not_a_valid_number(change, field):
    args = {"train_flops": 1e20, "gpus": 8, "peak_flops_per_gpu": 1e15, "mfu": 0.4, "goodput": 0.9, **change}
    with pytest.raises(LadderInputError) as err:
        plan_compute(args.pop("train_flops"), **args)
    assert err.value.field == field


def test_choose_layout_reads_a_memory_size_as_text_and_one_checkpointing_policy():
    s = plan_rung(DEMO, 3)
    by_text = choose_layout(s.arch, batch_sequences=s.batch_sequences, gpu_memory_bytes="80GB")
    assert by_text == choose_layout(s.arch, batch_sequences=s.batch_sequences, gpu_memory_bytes=80 * 10**9)
    full = choose_layout(s.arch, batch_sequences=s.batch_sequences, gpu_memory_bytes=80 * 10**9, checkpointing="full")
    assert full.layout.checkpointing == "full"
    for bad, field in (({"gpu_memory_bytes": float("nan")}, "gpu_memory_bytes"),
                       ({"gpu_memory_bytes": 80 * 10**9, "headroom": "0.1"}, "headroom")):
        with pytest.raises(LadderInputError) as err:
            choose_layout(s.arch, batch_sequences=s.batch_sequences, **bad)
        assert err.value.field == field


def test_a_step_cap_at_or_above_the_planned_steps_is_the_uncapped_config():
    """A cap that stops nothing keys as the plain rung (a finished full run is found by a sweep that caps
    above it); a cap below the plan is kept and keys apart."""
    from ladder.plan.resolve import resolve_train_config
    from sweeps.keys import trial_key

    plain = resolve_train_config("cpu-demo", 3)
    steps = plain["steps"]
    assert "max_steps" not in plain or plain["max_steps"] is None
    for cap in (steps, steps + 1, 10 * steps):
        assert resolve_train_config("cpu-demo", 3, max_steps=cap) == plain
        assert resolve_train_config("cpu-demo", 3, {"max_steps": cap}) == plain
    capped = resolve_train_config("cpu-demo", 3, max_steps=steps - 1)
    assert capped["max_steps"] == steps - 1 and trial_key(capped) != trial_key(plain)


@pytest.mark.parametrize("override", [{"batch_sequences": 16}, {"steps": 1000}, {"seq_len": 64}, {"n_layers": 8},
                                      {"d_model": 128}])
def test_an_override_that_changes_the_tokens_trained_records_the_tpp_trained(override):
    """The config kept the planned TPP (5) while the job trained 2.5-8.6 tokens per active parameter, and the
    fits slice and regress on `tpp`; the rest of the plan (steps, LR, WD, sources) is kept as it was."""
    from ladder.plan.resolve import resolve_train_config

    planned = resolve_train_config("cpu-demo", 4)
    config = resolve_train_config("cpu-demo", 4, override)
    trained = config["steps"] * config["batch_sequences"] * config["seq_len"] / config["params_active"]
    assert config["tpp"] == pytest.approx(trained, rel=1e-12) and abs(config["tpp"] - planned["tpp"]) > 0.5
    for key in ("lr", "weight_decay", "sources"):
        assert config[key] == planned[key]


def test_a_batch_and_steps_that_train_the_planned_tokens_keep_the_nominal_tpp():
    """Four times the batch and a quarter of the steps (sweeps/data_curation_calibration_batch4.yaml): the target
    rounded up to whole batches of the new size, as the plan rounds, so TPP 30 as planned (and the trial keys)."""
    from ladder.plan.resolve import resolve_train_config

    for L, batch, steps in ((4, 80, 238), (3, 56, 191), (2, 40, 130)):
        assert resolve_train_config("cpu-demo-d2", L, {"batch_sequences": batch, "steps": steps})["tpp"] == 30.0
    # one step more is another TPP
    config = resolve_train_config("cpu-demo-d2", 3, {"batch_sequences": 56, "steps": 192})
    assert config["tpp"] == pytest.approx(192 * 56 * 128 / config["params_active"], rel=1e-12)


@pytest.mark.parametrize("path,value", [(("tpp",), True), (("seq_len",), True), (("moe", "top_k"), True),
                                        (("batch", "exponent"), False), (("full_scale_tokens",), True)])
def test_true_or_false_where_a_recipe_takes_a_number_is_refused(path, value):
    """pydantic read `tpp: true` as TPP 1 and `batch.exponent: false` as 0; `--set tpp=true` was refused."""
    import yaml

    from ladder.plan.recipe import RECIPES_DIR, parse_recipe

    data = yaml.safe_load((RECIPES_DIR / "cpu-demo.yaml").read_text())
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    with pytest.raises(LadderInputError, match=f"{'.'.join(path)}: takes .*, not true/false"):
        parse_recipe(data, "recipe.yaml")


def test_a_full_scale_rung_rounded_past_its_budget_by_its_batch_plans():
    """TPP 606.58815 targets 49,999,997,569,163 tokens; rounded up to whole batches it passed 5e13 and was refused
    with "5e+13 tokens exceeds ... 5e+13"."""
    recipe = load_recipe("mai-base-2")
    rung = plan_rung(recipe, 102, 606.58815)
    assert rung.tokens > recipe.full_scale_tokens and all(s.unique_fraction == 1.0 for s in rung.sources.values())
    with pytest.raises(LadderInputError, match="57,699,781,312,512 tokens exceeds the full-scale budget 50,000,000,000,000"):
        plan_rung(recipe, 102, 700)


def test_a_width_that_rounds_to_nothing_is_refused_and_half_widths_round_up():
    rule = {"numerator": 1, "denominator": 3, "require_integer": False}
    with pytest.raises(LadderInputError, match="rounds to 0: no model"):
        DEMO.model_copy(update={"width": DEMO.width.model_copy(update=rule)}).d_model(1)
    half = DEMO.model_copy(update={"width": DEMO.width.model_copy(update={"numerator": 5, "denominator": 2,
                                                                           "require_integer": False})})
    assert (half.d_model(1), half.d_model(3)) == (3, 8)  # 2.5 and 7.5 up (round() gave 2 and 8)


def test_a_batch_minimum_is_rounded_up_to_the_sequence_multiple():
    from ladder.plan.generator import batch_for

    rule = DEMO.batch.model_copy(update={"sequence_multiple": 64, "min_sequences": 1})
    sequences, _ = batch_for(DEMO.model_copy(update={"batch": rule}), 1e5)
    assert sequences == 64  # 1 before


def test_a_prepared_source_with_no_tokens_is_refused_naming_it(tmp_path):
    from ladder.plan.corpus_data import job_input_key
    from ladder.plan.recipe import RECIPES_DIR, with_data
    from rungs.data.manifest import load_manifest

    manifest = RECIPES_DIR.parent.parent / "rungs" / "data" / "machine_corpus" / "manifest.yaml"
    m = load_manifest(manifest)
    meta = {"manifest": str(manifest), "tokenizer": {"kind": "bpe", "vocab_size": 512, "eos_id": 0},
            "key": job_input_key(m, 512), "eval": [{"domain": e.domain} for e in m.eval_sets],
            "sources": [{"name": s.name, "domain": s.domain, "share": s.share, "tokens": 0 if i == 0 else 100_000}
                        for i, s in enumerate(m.sources)]}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    recipe = load_recipe("cpu-demo-d2-machine").model_copy(update={"mixture": None})
    with pytest.raises(LadderInputError, match=f"source '{m.sources[0].name}' of .* has no tokens left to train on"):
        with_data(recipe, tmp_path, where="recipe")
