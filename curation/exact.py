"""Exact duplicates: documents whose normalised text (lower-cased, whitespace runs as one space) is the same.

Each file's task hashes its documents (64-bit BLAKE2b) and shuffles (key, uid) into partitions by key;
each partition's task groups equal keys, so a cluster never spans partitions and is complete there: its id
is its smallest uid, which `keep_one` keeps. Nothing holds more than one file or one partition.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from curation.store import Store, Unit, read_parts, write_npz, write_unit_index

TAGGER = "exact"


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def text_key(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(normalise(text).encode(), digest_size=8).digest(), "little")


def scan(root: str, unit: Unit, unit_idx: int, partitions: int) -> dict:
    """Hash every document of one file; write (key, uid, unit, row) into each key's partition."""
    from curation.ids import doc_uids

    store = Store(Path(root))
    docs = list(unit.documents())
    write_unit_index(store, unit, docs)
    keys = np.fromiter((text_key(d.text) for d in docs), dtype=np.uint64, count=len(docs))
    uids = doc_uids(unit.source, [d.doc_id for d in docs])
    part = keys % np.uint64(partitions)
    rows = np.arange(len(docs), dtype=np.int32)
    for p in np.unique(part).tolist():  # only the partitions this file has entries for
        sel = part == p
        write_npz(store.work(TAGGER) / "keys" / f"p{p:05d}" / f"{unit.name}.npz", key=keys[sel], uid=uids[sel],
                  unit=np.full(int(sel.sum()), unit_idx, dtype=np.int32), row=rows[sel])
    return {"docs": len(docs), "bytes": int(sum(len(d.text.encode()) for d in docs))}


def group(root: str, partition: int) -> dict:
    """Group one partition's keys: every member of a group of two or more gets the group's smallest uid."""
    store = Store(Path(root))
    d = store.work(TAGGER) / "keys" / f"p{partition:05d}"
    e = read_parts(sorted(d.glob("*.npz")) if d.is_dir() else [], ("key", "uid", "unit", "row"),
                   (np.uint64, np.int64, np.int32, np.int32))
    order = np.lexsort((e["uid"], e["key"]))
    key, uid, unit, row = (e[n][order] for n in ("key", "uid", "unit", "row"))
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, dtype=np.int64)
    size = np.diff(np.r_[starts, len(key)])
    cluster = np.repeat(uid[starts], size)
    member_size = np.repeat(size, size)
    dup = member_size > 1
    for u in np.unique(unit[dup]):
        sel = dup & (unit == u)
        write_npz(store.work(TAGGER) / "labels" / f"u{int(u):05d}" / f"p{partition:05d}.npz", row=row[sel],
                  cluster=cluster[sel])
    sizes, counts = np.unique(size[size > 1], return_counts=True)
    return {"sizes": {str(int(s)): int(c) for s, c in zip(sizes, counts)}}
