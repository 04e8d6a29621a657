"""Source-scaled sampler: plan equality, nesting, caps, traceability, exact resume."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from rungs.data.corpus import PreparedCorpus
from rungs.data.errors import DataInputError, SourceTooSmallError
from rungs.data.sampler import SourceScaledSampler, select_subset

SEQ, ROWS = 32, 4


def plan_for(corpus: PreparedCorpus, fraction: float, epochs=(1.5, 0.6)) -> dict:
    # A plan in the shape of RungSpec.to_dict()["sources"] (extra keys are ignored by the sampler).
    a_cap, b_cap = corpus.unique_tokens("a") * fraction, corpus.unique_tokens("b") * fraction
    a_tokens, b_tokens = a_cap * epochs[0], b_cap * epochs[1]
    total = a_tokens + b_tokens
    return {"a": {"share": a_tokens / total, "tokens": a_tokens, "unique_tokens": a_cap, "epochs": epochs[0],
                  "unique_fraction": fraction},
            "b": {"share": b_tokens / total, "tokens": b_tokens, "unique_tokens": b_cap, "epochs": epochs[1],
                  "unique_fraction": fraction}}


def run_plan(corpus, plan, seed=0):
    """Draw the whole planned budget; return the sampler and every input token's origin."""
    sampler = SourceScaledSampler(corpus, plan, seq_len=SEQ, batch_sequences=ROWS, seed=seed)
    total = sum(p["unique_tokens"] * p["epochs"] for p in plan.values())
    seen = []  # (source, doc_id, offset) of every input token, in order
    for _ in range(int(total // (SEQ * ROWS))):
        batch = sampler.next_batch()
        for r in range(ROWS):
            for t in range(SEQ):
                seen.append(batch.locate(r, t))
    return sampler, seen


@pytest.fixture(scope="module")
def corpus(tiny_byte) -> PreparedCorpus:
    return PreparedCorpus.open(tiny_byte)


@pytest.fixture(scope="module")
def full_run(corpus):
    plan = plan_for(corpus, 0.5)
    return plan, *run_plan(corpus, plan)


def test_realised_unique_tokens_and_epochs_match_the_plan(corpus, full_run):
    plan, sampler, seen = full_run
    per_source = defaultdict(list)
    for origin in seen:
        per_source[origin.source].append((origin.doc_id, origin.token_offset))
    for name, p in plan.items():
        cap = round(p["unique_tokens"])
        emitted = len(per_source[name])
        distinct = len(set(per_source[name]))
        assert emitted / cap == pytest.approx(p["epochs"], rel=0.01)
        assert distinct == pytest.approx(min(cap, p["epochs"] * cap), rel=0.01)
        if p["epochs"] >= 1:
            assert distinct == cap  # the whole capped subset, nothing more
        report = sampler.report()[name]
        assert report["emitted_tokens"] == emitted and report["unique_tokens"] == min(emitted, cap)
        assert report["epochs"] == pytest.approx(p["epochs"], rel=0.01)


def test_every_emitted_token_is_the_corpus_token_at_its_origin(corpus, full_run):
    plan = full_run[0]
    sampler = SourceScaledSampler(corpus, plan, seq_len=SEQ, batch_sequences=ROWS, seed=0)
    for _ in range(5):
        batch = sampler.next_batch()
        assert batch.inputs.shape == (ROWS, SEQ) and batch.targets.shape == (ROWS, SEQ)
        flat_in, flat_tg = batch.inputs.flatten(), batch.targets.flatten()
        assert np.array_equal(flat_in[1:], flat_tg[:-1])  # targets are inputs shifted by one
        for r in range(ROWS):
            for t in range(SEQ):
                for target in (False, True):
                    o = batch.locate(r, t, target=target)
                    shard = corpus.train_shard(o.source)
                    start = shard.index[shard.doc_ids.index(o.doc_id), 0]
                    value = (batch.targets if target else batch.inputs)[r, t]
                    assert shard.tokens[start + o.token_offset] == value


def test_no_document_outside_its_cap_is_ever_seen(corpus, full_run):
    plan, _, seen = full_run
    allowed = {}
    for name, p in plan.items():
        shard = corpus.train_shard(name)
        docs, used = select_subset(shard, name, round(p["unique_tokens"]))
        allowed[name] = {shard.doc_ids[d]: int(n) for d, n in zip(docs, used)}
        assert sum(allowed[name].values()) == round(p["unique_tokens"])
    for o in seen:
        assert o.doc_id in allowed[o.source] and o.token_offset < allowed[o.source][o.doc_id]


def test_subsets_nest_across_rungs(corpus):
    small, large = plan_for(corpus, 0.2, epochs=(1.5, 1.2)), plan_for(corpus, 0.7, epochs=(1.5, 1.2))
    _, seen_small = run_plan(corpus, small, seed=1)
    _, seen_large = run_plan(corpus, large, seed=2)
    docs_small = {(o.source, o.doc_id) for o in seen_small}
    docs_large = {(o.source, o.doc_id) for o in seen_large}
    assert docs_small < docs_large
    for name in ("a", "b"):
        shard = corpus.train_shard(name)
        d_small, _ = select_subset(shard, name, round(small[name]["unique_tokens"]))
        d_large, _ = select_subset(shard, name, round(large[name]["unique_tokens"]))
        assert list(d_small) == list(d_large[:len(d_small)])


def test_each_epoch_is_a_fresh_shuffle(corpus):
    plan = plan_for(corpus, 0.5, epochs=(3.0, 3.0))
    _, seen = run_plan(corpus, plan)
    starts = [o.doc_id for o in seen if o.source == "a" and o.token_offset == 0]  # documents in stream order
    n_docs = len(select_subset(corpus.train_shard("a"), "a", round(plan["a"]["unique_tokens"]))[0])
    first, second = starts[:n_docs], starts[n_docs:2 * n_docs]
    assert sorted(first) == sorted(second) and first != second


def test_restoring_the_state_continues_the_identical_stream(corpus):
    plan = plan_for(corpus, 0.5)
    reference = SourceScaledSampler(corpus, plan, seq_len=SEQ, batch_sequences=ROWS, seed=7)
    for _ in range(13):
        reference.next_batch()
    state = json.loads(json.dumps(reference.state_dict()))  # survives a JSON checkpoint
    assert len(json.dumps(state)) < 2_000
    expected = [reference.next_batch() for _ in range(40)]
    restored = SourceScaledSampler(corpus, plan, seq_len=SEQ, batch_sequences=ROWS, seed=7)
    restored.load_state_dict(state)
    for want in expected:
        got = restored.next_batch()
        assert np.array_equal(got.inputs, want.inputs) and np.array_equal(got.targets, want.targets)
        assert got.locate(ROWS - 1, SEQ - 1) == want.locate(ROWS - 1, SEQ - 1)
    assert restored.report() == reference.report()
    other_seed = SourceScaledSampler(corpus, plan, seq_len=SEQ, batch_sequences=ROWS, seed=8)
    with pytest.raises(DataInputError, match="different plan"):
        other_seed.load_state_dict(state)


def test_a_source_too_small_for_its_cap_says_by_how_much(corpus):
    plan = plan_for(corpus, 1.0)
    available = corpus.unique_tokens("b")
    plan["b"]["unique_tokens"] = available + 1234
    with pytest.raises(SourceTooSmallError, match=rf"'b' has {available:,} tokens .* short by 1,234 tokens"):
        SourceScaledSampler(corpus, plan, seq_len=SEQ, batch_sequences=ROWS, seed=0)


def test_bad_plans_are_rejected(corpus):
    plan = plan_for(corpus, 0.5)
    with pytest.raises(DataInputError, match=r"not in the corpus"):
        SourceScaledSampler(corpus, {**plan, "zzz": plan["a"]}, seq_len=SEQ, batch_sequences=ROWS, seed=0)
    plan["a"] = {**plan["a"], "share": plan["a"]["share"] + 0.1}
    with pytest.raises(DataInputError, match="shares sum to"):
        SourceScaledSampler(corpus, plan, seq_len=SEQ, batch_sequences=ROWS, seed=0)
