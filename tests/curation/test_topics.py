"""curation.topics: spherical k-means recovers planted clusters and agrees with scikit-learn's KMeans."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from curation.topics import assign_topics, fit_topics


def planted(n_clusters: int = 6, per_cluster: int = 40, dim: int = 32, noise: float = 0.05, seed: int = 0):
    """Unit vectors around `n_clusters` random directions (far apart in 32-d), with their true labels."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_clusters, dim))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    truth = np.repeat(np.arange(n_clusters), per_cluster)
    x = centers[truth] + noise * rng.normal(size=(truth.size, dim))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    perm = rng.permutation(truth.size)
    return x[perm].astype(np.float32), truth[perm]


def test_planted_clusters_are_recovered_exactly():
    x, truth = planted()
    centroids = fit_topics(x, 6, seed=0)
    assert centroids.shape == (6, 32) and centroids.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1.0, atol=1e-6)
    labels = assign_topics(x, centroids)
    assert labels.dtype == np.int32
    assert adjusted_rand_score(truth, labels) == 1.0


def test_agrees_with_sklearn_kmeans_on_normalised_data():
    x, _ = planted(n_clusters=5, noise=0.2, seed=3)
    ours = assign_topics(x, fit_topics(x, 5, seed=1))
    theirs = KMeans(5, n_init=10, random_state=0).fit_predict(x.astype(np.float64))
    assert adjusted_rand_score(theirs, ours) == 1.0


def test_deterministic_for_a_seed_and_a_sample():
    x, truth = planted(per_cluster=100)
    a = fit_topics(x, 6, seed=7, sample_size=300)
    assert np.array_equal(a, fit_topics(x, 6, seed=7, sample_size=300))
    assert adjusted_rand_score(truth, assign_topics(x, a)) == 1.0, "a 300-point sample still finds the 6 clusters"


def test_assign_is_the_float64_argmax_of_cosine():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(500, 16)).astype(np.float32)
    c = rng.normal(size=(7, 16)).astype(np.float32)
    cn = c.astype(np.float64) / np.linalg.norm(c.astype(np.float64), axis=1, keepdims=True)
    xn = x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)
    np.testing.assert_array_equal(assign_topics(x, c), np.argmax(xn @ cn.T, axis=1))


def test_ties_go_to_the_lowest_centroid_index():
    c = np.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    x = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(assign_topics(x, c), [1, 0])


@pytest.mark.parametrize("bad", [np.zeros((0, 4)), np.zeros(4), np.array([[1.0, np.nan]]), np.ones((3, 2), dtype=np.int64)])
def test_bad_embeddings_are_refused(bad):
    with pytest.raises(ValueError):
        fit_topics(bad, 1, seed=0)
    with pytest.raises(ValueError):
        assign_topics(bad, np.ones((1, 4), dtype=np.float32))


def test_bad_sizes_are_refused():
    x, _ = planted()
    with pytest.raises(ValueError, match="n_topics"):
        fit_topics(x[:3], 4, seed=0)
    with pytest.raises(ValueError, match="n_topics"):
        fit_topics(x, 0, seed=0)
    with pytest.raises(ValueError, match="dimension"):
        assign_topics(x, np.ones((2, 5), dtype=np.float32))
