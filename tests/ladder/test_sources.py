"""Source scaling: repetition invariance, nesting, the report's example, random mixtures."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ladder.errors import LadderInputError
from ladder.plan.generator import plan_ladder
from ladder.plan.recipe import Source, load_recipe
from ladder.plan.sources import plan_sources


def test_reports_example_8x_at_50T_cut_to_a_tenth_at_5T():
    # A source repeated 8 times in the 50T run: 10% share of 50T = 5T tokens from 0.625T unique.
    mix = [Source(name="small", share=0.1, unique_tokens=0.625e12), Source(name="rest", share=0.9, unique_tokens=900e12)]
    full = plan_sources(mix, 50e12, 50e12)["small"]
    rung = plan_sources(mix, 5e12, 50e12)["small"]
    assert full.epochs == pytest.approx(8.0)
    assert rung.epochs == pytest.approx(8.0)
    assert rung.unique_tokens == pytest.approx(full.unique_tokens / 10)
    assert rung.tokens == pytest.approx(rung.unique_tokens * rung.epochs)


def test_repetition_invariant_and_caps_nested_across_mai_rungs():
    recipe = load_recipe("mai-base-2")
    rungs = plan_ladder(recipe, [18, 24, 30, 36, 42, 102])
    for source in recipe.mixture:
        epochs = [r.sources[source.name].epochs for r in rungs]
        assert max(epochs) == pytest.approx(min(epochs), rel=1e-12)
        assert epochs[0] == pytest.approx(source.share * recipe.full_scale_tokens / source.unique_tokens)
        caps = [r.sources[source.name].unique_tokens for r in rungs]
        assert caps == sorted(caps)  # nested: a smaller rung's subset fits inside a larger one's
        assert caps[-1] <= source.unique_tokens


def test_realistic_repetition_in_shipped_mix():
    recipe = load_recipe("mai-base-2")
    epochs = {s.name: s.share * recipe.full_scale_tokens / s.unique_tokens for s in recipe.mixture}
    assert max(epochs.values()) >= 4  # small sources repeated several times
    assert min(epochs.values()) < 1  # large sources seen less than once


def test_rung_larger_than_full_run_is_an_error():
    mix = [Source(name="a", share=1.0, unique_tokens=1e9)]
    with pytest.raises(LadderInputError, match="exceeds the full-scale budget"):
        plan_sources(mix, 2e9, 1e9)


def test_shares_not_summing_to_one_is_an_error():
    mix = [Source(name="a", share=0.5, unique_tokens=1e9), Source(name="b", share=0.4, unique_tokens=1e9)]
    with pytest.raises(LadderInputError, match="sum to 0.9"):
        plan_sources(mix, 1e8, 1e9)


@st.composite
def mixtures(draw):
    n = draw(st.integers(1, 8))
    weights = draw(st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n))
    total = sum(weights)
    shares = [w / total for w in weights]
    shares[-1] = 1.0 - sum(shares[:-1])
    uniques = draw(st.lists(st.floats(1e6, 1e13), min_size=n, max_size=n))
    return [Source(name=f"s{i}", share=s, unique_tokens=u) for i, (s, u) in enumerate(zip(shares, uniques))]


@settings(max_examples=200, deadline=None)
@given(mix=mixtures(), fractions=st.lists(st.floats(1e-6, 1.0), min_size=2, max_size=6))
def test_property_random_mixtures(mix, fractions):
    full = 1e12
    plans = [plan_sources(mix, f * full, full) for f in sorted(fractions)]
    for s in mix:
        allocs = [p[s.name] for p in plans]
        full_epochs = s.share * full / s.unique_tokens
        for a, f in zip(allocs, sorted(fractions)):
            assert a.epochs == pytest.approx(full_epochs, rel=1e-9)
            assert a.tokens == pytest.approx(a.unique_tokens * a.epochs, rel=1e-9)
            assert a.tokens == pytest.approx(s.share * f * full, rel=1e-9)
        caps = [a.unique_tokens for a in allocs]
        assert all(x <= y * (1 + 1e-12) for x, y in zip(caps, caps[1:]))
    for p, f in zip(plans, sorted(fractions)):
        assert sum(a.tokens for a in p.values()) == pytest.approx(f * full, rel=1e-9)
