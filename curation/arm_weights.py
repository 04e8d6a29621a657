"""An arm's diversity weights, over the documents the arm keeps.

The `semantic` tagger weighs every document of the corpus against its topic's neighbours (`curation.semantic`):
a document with near-copies sits in a dense region and is weighted down. An arm that removes duplicates (or
filters by quality) first would then weigh the copy it keeps down for neighbours it no longer has: D4
(Tirumala et al. 2023) deduplicates first and measures diversity on what is left. So `mix` with
`diversity: weight` recomputes the weights over the arm's kept documents: each kept document's spread among the
kept documents of its topic (`neighbour_spread`), the median and mean over the kept ones (`spread_scale`), the
weights from them (`weights_from_spread`), exactly `diversity_weights` of the kept documents' embeddings taken
at once (tests/curation/test_mix.py). One topic at a time, the embeddings memory-mapped: memory holds the
largest topic's kept documents. An arm that removes nothing gets the curation's own weights.
"""

from __future__ import annotations

import numpy as np

from curation.store import Store, read_npz
from rungs.data.errors import DataInputError


def kept_diversity_weights(store: Store, units, keep: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per unit, a float64 weight for every row (NaN where the arm does not keep it): the diversity weights
    of the kept documents among themselves."""
    from curation.semantic import neighbour_spread, spread_scale, weights_from_spread

    centroids_path = store.work("topics") / "centroids.npy"
    embed_paths = {u.name: store.work("embed") / f"{u.name}.npy" for u in units}
    gone = [p for p in [centroids_path, *embed_paths.values()] if not p.is_file()]
    if gone:
        raise DataInputError(f"the curation's embeddings or topic centroids are gone ({gone[0]}): the diversity "
                             "weights of an arm are measured over its kept documents from them; curate again into "
                             "a new directory", where=str(store.root))
    centroids = np.load(centroids_path, allow_pickle=False)
    names = [u.name for u in units]
    topic = {n: read_npz(store.attributes("topics", n))["topic"] for n in names}
    uid = {n: read_npz(store.unit_index(n))["uid"] for n in names}
    embed = {n: np.load(p, mmap_mode="r", allow_pickle=False) for n, p in embed_paths.items()}
    spread = {n: np.full(len(topic[n]), np.nan) for n in names}
    kept_topics = np.unique(np.concatenate([topic[n][keep[n]] for n in names])) if names else []
    for t in kept_topics:
        rows = {n: np.flatnonzero(keep[n] & (topic[n] == t)) for n in names}
        # in uid order, as the tagger orders a topic: the spreads do not depend on the files' order
        owner = np.concatenate([np.full(len(r), k) for k, r in enumerate(rows.values())])
        row = np.concatenate(list(rows.values()))
        order = np.argsort(np.concatenate([uid[n][r] for n, r in rows.items()]), kind="stable")
        owner, row = owner[order], row[order]
        x = np.stack([embed[names[k]][r] for k, r in zip(owner.tolist(), row.tolist())])
        s = neighbour_spread(x, np.full(len(row), t, dtype=np.int64), centroids)
        for k, n in enumerate(names):
            mine = owner == k
            spread[n][row[mine]] = s[mine]
    scale = spread_scale(np.concatenate([spread[n][keep[n]] for n in names]) if names else np.zeros(0))
    out = {}
    for n in names:
        w = np.full(len(topic[n]), np.nan)
        w[keep[n]] = weights_from_spread(spread[n][keep[n]], scale)
        out[n] = w
    return out
