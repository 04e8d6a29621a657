"""curation.semantic: SemDeDup against a brute-force float64 reference; D4-style diversity weights."""

from __future__ import annotations

import numpy as np
import pytest

from curation.semantic import diversity_weights, group_id, semantic_duplicates


def corpus_with_duplicates(seed: int = 0, dim: int = 24):
    """Three topics; inside each, random documents plus planted near-copies (single copies, a chain a-b-c where
    a and c are not themselves within eps, exact copies). Returns (doc ids, embeddings, labels, centroids)."""
    rng = np.random.default_rng(seed)
    centroids = rng.normal(size=(3, dim))
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    rows, labels = [], []
    for t in range(3):
        base = centroids[t] + 0.6 * rng.normal(size=(40, dim)) / np.sqrt(dim)
        base /= np.linalg.norm(base, axis=1, keepdims=True)
        rows += list(base)
        for i in range(0, 12, 3):  # near-copies of a few documents
            v = base[i] + 0.02 * rng.normal(size=dim) / np.sqrt(dim)
            rows.append(v / np.linalg.norm(v))
        # a chain: each step cosine ~0.995, the ends ~0.98
        step = rng.normal(size=dim)
        step -= (step @ base[20]) * base[20]
        step /= np.linalg.norm(step)
        for s in (1, 2):
            v = base[20] + s * 0.1 * step
            rows.append(v / np.linalg.norm(v))
        rows += [base[30], base[30]]  # exact copies: a tie on the distance to the centroid
        labels += [t] * (len(rows) - len(labels))
    x = np.asarray(rows, dtype=np.float32)
    ids = [f"doc-{i:04d}" for i in rng.permutation(len(rows))]
    return ids, x, np.asarray(labels, dtype=np.int32), centroids.astype(np.float32)


def brute_force(ids, x, labels, centroids, eps):
    """Every pair in float64, union-find, keep the lowest cosine to the centroid then the smallest id."""
    xn = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    cn = centroids.astype(np.float64) / np.linalg.norm(centroids.astype(np.float64), axis=1, keepdims=True)
    parent = list(range(len(ids)))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            if labels[i] == labels[j] and float(xn[i] @ xn[j]) >= 1 - eps:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(ids)):
        groups.setdefault(find(i), []).append(i)
    cluster, keep = np.empty(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=bool)
    for members in groups.values():
        cluster[members] = group_id(min(ids[i] for i in members))
        keep[min(members, key=lambda i: (float(xn[i] @ cn[labels[i]]), ids[i]))] = True
    return cluster, keep


@pytest.mark.parametrize("block_rows", [7, 2048])
def test_matches_brute_force(block_rows):
    ids, x, labels, centroids = corpus_with_duplicates()
    cluster, keep = semantic_duplicates(ids, x, labels, centroids, eps=0.01, block_rows=block_rows)
    ref_cluster, ref_keep = brute_force(ids, x, labels, centroids, 0.01)
    assert cluster.dtype == np.int64 and keep.dtype == bool
    np.testing.assert_array_equal(cluster, ref_cluster)
    np.testing.assert_array_equal(keep, ref_keep)
    assert 12 <= (~keep).sum() < 40, "the planted copies, and not much else, are removed"


def test_chain_is_one_group_and_exact_copies_keep_the_smallest_id():
    ids, x, labels, centroids = corpus_with_duplicates()
    cluster, keep = semantic_duplicates(ids, x, labels, centroids)
    chain = [20, 44, 45]  # base[20] of topic 0 and its two chain steps
    assert len(set(cluster[chain])) == 1 and keep[chain].sum() == 1
    assert float(x[20] @ x[45]) < 0.99, "the chain's ends are not duplicates by themselves"
    copies = [30, 46, 47]  # base[30] and its two exact copies
    assert keep[copies].tolist() == [ids[i] == min(ids[j] for j in copies) for i in copies]


def test_does_not_depend_on_input_order():
    ids, x, labels, centroids = corpus_with_duplicates(seed=1)
    cluster, keep = semantic_duplicates(ids, x, labels, centroids, block_rows=16)
    perm = np.random.default_rng(2).permutation(len(ids))
    c2, k2 = semantic_duplicates([ids[i] for i in perm], x[perm], labels[perm], centroids, block_rows=16)
    np.testing.assert_array_equal(c2, cluster[perm])
    np.testing.assert_array_equal(k2, keep[perm])


def test_nothing_is_a_duplicate_across_topics():
    x = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    cluster, keep = semantic_duplicates(["a", "b"], x, np.array([0, 1]), np.eye(2, dtype=np.float32))
    assert keep.all() and cluster[0] != cluster[1]
    cluster, keep = semantic_duplicates(["a", "b"], x, np.array([0, 0]), np.eye(2, dtype=np.float32))
    assert keep.tolist() == [True, False] and cluster[0] == cluster[1] == group_id("a")


def test_bad_input_is_refused():
    ids, x, labels, centroids = corpus_with_duplicates()
    with pytest.raises(ValueError, match="doc_ids"):
        semantic_duplicates(ids[:-1], x, labels, centroids)
    with pytest.raises(ValueError, match="unique"):
        semantic_duplicates(["same"] * len(ids), x, labels, centroids)
    with pytest.raises(ValueError, match="labels"):
        semantic_duplicates(ids, x, labels[:-1], centroids)
    with pytest.raises(ValueError, match="labels"):
        semantic_duplicates(ids, x, labels + 5, centroids)
    with pytest.raises(ValueError, match="NaN"):
        semantic_duplicates(ids, np.where(np.arange(x.shape[1]) == 0, np.nan, x), labels, centroids)
    with pytest.raises(ValueError, match="empty"):
        semantic_duplicates([], np.zeros((0, 4), dtype=np.float32), np.zeros(0, dtype=np.int32), centroids)
    with pytest.raises(ValueError, match="eps"):
        semantic_duplicates(ids, x, labels, centroids, eps=-0.1)


def clump_and_loners(seed: int = 0, dim: int = 16):
    """One topic: 60 documents packed tightly around one direction, 8 scattered widely."""
    rng = np.random.default_rng(seed)
    center = np.zeros(dim)
    center[0] = 1.0
    clump = center + 0.03 * rng.normal(size=(60, dim))
    loners = center + 0.8 * rng.normal(size=(8, dim))
    x = np.vstack([clump, loners]).astype(np.float32)
    return x, np.zeros(len(x), dtype=np.int32), center[None].astype(np.float32)


def test_dense_clump_weighs_less_than_isolated_points():
    x, labels, centroids = clump_and_loners()
    w = diversity_weights(x, labels, centroids, k_neighbors=5)
    assert w.dtype == np.float64 and (w > 0).all()
    assert w.mean() == pytest.approx(1.0, abs=1e-12)
    assert w[60:].min() > 3 * w[:60].max()
    np.testing.assert_array_equal(w, diversity_weights(x, labels, centroids, k_neighbors=5))


def test_weights_are_the_brute_force_knn_spread_clipped_and_normalised():
    x, labels, centroids = clump_and_loners(seed=3)
    xn = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    dist = 1.0 - xn @ xn.T
    np.fill_diagonal(dist, np.inf)
    spread = np.sort(dist, axis=1)[:, :4].mean(axis=1)
    ratio = np.clip(spread / np.median(spread), 0.1, 10.0)
    np.testing.assert_allclose(diversity_weights(x, labels, centroids, k_neighbors=4), ratio / ratio.mean(), rtol=1e-5)


def test_weight_range_and_lone_documents():
    x, labels, centroids = clump_and_loners()
    x = np.vstack([x, np.tile(x[:1], (30, 1)), -x[:1]])  # 30 exact copies (spread 0), one alone in topic 1
    labels = np.concatenate([labels, np.zeros(30, dtype=np.int32), [1]])
    centroids = np.vstack([centroids, -centroids])
    w = diversity_weights(x, labels, centroids, k_neighbors=5, clip_ratio=4.0)
    assert w.mean() == pytest.approx(1.0) and (w > 0).all()
    assert w.max() / w.min() == pytest.approx(16.0), "the clip bounds the spread at clip_ratio squared"
    assert w[-1] == w.max()


def test_diversity_bad_input_is_refused():
    x, labels, centroids = clump_and_loners()
    with pytest.raises(ValueError, match="k_neighbors"):
        diversity_weights(x, labels, centroids, k_neighbors=0)
    with pytest.raises(ValueError, match="labels"):
        diversity_weights(x, labels[:3], centroids)
    with pytest.raises(ValueError, match="2-D"):
        diversity_weights(x[0], labels, centroids)
    with pytest.raises(ValueError, match="dimension"):
        diversity_weights(x, labels, np.ones((1, 3), dtype=np.float32))
