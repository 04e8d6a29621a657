"""Topic buckets: spherical k-means on document embeddings (SemDeDup §3, FineWeb §4.1, NeMo Curator).

`fit_topics` fits `n_topics` unit-norm centroids with faiss's k-means (`spherical=True`: the centroids are
re-normalised after every update, so a document joins the centroid of highest cosine) on a sample of at
most `sample_size` documents drawn with `seed`; `assign_topics` gives every document the index of its
nearest centroid by cosine. Fitting on a sample keeps the cost of a large corpus bounded (k-means on 100k
points to 100 centroids is seconds); assigning is one matrix product per block of documents.

The checks on embeddings shared by the curation taggers (finite, 2-D, float) live here too.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_SAMPLE_SIZE = 100_000
DEFAULT_NITER = 50  # faiss's default is 25; NeMo Curator runs up to 300, SemDeDup converges in tens
ASSIGN_BLOCK_ROWS = 8192


def check_embeddings(embeddings: np.ndarray, name: str = "embeddings") -> np.ndarray:
    """`embeddings` as a float array of shape (n >= 1, d >= 1) with finite entries, or a ValueError."""
    arr = np.asarray(embeddings)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n, d), got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be a float array, got dtype {arr.dtype}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} has NaN or infinite entries (rows {np.flatnonzero(~np.isfinite(arr).all(1))[:5].tolist()}...)")
    return arr


def check_centroids(centroids: np.ndarray, dim: int) -> np.ndarray:
    arr = check_embeddings(centroids, "centroids")
    if arr.shape[1] != dim:
        raise ValueError(f"centroids have dimension {arr.shape[1]}, embeddings {dim}")
    return arr


def normalise_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (an all-zero row stays zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def sample_indices(n: int, sample_size: int, seed: int) -> np.ndarray:
    """Sorted indices of a uniform sample of min(n, sample_size) rows, fixed by `seed`."""
    if sample_size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=sample_size, replace=False))


def kmeans_plus_plus(x: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007; scikit-learn's default) for unit-norm x: k rows,
    each next one the best of 2 + ln(k) candidates drawn with probability proportional to their squared
    distance from the nearest seed chosen so far. faiss starts from k random points instead, which on
    well-separated clusters often puts two centroids in one cluster and none in another."""
    rng = np.random.default_rng(seed)
    trials = 2 + int(np.log(k))
    chosen = [int(rng.integers(x.shape[0]))]
    nearest = np.maximum(2.0 - 2.0 * (x @ x[chosen[0]]), 0.0)  # squared distance between unit vectors
    for _ in range(1, k):
        total = nearest.sum()
        if total <= 0:  # fewer distinct points than seeds: any row will do
            chosen.append(int(rng.integers(x.shape[0])))
            continue
        candidates = rng.choice(x.shape[0], size=trials, p=nearest / total)
        options = np.minimum(nearest, np.maximum(2.0 - 2.0 * (x[candidates] @ x.T), 0.0))  # (trials, n)
        best = int(np.argmin(options.sum(axis=1)))
        chosen.append(int(candidates[best]))
        nearest = options[best]
    return x[chosen]


def fit_topics(embeddings: np.ndarray, n_topics: int, seed: int, *, sample_size: int = DEFAULT_SAMPLE_SIZE,
               niter: int = DEFAULT_NITER) -> np.ndarray:
    """Unit-norm centroids (n_topics, d) float32 of spherical k-means on a seeded sample of the rows of
    `embeddings` (normalised first), started from k-means++ seeds. The same inputs and seed give the same
    centroids."""
    import faiss

    x = check_embeddings(embeddings)
    if n_topics < 1:
        raise ValueError(f"n_topics must be >= 1, got {n_topics}")
    if sample_size < 1:
        raise ValueError(f"sample_size must be >= 1, got {sample_size}")
    if not 0 <= seed:  # numpy's generators take non-negative seeds only
        raise ValueError(f"seed must be a non-negative int, got {seed}")
    idx = sample_indices(x.shape[0], sample_size, seed)
    if idx.size < n_topics:
        raise ValueError(f"n_topics={n_topics} is more than the {idx.size} documents sampled to fit them")
    sample = np.ascontiguousarray(normalise_rows(x[idx].astype(np.float64)), dtype=np.float32)
    # min_points_per_centroid=1 silences faiss's "provide at least 39*k points" message (printed on stderr by
    # C++); max_points_per_centroid=n keeps faiss from subsampling again: the sample above is the fitted set.
    km = faiss.Kmeans(x.shape[1], n_topics, niter=niter, seed=int(seed) % 2**31, spherical=True, verbose=False,
                      min_points_per_centroid=1, max_points_per_centroid=max(1, idx.size))
    km.train(sample, init_centroids=kmeans_plus_plus(sample.astype(np.float64), n_topics, seed).astype(np.float32))
    logger.debug("fit_topics: %d topics on %d of %d documents, objective %.6g", n_topics, idx.size, x.shape[0],
                 float(km.obj[-1]) if len(km.obj) else float("nan"))
    return np.ascontiguousarray(normalise_rows(km.centroids.astype(np.float64)), dtype=np.float32)


def assign_topics(embeddings: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Topic label (int32) of every row: the centroid of highest cosine, computed in float64; on an exact
    tie the lowest centroid index wins."""
    x = check_embeddings(embeddings)
    c = normalise_rows(check_centroids(centroids, x.shape[1]).astype(np.float64))
    labels = np.empty(x.shape[0], dtype=np.int32)
    for start in range(0, x.shape[0], ASSIGN_BLOCK_ROWS):
        block = x[start:start + ASSIGN_BLOCK_ROWS].astype(np.float64)
        # cosine up to the row's own norm, which does not change the argmax over centroids
        labels[start:start + block.shape[0]] = np.argmax(block @ c.T, axis=1)
    return labels
