"""An arm's diversity weights, over the documents the arm keeps.

The `semantic` tagger weighs every document of the corpus against its topic's neighbours (`curation.semantic`):
a document with near-copies sits in a dense region and is weighted down. An arm that removes duplicates (or
filters by quality) first would then weigh the copy it keeps down for neighbours it no longer has: D4
(Tirumala et al. 2023) deduplicates first and measures diversity on what is left. So `mix` with
`diversity: weight` recomputes the weights over the arm's kept documents: each kept document's spread among the
kept documents of its topic (`neighbour_spread`), the median and mean over the kept ones (`spread_scale`), the
weights from them (`weights_from_spread`), exactly `diversity_weights` of the kept documents' embeddings taken
at once (tests/curation/test_mix.py). The kept documents are sorted once by topic and uid, then one topic at a
time is gathered from the memory-mapped embeddings (one read per file holding it): memory holds the largest
topic's kept documents. An arm that removes nothing gets the curation's own weights.
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
    embed = {n: np.load(p, mmap_mode="r", allow_pickle=False) for n, p in embed_paths.items()}
    spread = {n: np.full(len(keep[n]), np.nan) for n in names}
    # Every kept document as (unit, row, topic, uid), sorted once by topic, then uid (the tagger's order within a
    # topic: the spreads do not depend on the files' order); each topic is then one run of rows.
    row = [np.flatnonzero(keep[n]) for n in names]
    owner = np.concatenate([np.full(len(r), k, dtype=np.int64) for k, r in enumerate(row)] or [np.zeros(0, np.int64)])
    row = np.concatenate(row or [np.zeros(0, np.int64)])
    topic = np.concatenate([read_npz(store.attributes("topics", n))["topic"][keep[n]] for n in names] or [np.zeros(0)])
    uid = np.concatenate([read_npz(store.unit_index(n))["uid"][keep[n]] for n in names] or [np.zeros(0)])
    order = np.lexsort((uid, topic))
    owner, row, topic = owner[order], row[order], topic[order]
    bounds = np.r_[0, np.flatnonzero(topic[1:] != topic[:-1]) + 1, len(topic)]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if lo == hi:
            continue
        who, rows = owner[lo:hi], row[lo:hi]
        files = [(names[k], who == k) for k in np.unique(who).tolist()]  # the files holding this topic's documents
        x = np.empty((hi - lo, embed[names[0]].shape[1]), dtype=embed[names[0]].dtype)
        for name, mine in files:  # one gather per file
            x[mine] = embed[name][rows[mine]]
        s = neighbour_spread(x, np.full(hi - lo, topic[lo], dtype=np.int64), centroids)
        for name, mine in files:
            spread[name][rows[mine]] = s[mine]
    scale = spread_scale(np.concatenate([spread[n][keep[n]] for n in names]) if names else np.zeros(0))
    out = {}
    for n in names:
        w = np.full(len(keep[n]), np.nan)
        w[keep[n]] = weights_from_spread(spread[n][keep[n]], scale)
        out[n] = w
    return out
