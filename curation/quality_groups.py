"""The quality classifier's splits by near-duplicate group: texts that are copies or near-copies of each other
always fall on the same side of the held-out split and in the same out-of-fold fold.

Split document by document, a near-copy of a held-out text can sit in the training split: the model has seen
it, the held-out AUC measures memory rather than generalisation, and an out-of-fold score is made by a model
that trained on the text's twin. Groups are the near-duplicate clusters the pipeline finds (`curation.near`):
MinHash LSH candidates (`curation.minhash`, the default `LSHParams`: 14 bands x 8 rows), each verified by the
exact Jaccard of its word 5-gram shingle sets at the pipeline's default threshold (0.7), and joined by
union-find; texts with the same normalised text (`curation.exact.normalise`) join whether they have words or
not. The splits are scikit-learn's `StratifiedGroupKFold`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from curation.exact import normalise
from curation.minhash import LSHParams, band_keys, jaccard, shingle_sets, signatures
from rungs.data.errors import DataInputError


def near_duplicate_groups(texts: Sequence[str], params: LSHParams | None = None) -> np.ndarray:
    """Group label (int64, 0 .. groups - 1, numbered in order of each group's first text) of every text: the
    connected components of the graph whose edges join texts with the same `normalise`d text, and LSH candidate
    pairs whose shingle sets have exact Jaccard >= `params.threshold` (default `LSHParams()`, the pipeline's).

    Like the pipeline, a near-duplicate pair must meet in some LSH bucket: a pair at the threshold is caught
    with probability `params.catch_probability(0.7)` (0.56 at the defaults), one at 0.9 almost surely, unless
    a chain of caught pairs joins it. A bucket's pairs are verified only between texts not yet joined, so a
    bucket of k near-copies costs about k Jaccards, not k^2/2."""
    params = params or LSHParams()
    parent = list(range(len(texts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:  # the smaller index is the root: a group's root is its first text
        ri, rj = find(i), find(j)
        parent[max(ri, rj)] = min(ri, rj)

    first_of: dict[str, int] = {}
    distinct: list[int] = []  # one text per normalised text: only these go through MinHash
    for i, text in enumerate(texts):
        first = first_of.setdefault(normalise(text), i)
        if first == i:
            distinct.append(i)
        else:
            join(first, i)
    flat, offsets = shingle_sets([texts[i] for i in distinct])
    rows = np.flatnonzero(np.diff(offsets) > 0)  # a text without a word has no shingles and no signature
    if len(rows) > 1:
        keys = band_keys(_signatures_of(flat, offsets, rows, params), params)  # (m, bands)
        rejected: set[tuple[int, int]] = set()
        for band in range(params.bands):
            order = np.argsort(keys[:, band], kind="stable")
            sorted_keys = keys[order, band]
            starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
            ends = np.r_[starts[1:], len(order)]
            for start, end in zip(starts[ends - starts > 1].tolist(), ends[ends - starts > 1].tolist()):
                members = sorted(order[start:end].tolist())
                for b_pos, b in enumerate(members):
                    for a in members[:b_pos]:
                        ia, ib = distinct[rows[a]], distinct[rows[b]]
                        if find(ia) == find(ib) or (a, b) in rejected:
                            continue
                        ra, rb = rows[a], rows[b]
                        if jaccard(flat[offsets[ra]:offsets[ra + 1]], flat[offsets[rb]:offsets[rb + 1]]) \
                                >= params.threshold:
                            join(ia, ib)
                        else:
                            rejected.add((a, b))
    roots = np.array([find(i) for i in range(len(texts))], dtype=np.int64)
    return np.unique(roots, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _signatures_of(flat: np.ndarray, offsets: np.ndarray, rows: np.ndarray, params: LSHParams) -> np.ndarray:
    """(len(rows), num_perm) uint32 MinHash signatures of the given rows (each non-empty) of ragged shingle sets."""
    sizes = np.diff(offsets)[rows]
    sel_flat = np.concatenate([flat[offsets[r]:offsets[r + 1]] for r in rows])
    return signatures(sel_flat, np.r_[0, np.cumsum(sizes)].astype(np.int64), params)


def minhash_rows(texts: Sequence[str], params: LSHParams) -> tuple[np.ndarray, np.ndarray]:
    """(signatures, signed): every text's MinHash signature ((n, num_perm) uint32) of its word 5-gram shingles,
    as `near_duplicate_groups` signs them; a text without a word has none (a row of zeros, `signed` False)."""
    flat, offsets = shingle_sets(list(texts))
    signed = np.diff(offsets) > 0
    out = np.zeros((len(texts), params.num_perm), dtype=np.uint32)
    rows = np.flatnonzero(signed)
    if rows.size:
        out[rows] = _signatures_of(flat, offsets, rows, params)
    return out, signed


def nearest_near_copy(query: np.ndarray, query_signed: np.ndarray, reference: np.ndarray,
                      reference_signed: np.ndarray, params: LSHParams) -> np.ndarray:
    """For each query signature, the reference row it is a near-copy of, or -1: among the signed reference rows
    that share an LSH bucket with it, the one whose signature agrees with it in the most of the `num_perm`
    places (MinHash's estimate of their Jaccard; the lowest row among equals), if that estimate is at least
    `params.threshold`. The shingle sets are not at hand here (only signatures are kept), so the check is the
    estimate, not the exact Jaccard `near_duplicate_groups` verifies (its standard error at 0.7 is
    sqrt(0.7 x 0.3 / num_perm), 0.043 at the default 112)."""
    out = np.full(len(query), -1, dtype=np.int64)
    q_rows, r_rows = np.flatnonzero(query_signed), np.flatnonzero(reference_signed)
    if not q_rows.size or not r_rows.size:
        return out
    q_keys, r_keys = band_keys(query[q_rows], params), band_keys(reference[r_rows], params)
    pairs_q, pairs_r = [], []
    for band in range(params.bands):
        order = np.argsort(r_keys[:, band], kind="stable")
        sorted_keys = r_keys[order, band]
        left = np.searchsorted(sorted_keys, q_keys[:, band], side="left")
        count = np.searchsorted(sorted_keys, q_keys[:, band], side="right") - left
        hit = np.flatnonzero(count)
        if not hit.size:
            continue
        n = count[hit]
        starts = np.repeat(left[hit] - np.r_[0, np.cumsum(n)[:-1]], n) + np.arange(n.sum())
        pairs_q.append(np.repeat(hit, n))
        pairs_r.append(order[starts])
    if not pairs_q:
        return out
    pair = np.unique(np.concatenate(pairs_q) * len(r_rows) + np.concatenate(pairs_r))
    pq, pr = pair // len(r_rows), pair % len(r_rows)
    agree = (query[q_rows[pq]] == reference[r_rows[pr]]).sum(axis=1)
    best = np.lexsort((pr, -agree, pq))  # by query, then most agreement, then lowest reference row
    first = best[np.r_[True, pq[best][1:] != pq[best][:-1]]]
    close = agree[first] >= params.threshold * params.num_perm
    out[q_rows[pq[first][close]]] = r_rows[pr[first][close]]
    return out


def _distinct_groups(y: np.ndarray, groups: np.ndarray, label: int) -> int:
    return len(np.unique(groups[y == label]))


def _too_few(y: np.ndarray, groups: np.ndarray, what: str) -> DataInputError:
    have = ", ".join(f"{name} {int((y == label).sum())} documents in {_distinct_groups(y, groups, label)} groups"
                     for name, label in (("positive_texts", 1), ("negative_texts", 0)))
    return DataInputError(f"near-duplicates leave too few distinct documents to {what} ({have}; copies and texts "
                          f"at Jaccard >= {LSHParams().threshold} form one group, and a group is never split)")


def heldout_split(y: np.ndarray, groups: np.ndarray, heldout_fraction: float, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, held-out rows), each sorted: one fold of a `StratifiedGroupKFold` (shuffled, seeded)
    into round(1 / heldout_fraction) folds held out (above one half: one fold of round(1 / (1 - fraction))
    trained on), the first in scikit-learn's order that leaves both classes on both sides. Fewer folds where a
    class has fewer groups (each fold needs one of its groups); a DataInputError where a class has fewer than
    two groups or no fold leaves both classes on both sides."""
    from sklearn.model_selection import StratifiedGroupKFold

    flipped = heldout_fraction > 0.5
    fewest = min(_distinct_groups(y, groups, label) for label in (0, 1))
    if fewest < 2:
        raise _too_few(y, groups, "hold one out and train on another, per class")
    n_splits = max(2, min(fewest, round(1 / (1 - heldout_fraction if flipped else heldout_fraction))))
    rows = np.arange(len(y))
    for train, held in StratifiedGroupKFold(n_splits, shuffle=True, random_state=seed % 2**32).split(rows, y,
                                                                                                     groups):
        if flipped:
            train, held = held, train
        if len(np.unique(y[train])) == 2 and len(np.unique(y[held])) == 2:
            return np.sort(train), np.sort(held)
    raise _too_few(y, groups, f"hold out {heldout_fraction:.0%} with both classes on both sides")


def out_of_fold(y: np.ndarray, groups: np.ndarray, max_folds: int, seed: int) -> np.ndarray | None:
    """Each row's out-of-fold fold (int64, 0 .. k - 1): a `StratifiedGroupKFold` (shuffled, seeded) into k folds,
    k the largest up to `max_folds` (and the fewest groups of a class) whose every fold's complement holds both
    classes; None where no k >= 2 does (a class of one group: its rows keep in-sample scores)."""
    from sklearn.model_selection import StratifiedGroupKFold

    rows = np.arange(len(y))
    for k in range(min(max_folds, *(_distinct_groups(y, groups, label) for label in (0, 1))), 1, -1):
        fold = np.full(len(y), -1, dtype=np.int64)
        ok = True
        for i, (rest, own) in enumerate(StratifiedGroupKFold(k, shuffle=True, random_state=seed % 2**32).split(
                rows, y, groups)):
            fold[own] = i
            ok = ok and len(own) > 0 and len(np.unique(y[rest])) == 2
        if ok and (fold >= 0).all():
            return fold
    return None
