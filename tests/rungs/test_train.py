"""The training job: the smallest cpu-demo rung learns (held-out BPB well below unigram, tracked
in MLflow), gradient accumulation equals the full batch, divergence stops the run, bad configs
raise errors that name the key."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from rungs.config import LEGACY_VALUES, TrainConfigError, parse_config
from rungs.metrics import DivergenceRule
from rungs.train import _train_step, train
from tests.rungs.train_helpers import tiny_config


@pytest.mark.slow
def test_smallest_cpu_demo_rung_learns_and_is_tracked(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny_config(seq_len=128, batch_sequences=8, max_steps=150, eval_interval=75, eval_max_docs_per_domain=2, final_eval_max_docs_per_domain=2,
                      tracking_uri=uri, experiment_name="test-train", warmup_steps=10, weight_decay=0.1)
    res = train(cfg, run_dir=tmp_path / "run", progress=False)
    assert not res.diverged and res.steps == 150
    assert set(res.bpb) == set(res.unigram_bpb) and len(res.bpb) >= 5
    for domain, bpb in res.bpb.items():
        assert bpb < 0.85 * res.unigram_bpb[domain], (domain, bpb, res.unigram_bpb[domain])
    evals = json.loads((tmp_path / "run" / "eval.json").read_text())["evals"]
    first, last = evals[0]["bpb"], evals[-1]["bpb"]
    assert sum(last.values()) < sum(first.values())  # still falling between the two evals
    assert sum(res.losses[-10:]) < 0.8 * sum(res.losses[:10])
    assert res.tokens == 150 * 8 * 128 and res.train_flops == pytest.approx(res.tokens * cfg["flops_per_token"])
    assert 0 < res.mfu < 1 and res.tokens_per_second > 0

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["recipe"] == "cpu-demo" and run.data.tags["rung"] == "3"
    assert run.data.params["lr"] == str(cfg["lr"]) and "sources.code.epochs" in run.data.params
    for domain, bpb in res.bpb.items():
        assert run.data.metrics[f"final_bpb/{domain}"] == pytest.approx(bpb)
    assert len(client.get_metric_history(res.run_id, "loss")) == 150
    artifacts = {a.path for a in client.list_artifacts(res.run_id)}
    assert {"config.json", "eval.json", "result.json", "data_report.json"} <= artifacts
    data = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert set(data) == set(cfg["sources"])
    assert sum(s["emitted_tokens"] for s in data.values()) >= res.tokens
    # The data probe: every clip names a real source document and carries its text.
    events = [json.loads(line) for line in (tmp_path / "run" / "clip_events.jsonl").read_text().splitlines()]
    assert events and all(e["source"] in cfg["sources"] and e["doc_id"] and e["text"] and e["ratio"] > 1
                          and e["point"] in ("residual", "moe_input") for e in events)
    # A finished job called again returns its stored result without training.
    again = train(cfg, run_dir=tmp_path / "run", progress=False)
    assert again.losses == res.losses and again.run_id == res.run_id


def _one_sgd_step(cfg):
    """One real training step with plain SGD at lr 1, so each parameter moves by minus its gradient."""
    from pathlib import Path

    from rungs.data.corpus import PreparedCorpus
    from rungs.data.prepare import ensure_prepared
    from rungs.data.sampler import SourceScaledSampler
    from rungs.model import Transformer

    corpus = PreparedCorpus.open(ensure_prepared(None, vocab_size=cfg.vocab_size, cache_root=Path(cfg.data_cache_root)))
    batch = SourceScaledSampler(corpus, cfg.sources_plan(), seq_len=cfg.seq_len,
                                batch_sequences=cfg.batch_sequences, seed=0).next_batch()
    torch.manual_seed(0)
    model = Transformer(cfg.architecture())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    sgd.set_lr_multiplier = lambda m: None  # the one method the loop needs beyond torch's optimizer API
    stats = _train_step(cfg, model, sgd, batch, None, None)
    return stats, {n: before[n] - p.detach() for n, p in model.named_parameters()}


def test_gradient_accumulation_equals_the_full_batch():
    runs = [_one_sgd_step(parse_config(tiny_config(micro_batch_sequences=micro, lb_loss_coef=0.0, z_loss_coef=1e-3,
                                                   agc=False, grad_clip=None)))
            for micro in (None, 2, 1)]
    (full_stats, full), *accumulated = runs
    for stats, delta in accumulated:
        assert stats["loss"] == pytest.approx(full_stats["loss"], rel=1e-5)
        for name, g in full.items():
            torch.testing.assert_close(delta[name], g, rtol=1e-4, atol=1e-7)


def test_a_blown_up_run_stops_and_is_marked_diverged(tmp_path):
    cfg = tiny_config(max_steps=40, lr=300.0, adam_lr=300.0, grad_clip=None, agc=False, spike_warmup_steps=3,
                      spike_factor=1.5)
    res = train(cfg, run_dir=tmp_path, progress=False)
    assert res.diverged and res.steps < 40
    assert "loss" in res.diverged_reason
    assert json.loads((tmp_path / "result.json").read_text())["diverged"] is True
    assert res.bpb == {}


def test_divergence_rule():
    rule = DivergenceRule(spike_factor=2.0, warmup_steps=3)
    assert [rule.check(s, v) for s, v in enumerate([5.0, 4.0, 3.5, 3.4])] == [None] * 4
    assert rule.check(4, 7.4) is None  # 2 × median(5, 4, 3.5, 3.4) = 7.5
    assert "spike" in rule.check(5, 8.1)  # 2 × median(5, 4, 3.5, 3.4, 7.4) = 8.0
    assert rule.check(5, float("nan")).startswith("non-finite")
    early = DivergenceRule(spike_factor=2.0, warmup_steps=10)
    early.check(0, 1.0)
    assert early.check(1, 100.0) is None  # no spike rule during warmup


@pytest.mark.parametrize("change, key, match", [
    ({"n_experts_typo": 3}, "n_experts_typo", "unknown key"),
    ({"top_k": 9}, None, "top_k=9 exceeds n_experts=8"),
    ({"micro_batch_sequences": 3}, None, "must divide batch_sequences"),
    ({"lr": "fast"}, "lr", "valid number"),
    ({"agc_points": ["attention_out"]}, None, "valid points"),
    ({"schedule": "linear"}, "schedule", "cosine"),
    ({"adam_beta2": 1.0}, "adam_beta2", "less than 1"),
    ({"subset": "random"}, "subset", "stratified"),
    ({"lr": float("inf")}, "lr", "finite"),  # used to pass gt=0 and come back as a "diverged" trial
    ({"lr": float("nan")}, "lr", "finite"),
    ({"weight_decay": float("inf")}, "weight_decay", "finite"),
    ({"spike_factor": float("inf")}, "spike_factor", "finite"),
])
def test_bad_configs_raise_errors_naming_the_problem(change, key, match):
    cfg = tiny_config() | change
    with pytest.raises(TrainConfigError, match=match) as err:
        parse_config(cfg)
    if key:
        assert err.value.key == key


def test_adam_betas_reach_the_optimizer(tmp_path):
    base = train(tiny_config(max_steps=3, deterministic=True), run_dir=tmp_path / "a", progress=False)
    other = train(tiny_config(max_steps=3, deterministic=True, adam_beta2=0.5), run_dir=tmp_path / "b", progress=False)
    torch.use_deterministic_algorithms(False)
    assert base.losses[0] == other.losses[0]  # same first step: Adam's first update does not depend on beta2
    assert base.losses[2] != other.losses[2]


def test_deterministic_mode_repeats_bit_for_bit(tmp_path):
    cfg = tiny_config(max_steps=3, deterministic=True, threads=None, dropout=0.1)
    a = train(cfg, run_dir=tmp_path / "a", progress=False)
    b = train(cfg, run_dir=tmp_path / "b", progress=False)
    assert a.losses == b.losses and a.bpb == b.bpb
    assert torch.get_num_threads() == 1  # deterministic runs do not let the machine's load pick threads
    torch.use_deterministic_algorithms(False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error a GPU-less host gives")
def test_asking_for_cuda_without_a_gpu_is_a_config_error(tmp_path):
    with pytest.raises(TrainConfigError, match="no GPU"):
        train(tiny_config(max_steps=2, device="cuda"), run_dir=tmp_path, progress=False)


def test_device_auto_builds_on_the_gpu_torch_sees_else_the_cpu_and_auto_precision_is_bf16_on_a_gpu_only():
    from rungs.torch_engine import TorchEngine, resolve_device

    cfg = parse_config(tiny_config())
    assert (cfg.device, cfg.precision) == ("auto", "auto")  # the defaults a user gets
    seen = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(cfg) == seen and resolve_device(parse_config(tiny_config(device="cpu"))) == "cpu"
    engine = TorchEngine(cfg)
    engine.build()
    assert engine.device_type == seen and next(engine.model.parameters()).device.type == seen
    assert cfg.bf16_on("cuda") and not cfg.bf16_on("cpu")
    assert parse_config(tiny_config(precision="bf16")).bf16_on("cpu")
    assert not parse_config(tiny_config(precision="fp32")).bf16_on("cuda")


def test_config_key_tracks_what_changes_the_model_only():
    base = parse_config(tiny_config())
    same = parse_config(tiny_config(tracking_uri="sqlite:///elsewhere.db", data_cache_root="/tmp/x",
                                    checkpoint_interval=7, experiment_name="other"))
    assert base.key() == same.key()
    # The thread count does not change the model: setting it reruns nothing and resumes the same checkpoint.
    assert parse_config(tiny_config(threads=2)).key() == base.key()
    for change in ({"lr": 0.001}, {"seed": 1}, {"max_steps": 5}, {"agc": False}):
        assert parse_config(tiny_config(**change)).key() != base.key(), change


def test_small_expert_capacity_runs_more_rounds_and_the_same_math():
    (one, g_one), (many, g_many) = [
        _one_sgd_step(parse_config(tiny_config(capacity_per_expert=capacity, group_size=4, agc=False, grad_clip=None)))
        for capacity in (None, 8)]
    assert one["moe_rounds_max"] == 1 and many["moe_rounds_max"] > 1
    assert one["moe_overload_max"] == many["moe_overload_max"] >= 1.0  # same routing, counted before capacity
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-6)
    for name in g_one:
        torch.testing.assert_close(g_many[name], g_one[name], rtol=1e-5, atol=1e-7)


def test_a_config_at_the_legacy_subset_rule_keeps_the_key_it_had_before_the_field():
    cfg = parse_config(tiny_config())
    # every field added after the key formula: each left out at its legacy value, or left out of every key
    newer = (*LEGACY_VALUES, "eval_tokens_per_domain")
    legacy = {k: v for k, v in cfg.to_dict().items() if k not in newer}
    payload = {k: v for k, v in legacy.items() if k not in ("tracking_uri", "experiment_name", "log_interval",
                                                              "trial_key", "data_cache_root", "checkpoint_interval")}
    before = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    # before: the checkpoint key of that time, which older checkpoints carry (TrainConfig.legacy_key)
    assert parse_config({**tiny_config(), "subset": "prefix"}).legacy_key() == before
    assert cfg.subset == "stratified" and cfg.legacy_key() != before
