"""Semantic deduplication (SemDeDup) and diversity weights (D4) inside topic buckets.

`semantic_duplicates`: SemDeDup (Abbas et al. 2023, arXiv 2303.09540 §3). Within each topic, two documents
whose embeddings have cosine >= 1 - eps are duplicates; duplicate groups are the connected components of
that graph. Each group keeps one document, the one farthest from its topic centroid (lowest cosine to it:
the least prototypical, the one that adds the most diversity), ties broken by the smallest doc id. A group's
id is a 63-bit hash of its smallest doc id, so ids and decisions do not depend on the order of the input.
Default eps = 0.01 (NeMo Curator's). Each topic is compared in blocks of `block_rows` x `block_rows`
similarities, and edges are reduced to a spanning forest as they come, so memory is O(block_rows² + m) for a
topic of m documents, never O(m²), even when one duplicate group holds the whole topic.

`diversity_weights`: D4's idea (Tirumala et al. 2023): a document in a dense region of embedding space (many
close neighbours) is worth less than one in a sparse region. A document's density score is its mean cosine
distance to its `k_neighbors` nearest neighbours in its topic (faiss exact inner-product search); the weight is
that score (recomputed in float64 once faiss has found the neighbours) over the corpus median, clipped to [1 / clip_ratio, clip_ratio] (default 10: no document counts
more than 100x another), then scaled so the weights average exactly 1. A document alone in its topic gets the
top of the range. Topics with fewer than k_neighbors + 1 documents use all the others as neighbours.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from curation.topics import check_centroids, check_embeddings, normalise_rows
from rungs.data.errors import DataInputError

logger = logging.getLogger(__name__)

DEFAULT_EPS = 0.01
DEFAULT_BLOCK_ROWS = 2048
DEFAULT_K_NEIGHBORS = 10
DEFAULT_CLIP_RATIO = 10.0
# Slack on the cosine threshold for the rounding of a float64 dot product of unit vectors (~1e-15 at d = 256):
# two equal embeddings have cosine 1 up to that rounding and are duplicates at every eps, 0 included.
COSINE_SLACK = 1e-12


def check_labels(labels: np.ndarray, n: int, n_topics: int) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), one per document, got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {arr.dtype}")
    if n and (arr.min() < 0 or arr.max() >= n_topics):
        raise ValueError(f"labels must lie in [0, {n_topics}) (one per centroid), got [{arr.min()}, {arr.max()}]")
    return arr.astype(np.int64)


def check_eps(eps: float) -> float:
    """`eps` if it is a valid SemDeDup threshold (in [0, 2); NaN is not), else a DataInputError (a ValueError):
    eps is the user's setting (`ladder data curate --semantic-eps`)."""
    if not 0.0 <= eps < 2.0:
        raise DataInputError(f"eps must be in [0, 2) (duplicates have cosine >= 1 - eps), got {eps}")
    return eps


def group_id(doc_id: str) -> int:
    """A stable non-negative int64 for a duplicate group: the first 8 bytes of blake2b of its smallest doc id."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "big") & (2**63 - 1)


def _components(n: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Component label of each of n nodes under the undirected edges (rows, cols)."""
    graph = coo_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=(n, n)).tocsr()
    return connected_components(graph, directed=False)[1]


def _forest(n: int, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges with the same components as (rows, cols) but at most n of them: each node to its component's root."""
    if rows.size <= n:
        return rows, cols
    comp = _components(n, rows, cols)
    root = np.full(comp.max() + 1, n, dtype=np.int64)
    np.minimum.at(root, comp, np.arange(n))
    members = np.flatnonzero(root[comp] != np.arange(n))
    return members, root[comp[members]]


def _duplicate_components(x: np.ndarray, threshold: float, block_rows: int) -> np.ndarray:
    """Component labels of the graph `cosine(x_i, x_j) >= threshold` over the rows of a unit-norm x (m, d)."""
    m = x.shape[0]
    rows, cols = np.empty(0, np.int64), np.empty(0, np.int64)
    for i0 in range(0, m, block_rows):
        xi = x[i0:i0 + block_rows]
        for j0 in range(i0, m, block_rows):
            sims = xi @ x[j0:j0 + block_rows].T  # (bi, bj) float64
            ii, jj = np.nonzero(sims >= threshold - COSINE_SLACK)
            if j0 == i0:
                upper = ii < jj
                ii, jj = ii[upper], jj[upper]
            if ii.size:
                rows, cols = _forest(m, np.concatenate([rows, ii + i0]), np.concatenate([cols, jj + j0]))
    return _components(m, rows, cols)


def semantic_duplicates(doc_ids: Sequence[str], embeddings: np.ndarray, labels: np.ndarray, centroids: np.ndarray,
                        eps: float = DEFAULT_EPS, *, block_rows: int = DEFAULT_BLOCK_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """(semantic cluster id int64 per document, keep bool per document). Documents in no duplicate group are
    their own cluster (the hash of their own id) and are kept. Cosines are computed in float64 and compared with
    1 - eps less `COSINE_SLACK` (1e-12, their rounding), so equal embeddings are duplicates at every eps, 0
    included."""
    x = check_embeddings(embeddings)
    n = x.shape[0]
    ids = list(doc_ids) if not isinstance(doc_ids, str) else None
    if ids is None or len(ids) != n or not all(isinstance(d, str) for d in ids):
        raise ValueError(f"doc_ids must be a sequence of {n} str, one per embedding row")
    if len(set(ids)) != n:
        raise ValueError("doc_ids must be unique")
    c = normalise_rows(check_centroids(centroids, x.shape[1]).astype(np.float64))
    lab = check_labels(labels, n, c.shape[0])
    check_eps(eps)
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    xn = normalise_rows(x.astype(np.float64))
    id_rank = np.empty(n, dtype=np.int64)
    id_rank[sorted(range(n), key=ids.__getitem__)] = np.arange(n)  # rank of each doc id, for order-free ties
    by_rank = np.argsort(id_rank)
    cluster = np.empty(n, dtype=np.int64)
    keep = np.zeros(n, dtype=bool)
    for topic in np.unique(lab):
        members = np.flatnonzero(lab == topic)
        comp = _duplicate_components(xn[members], 1.0 - eps, block_rows)
        # keep per component: the lowest cosine to the centroid, then the smallest doc id. Row by row (a product
        # and numpy's sum of each row), not a matrix-vector product: BLAS rounds a row's dot product differently
        # at different positions, and equal embeddings must tie wherever they are for the id to break the tie.
        to_centroid = (xn[members] * c[topic]).sum(axis=1)
        order = np.lexsort((id_rank[members], to_centroid, comp))
        first = np.ones(order.size, dtype=bool)
        first[1:] = comp[order[1:]] != comp[order[:-1]]
        keep[members[order[first]]] = True
        smallest = np.full(comp.max() + 1, n, dtype=np.int64)
        np.minimum.at(smallest, comp, id_rank[members])
        cluster[members] = np.array([group_id(ids[by_rank[r]]) for r in smallest], dtype=np.int64)[comp]
    logger.debug("semantic_duplicates: %d documents, %d kept at eps=%g", n, int(keep.sum()), eps)
    return cluster, keep


def diversity_weights(embeddings: np.ndarray, labels: np.ndarray, centroids: np.ndarray, *,
                      k_neighbors: int = DEFAULT_K_NEIGHBORS, clip_ratio: float = DEFAULT_CLIP_RATIO) -> np.ndarray:
    """Sampling weight (float64 > 0, mean exactly 1) of every document: higher where its topic's neighbours
    are far (a sparse region), lower where they are close (a dense one)."""
    check_clip_ratio(clip_ratio)
    spread = neighbour_spread(embeddings, labels, centroids, k_neighbors=k_neighbors)
    return weights_from_spread(spread, spread_scale(spread, clip_ratio), clip_ratio)


def check_clip_ratio(clip_ratio: float) -> None:
    if not 1.0 <= clip_ratio < np.inf:  # an infinite ratio would give a lone document an infinite weight
        raise ValueError(f"clip_ratio must be finite and >= 1, got {clip_ratio}")


def neighbour_spread(embeddings: np.ndarray, labels: np.ndarray, centroids: np.ndarray, *,
                     k_neighbors: int = DEFAULT_K_NEIGHBORS) -> np.ndarray:
    """Each document's mean cosine distance to its k nearest neighbours in its topic (float64; NaN: alone in
    its topic). A topic's spreads depend on that topic's documents only, so a corpus split by whole topics
    gets the same spreads in any split; the weights' scale (`spread_scale`) is the whole corpus's."""
    import faiss

    x = check_embeddings(embeddings)
    n = x.shape[0]
    c = check_centroids(centroids, x.shape[1])
    lab = check_labels(labels, n, c.shape[0])
    if k_neighbors < 1:
        raise ValueError(f"k_neighbors must be >= 1, got {k_neighbors}")
    x64 = normalise_rows(x.astype(np.float64))
    xn = np.ascontiguousarray(x64, dtype=np.float32)
    spread = np.full(n, np.nan)
    for topic in np.unique(lab):
        members = np.flatnonzero(lab == topic)
        k = min(k_neighbors, members.size - 1)
        if k == 0:
            continue
        index = faiss.IndexFlatIP(x.shape[1])
        index.add(xn[members])
        _, nbrs = index.search(xn[members], k + 1)
        # drop each document itself; where exact duplicates tie with it and push it out, drop the last column
        own = nbrs == np.arange(members.size)[:, None]
        own[~own.any(axis=1), -1] = True
        nbrs = nbrs[~own].reshape(members.size, k)
        # faiss finds the neighbours; their distances are recomputed in float64, where 1 - cos of close
        # neighbours (1e-4 and below in a dense clump) keeps its digits
        cos = np.einsum("md,mkd->mk", x64[members], x64[members[nbrs]])
        spread[members] = np.clip(1.0 - cos, 0.0, 2.0).mean(axis=1)
    return spread


def spread_scale(spread: np.ndarray, clip_ratio: float = DEFAULT_CLIP_RATIO) -> dict[str, float] | None:
    """The corpus-wide constants that turn spreads into weights: the median positive spread and the mean of
    the clipped ratios (`weights_from_spread` divides by it, so the weights' mean is 1). None where no spread
    is positive (every document alone in its topic, or every neighbour an exact copy): every weight is 1.
    The mean is an exact sum (`math.fsum`), so it does not depend on the order the spreads come in."""
    check_clip_ratio(clip_ratio)
    known = spread[~np.isnan(spread)]
    positive = known[known > 0]
    if positive.size == 0:
        return None
    median = float(np.median(positive))
    ratio = _clipped_ratio(spread, median, clip_ratio)
    return {"median": median, "mean_ratio": math.fsum(ratio.tolist()) / len(ratio)}


def weights_from_spread(spread: np.ndarray, scale: dict[str, float] | None,
                        clip_ratio: float = DEFAULT_CLIP_RATIO) -> np.ndarray:
    """Weights of these documents under the corpus's `scale`: spread over the median spread, clipped to
    [1/clip_ratio, clip_ratio] (alone in its topic: the top), over the corpus's mean of that ratio."""
    if scale is None:
        return np.ones(len(spread))
    return _clipped_ratio(spread, scale["median"], clip_ratio) / scale["mean_ratio"]


def _clipped_ratio(spread: np.ndarray, median: float, clip_ratio: float) -> np.ndarray:
    ratio = np.clip(spread / median, 1.0 / clip_ratio, clip_ratio)
    ratio[np.isnan(spread)] = clip_ratio
    return ratio
