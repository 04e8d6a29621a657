"""The shipped demo corpus prepares from the repository alone and fits every cpu-demo rung."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ladder.plan.generator import plan_rung
from ladder.plan.recipe import load_recipe
from rungs.data.bpb import evaluate_bpb
from rungs.data.corpus import PreparedCorpus
from rungs.data.prepare import ensure_prepared
from rungs.data.sampler import SourceScaledSampler


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> PreparedCorpus:
    recipe = load_recipe("cpu-demo")
    path = ensure_prepared(vocab_size=recipe.vocab_size, cache_root=tmp_path_factory.mktemp("cache"))
    return PreparedCorpus.open(path)


@pytest.mark.slow
def test_demo_corpus_matches_the_recipe_and_fits_every_rung_to_full_scale(demo):
    recipe = load_recipe("cpu-demo")
    assert demo.train_sources == [s.name for s in recipe.mixture]
    assert {"code", "qa", "stem", "math"} <= set(demo.eval_domains)
    assert demo.tokenizer.vocab_size == recipe.vocab_size
    for source in recipe.mixture:
        real = demo.unique_tokens(source.name)
        # The recipe states the corpus's own size (rounded down to 3 significant figures).
        assert real * 0.99 <= source.unique_tokens <= real
    for L in range(3, recipe.full_scale_rung + 1):
        spec = plan_rung(recipe, L).to_dict()
        sampler = SourceScaledSampler(demo, spec["sources"], seq_len=spec["seq_len"],
                                      batch_sequences=spec["batch_sequences"], seed=0)
        assert {s: r["planned_unique_tokens"] for s, r in sampler.report().items()} == \
               {s: round(v["unique_tokens"]) for s, v in spec["sources"].items()}
    # RungSpec.sources (SourceAllocation objects) is accepted as well as its dict form.
    from_objects = SourceScaledSampler(demo, plan_rung(recipe, L).sources, seq_len=spec["seq_len"],
                                       batch_sequences=spec["batch_sequences"], seed=0)
    assert from_objects.next_batch().inputs.equal(sampler.next_batch().inputs)
    report = json.loads((demo.path / "decontamination.json").read_text())
    assert set(report["train_docs_removed"]) == set(demo.train_sources)


@pytest.mark.slow
def test_smallest_rung_streams_its_plan_and_bpb_runs_on_the_demo(demo):
    spec = plan_rung(load_recipe("cpu-demo"), 3).to_dict()
    sampler = SourceScaledSampler(demo, spec["sources"], seq_len=spec["seq_len"],
                                  batch_sequences=spec["batch_sequences"], seed=0)
    for _ in range(spec["steps"]):
        batch = sampler.next_batch()
    assert int(batch.inputs.max()) < spec["vocab_size"]
    for name, r in sampler.report().items():
        assert r["epochs"] == pytest.approx(spec["sources"][name]["epochs"], rel=0.01)
        assert r["unique_tokens"] == pytest.approx(
            min(1.0, spec["sources"][name]["epochs"]) * spec["sources"][name]["unique_tokens"], rel=0.01)

    vocab = demo.tokenizer.vocab_size
    results = evaluate_bpb(lambda x: torch.zeros(*x.shape, vocab), demo, seq_len=spec["seq_len"],
                           max_docs_per_domain=2)
    for r in results.values():  # uniform over the vocabulary: ln V nats per token
        assert r.nats == pytest.approx(r.tokens * math.log(vocab), rel=1e-12)
        assert 1.0 < r.bytes / r.tokens < 4.0


@pytest.mark.slow
def test_every_rung_sees_each_demo_source_s_mix_of_collections(demo):
    # The Metamath statements were 41% of L4's math subset, 23% of L7's and 31% of L9's under the
    # plain hash prefix, and math's held-out BPB stepped with them (docs/backtest_diagnosis/README.md).
    from collections import Counter

    from ladder.errors import LadderInputError
    from rungs.data.sampler import collection_of, select_subset

    recipe = load_recipe("cpu-demo")
    for source in ("math", "qa", "web"):
        shard = demo.train_shard(source)
        whole = Counter()
        for doc_id, n in zip(shard.doc_ids, shard.index[:, 1]):
            whole[collection_of(doc_id)] += int(n)
        assert len(whole) == 2
        swing = 0.0
        for L in range(3, recipe.full_scale_rung + 1):
            for tpp in (4.0, 20.0):
                try:
                    cap = round(plan_rung(recipe, L, tpp=tpp).to_dict()["sources"][source]["unique_tokens"])
                except LadderInputError:  # a rung at this TPP needs more than the full-scale budget
                    continue
                for stratified in (True, False):
                    docs, used = select_subset(shard, source, cap, stratified=stratified)
                    got = Counter()
                    for d, n in zip(docs, used):
                        got[collection_of(shard.doc_ids[d])] += int(n)
                    gap = max(abs(got[c] / cap - whole[c] / shard.n_tokens) for c in whole)
                    if stratified:
                        assert gap < 1e-3, (source, L, tpp)
                    else:
                        swing = max(swing, gap)
        assert swing > 0.03, source  # the plain prefix's drift, which the strata remove
