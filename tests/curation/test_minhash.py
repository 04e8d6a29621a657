"""MinHash pieces against independent references: shingle-set Jaccard against Python sets of word 5-grams,
signatures deterministic given the seed, and the components algorithm against scipy's."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from curation.components import large_star, small_star
from curation.minhash import LSHParams, jaccard, shingle_sets, signatures, words
from tests.curation.corpus import near_copy, random_text


def reference_jaccard(a: str, b: str) -> float:
    def grams(t: str) -> set:
        w = words(t)
        return {tuple(w[i:i + 5]) for i in range(len(w) - 4)} if len(w) >= 5 else {tuple(w)}
    sa, sb = grams(a), grams(b)
    return len(sa & sb) / len(sa | sb)


def test_shingle_jaccard_equals_the_exact_jaccard_of_word_5_grams():
    rng = np.random.default_rng(1)
    texts = []
    for k in range(20):
        base = random_text(rng, 100 + 10 * k)
        texts += [base, near_copy(rng, base, 1 + k % 7)]
    texts += ["Short text.", "short, TEXT", "", "one two three four five six"]
    flat, offsets = shingle_sets(texts)
    sets = [flat[offsets[i]:offsets[i + 1]] for i in range(len(texts))]
    for i in range(0, 40, 2):
        assert jaccard(sets[i], sets[i + 1]) == pytest.approx(reference_jaccard(texts[i], texts[i + 1]), abs=1e-12)
    assert jaccard(sets[40], sets[41]) == 1.0  # case and punctuation are not differences
    assert len(sets[42]) == 0 and len(sets[43]) == 2


def test_signatures_are_deterministic_given_the_seed_and_estimate_jaccard():
    rng = np.random.default_rng(2)
    base = random_text(rng, 400)
    texts = [base, near_copy(rng, base, 10)]
    flat, offsets = shingle_sets(texts)
    params = LSHParams(bands=32, rows=8, seed=7)
    s1, s2 = signatures(flat, offsets, params), signatures(flat, offsets, params)
    assert s1.shape == (2, 256) and s1.dtype == np.uint32 and np.array_equal(s1, s2)
    assert not np.array_equal(s1, signatures(flat, offsets, LSHParams(bands=32, rows=8, seed=8)))
    estimate = float((s1[0] == s1[1]).mean())
    exact = jaccard(flat[:offsets[1]], flat[offsets[1]:])
    assert abs(estimate - exact) < 4 * np.sqrt(exact * (1 - exact) / 256)


def star_components(edges: np.ndarray) -> dict[int, int]:
    """Alternate large- and small-star in memory (one partition) until the edge set stops changing."""
    src, dst = np.r_[edges[:, 0], edges[:, 1]], np.r_[edges[:, 1], edges[:, 0]]
    previous = None
    for round_ in range(200):
        a, b = (large_star if round_ % 2 == 0 else small_star)(src, dst)
        src, dst = np.r_[a, b], np.r_[b, a]
        state = set(zip(src.tolist(), dst.tolist()))
        if round_ % 2 == 1:
            if state == previous:
                break
            previous = state
    label = {}
    for s, d in zip(src.tolist(), dst.tolist()):
        label[s] = min(label.get(s, s), d, s)
    return label


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_large_small_star_labels_every_node_with_its_components_smallest_node(seed):
    rng = np.random.default_rng(seed)
    nodes = rng.choice(10**12, size=300, replace=False)
    edges = nodes[rng.integers(0, 300, size=(260, 2))]
    edges = edges[edges[:, 0] != edges[:, 1]]
    label = star_components(edges)
    index = {int(n): i for i, n in enumerate(nodes)}
    rows = [index[int(a)] for a in edges[:, 0]]
    cols = [index[int(b)] for b in edges[:, 1]]
    _, comp = connected_components(coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(300, 300)), directed=False)
    for c in np.unique(comp):
        members = nodes[comp == c]
        if len(members) > 1:
            assert {label[int(m)] for m in members} == {int(members.min())}
