"""Near duplicates at corpus scale: MinHash LSH candidates, verified by exact Jaccard, joined into clusters.

Stages, each one Ray task per file or per partition (none sees the whole corpus):
  1. scan (per file): shingle sets, signatures and band keys (`curation.minhash`); the shingle sets are kept
     for verification and (band, key, uid, unit, row) entries shuffled into partitions by key;
  2. candidates (per partition): documents that share a bucket become candidate pairs (each bucket's
     `ANCHORS` smallest uids paired with every larger member: a bucket of k near-copies gives ~3k pairs,
     not k^2/2), written next to the file of the pair's first document;
  3. attach (per file): the first document's shingle set travels with the pair to the second's file;
  4. verify (per file): exact Jaccard of the two sets; pairs at or above the threshold become edges of the
     duplicate graph (`curation.components`), and both documents are registered with their file and row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from curation.components import write_edges
from curation.minhash import LSHParams, band_keys, jaccard, shingle_sets, signatures
from curation.store import Store, Unit, read_npz, read_parts, write_npz, write_unit_index

TAGGER = "near"
ANCHORS = 3


def scan(root: str, unit: Unit, unit_idx: int, partitions: int, params: LSHParams) -> dict:
    from curation.ids import doc_uids

    store = Store(Path(root))
    docs = list(unit.documents())
    write_unit_index(store, unit, docs)
    uids = doc_uids(unit.source, [d.doc_id for d in docs])
    flat, offsets = shingle_sets([d.text for d in docs])
    write_npz(store.work(TAGGER) / "shingles" / f"{unit.name}.npz", flat=flat, offsets=offsets)
    rows = np.flatnonzero(np.diff(offsets) > 0).astype(np.int32)  # a document without a word has no signature
    sel_flat = np.concatenate([flat[offsets[r]:offsets[r + 1]] for r in rows]) if len(rows) else flat[:0]
    sel_off = np.r_[0, np.cumsum(np.diff(offsets)[rows])].astype(np.int64)
    keys = band_keys(signatures(sel_flat, sel_off, params), params)  # (n, bands)
    band = np.tile(np.arange(params.bands, dtype=np.int16), len(rows))
    key, uid, row = keys.ravel(), np.repeat(uids[rows], params.bands), np.repeat(rows, params.bands)
    part = key % np.uint64(partitions)
    for p in np.unique(part).tolist():  # only the partitions this file has entries for
        sel = part == p
        write_npz(store.work(TAGGER) / "buckets" / f"p{p:05d}" / f"{unit.name}.npz", band=band[sel], key=key[sel],
                  uid=uid[sel], unit=np.full(int(sel.sum()), unit_idx, dtype=np.int32), row=row[sel])
    return {"docs": len(docs), "bytes": int(sum(len(d.text.encode()) for d in docs))}


def bucket_pairs(starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j), i < j, within each bucket [start, start + size): i among the first ANCHORS."""
    first, second = [], []
    for s, k in zip(starts.tolist(), sizes.tolist()):
        for i in range(min(ANCHORS, k - 1)):
            first.extend([s + i] * (k - i - 1))
            second.extend(range(s + i + 1, s + k))
    return np.array(first, dtype=np.int64), np.array(second, dtype=np.int64)


def candidates(root: str, partition: int) -> dict:
    store = Store(Path(root))
    d = store.work(TAGGER) / "buckets" / f"p{partition:05d}"
    e = read_parts(sorted(d.glob("*.npz")) if d.is_dir() else [], ("band", "key", "uid", "unit", "row"),
                   (np.int16, np.uint64, np.int64, np.int32, np.int32))
    order = np.lexsort((e["uid"], e["key"], e["band"]))
    band, key, uid, unit, row = (e[n][order] for n in ("band", "key", "uid", "unit", "row"))
    new = np.r_[True, (key[1:] != key[:-1]) | (band[1:] != band[:-1])] if len(key) else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(new)
    sizes = np.diff(np.r_[starts, len(key)])
    i, j = bucket_pairs(starts[sizes > 1], sizes[sizes > 1])
    pairs = np.unique(np.stack([uid[i], uid[j], unit[i], row[i], unit[j], row[j]], axis=1).astype(np.int64), axis=0) \
        if len(i) else np.zeros((0, 6), dtype=np.int64)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]  # one document in one bucket twice cannot happen; a uid collision can
    for u in np.unique(pairs[:, 2]):
        p = pairs[pairs[:, 2] == u]
        write_npz(store.work(TAGGER) / "cand" / f"u{int(u):05d}" / f"p{partition:05d}.npz", a_uid=p[:, 0],
                  b_uid=p[:, 1], a_row=p[:, 3].astype(np.int32), b_unit=p[:, 4].astype(np.int32),
                  b_row=p[:, 5].astype(np.int32))
    return {"candidates": int(len(pairs)), "buckets_over_one": int((sizes > 1).sum())}


def attach(root: str, unit: str, unit_idx: int) -> dict:
    store = Store(Path(root))
    d = store.work(TAGGER) / "cand" / f"u{unit_idx:05d}"
    c = read_parts(sorted(d.glob("*.npz")) if d.is_dir() else [], ("a_uid", "b_uid", "a_row", "b_unit", "b_row"),
                   (np.int64, np.int64, np.int32, np.int32, np.int32))
    _, first = np.unique(np.stack([c["a_uid"], c["b_uid"]], axis=1), axis=0, return_index=True) \
        if len(c["a_uid"]) else (None, np.zeros(0, dtype=np.int64))
    c = {k: v[np.sort(first)] for k, v in c.items()}
    sh = read_npz(store.work(TAGGER) / "shingles" / f"{unit}.npz")
    flat, offsets = sh["flat"], sh["offsets"]
    for b_unit in np.unique(c["b_unit"]):
        sel = np.flatnonzero(c["b_unit"] == b_unit)
        rows = c["a_row"][sel]
        # each first document's set once per destination file, however many pairs it anchors (a bucket of
        # k copies pairs its anchors with all k)
        unique_rows, a_set = np.unique(rows, return_inverse=True)
        sets = [flat[offsets[r]:offsets[r + 1]] for r in unique_rows]
        write_npz(store.work(TAGGER) / "half" / f"u{int(b_unit):05d}" / f"u{unit_idx:05d}.npz",
                  a_uid=c["a_uid"][sel], b_uid=c["b_uid"][sel], a_row=rows, b_row=c["b_row"][sel],
                  a_unit=np.full(len(sel), unit_idx, dtype=np.int32), a_set=a_set.astype(np.int64),
                  flat=np.concatenate(sets) if sets else flat[:0], offsets=np.r_[0, np.cumsum([len(s) for s in sets])])
    return {"pairs": int(len(c["a_uid"]))}


def verify(root: str, unit: str, unit_idx: int, partitions: int, threshold: float) -> dict:
    store = Store(Path(root))
    sh = read_npz(store.work(TAGGER) / "shingles" / f"{unit}.npz")
    flat, offsets = sh["flat"], sh["offsets"]
    d = store.work(TAGGER) / "half" / f"u{unit_idx:05d}"
    a_uid, b_uid, a_unit, a_row, b_row, sims = [], [], [], [], [], []
    for path in sorted(d.glob("*.npz")) if d.is_dir() else []:
        h = read_npz(path)
        for k, j in enumerate(h["a_set"].tolist()):
            a_set = h["flat"][h["offsets"][j]:h["offsets"][j + 1]]
            r = h["b_row"][k]
            sims.append(jaccard(a_set, flat[offsets[r]:offsets[r + 1]]))
        for name, acc in (("a_uid", a_uid), ("b_uid", b_uid), ("a_unit", a_unit), ("a_row", a_row),
                          ("b_row", b_row)):
            acc.append(h[name])
    cat = [np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in (a_uid, b_uid, a_unit, a_row, b_row)]
    a_uid, b_uid, a_unit, a_row, b_row = cat
    sims_arr = np.array(sims, dtype=np.float64)
    write_npz(store.work(TAGGER) / "pairs" / f"{unit}.npz", a_uid=a_uid, b_uid=b_uid, jaccard=sims_arr)
    ok = sims_arr >= threshold
    write_edges(store, TAGGER, 0, f"u{unit_idx:05d}", a_uid[ok], b_uid[ok], partitions)
    uid = np.concatenate([a_uid[ok], b_uid[ok]])
    node_unit = np.concatenate([a_unit[ok], np.full(int(ok.sum()), unit_idx)]).astype(np.int32)
    node_row = np.concatenate([a_row[ok], b_row[ok]]).astype(np.int32)
    part = uid % partitions
    for p in np.unique(part):
        sel = part == p
        write_npz(store.work(TAGGER) / "nodes" / f"p{int(p):05d}" / f"u{unit_idx:05d}.npz", uid=uid[sel],
                  unit=node_unit[sel], row=node_row[sel])
    return {"candidates": int(len(sims_arr)), "verified": int(ok.sum())}
