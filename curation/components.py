"""Connected components of a duplicate graph on partitioned edge files, with no step that sees the whole graph.

The algorithm is the large-star / small-star alternation of Kiveris et al., "Connected Components in
MapReduce and Beyond" (SoCC 2014): every step is a group-by on a node over the edges of one partition
(edges are stored in both directions, partitioned by `src % partitions`), so one Ray task per partition
does it in memory proportional to its partition. Large-star links every larger neighbour of a node to the
smallest node of its neighbourhood; small-star links a node and its smaller neighbours to the smallest of
them. Alternated, they reach a fixed point in O(log^2 n) rounds where every component is a star around its
smallest node: that node's uid is the component's cluster id, and `keep_one` keeps it. The driver only
compares per-partition digests of the edge sets (one integer each) to detect the fixed point.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from curation.ids import splitmix64
from curation.store import Store, read_npz, read_parts, write_npz

MAX_ROUNDS = 64
_MOD = 1 << 64


def group_min(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted unique (src, dst) edges and, per edge, the smallest node of its src's closed neighbourhood."""
    edges = np.unique(np.stack([src, dst], axis=1), axis=0) if len(src) else np.zeros((0, 2), dtype=np.int64)
    src, dst = edges[:, 0], edges[:, 1]
    if not len(src):
        return src, dst, src.copy()
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    first = np.minimum(np.minimum.reduceat(dst, starts), src[starts])
    return src, dst, np.repeat(first, np.diff(np.r_[starts, len(src)]))


def large_star(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (v, m(u)) for every larger neighbour v of u, m(u) the smallest of u's closed neighbourhood."""
    src, dst, m = group_min(src, dst)
    sel = dst > src
    return dst[sel], m[sel]


def small_star(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (v, m) for u and each smaller neighbour v of u, m the smallest of them."""
    sel = dst < src
    src, dst, m = group_min(src[sel], dst[sel])
    nodes = np.concatenate([dst, np.unique(src)])
    mins = np.concatenate([m, m[np.r_[True, src[1:] != src[:-1]]] if len(src) else m])
    keep = nodes != mins
    return nodes[keep], mins[keep]


def digest(src: np.ndarray, dst: np.ndarray) -> int:
    """An order-free 64-bit digest of a set of edges (the caller passes unique edges)."""
    with np.errstate(over="ignore"):
        h = splitmix64(src.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + splitmix64(dst.astype(np.uint64)))
    return int(h.sum(dtype=np.uint64))


def edge_dir(store: Store, tagger: str, round_: int, partition: int) -> Path:
    return store.work(tagger) / "cc" / f"r{round_:03d}" / f"p{partition:05d}"


def write_edges(store: Store, tagger: str, round_: int, writer: str, a: np.ndarray, b: np.ndarray,
                partitions: int) -> None:
    """Undirected edges (a, b) in both directions, each in the partition of its src."""
    src, dst = np.concatenate([a, b]), np.concatenate([b, a])
    part = src % partitions
    for p in range(partitions):
        sel = part == p
        if sel.any():
            write_npz(edge_dir(store, tagger, round_, p) / f"{writer}.npz", src=src[sel], dst=dst[sel])


def read_edges(store: Store, tagger: str, round_: int, partition: int) -> tuple[np.ndarray, np.ndarray]:
    d = edge_dir(store, tagger, round_, partition)
    parts = read_parts(sorted(d.glob("*.npz")) if d.is_dir() else [], ("src", "dst"), (np.int64, np.int64))
    return parts["src"], parts["dst"]


def star_step(root: str, tagger: str, round_: int, partition: int, partitions: int) -> dict:
    """One partition of one step (large-star on even rounds, small-star on odd): reads round `round_`,
    writes round `round_ + 1`; returns the digest of the edges it read."""
    store = Store(Path(root))
    src, dst = read_edges(store, tagger, round_, partition)
    edges = np.unique(np.stack([src, dst], axis=1), axis=0) if len(src) else np.zeros((0, 2), dtype=np.int64)
    a, b = (large_star if round_ % 2 == 0 else small_star)(edges[:, 0], edges[:, 1])
    write_edges(store, tagger, round_ + 1, f"p{partition:05d}", a, b, partitions)
    return {"digest": digest(edges[:, 0], edges[:, 1]), "edges": int(len(edges))}


def component_labels(root: str, tagger: str, round_: int, partition: int, partitions: int) -> dict:
    """At the fixed point: every node of this partition with its cluster (the smallest node of its star),
    joined with where the node lives (the node registry) and written per unit; returns the histogram of
    component sizes of the stars rooted here."""
    store = Store(Path(root))
    src, dst, m = group_min(*read_edges(store, tagger, round_, partition))
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]]) if len(src) else np.zeros(0, dtype=np.int64)
    nodes, label = src[starts], m[starts]
    degree = np.diff(np.r_[starts, len(src)])
    roots = nodes == label
    sizes, counts = np.unique(degree[roots] + 1, return_counts=True)
    reg_dir = store.work(tagger) / "nodes" / f"p{partition:05d}"
    reg = read_parts(sorted(reg_dir.glob("*.npz")) if reg_dir.is_dir() else [], ("uid", "unit", "row"),
                     (np.int64, np.int32, np.int32))
    _, first = np.unique(reg["uid"], return_index=True)
    uid, unit, row = reg["uid"][first], reg["unit"][first], reg["row"][first]
    pos = np.searchsorted(nodes, uid)
    pos = np.minimum(pos, max(len(nodes) - 1, 0))
    found = (nodes[pos] == uid) if len(nodes) else np.zeros(len(uid), dtype=bool)
    cluster = np.where(found, label[pos] if len(nodes) else uid, uid)
    for u in np.unique(unit):
        sel = unit == u
        write_npz(store.work(tagger) / "labels" / f"u{int(u):05d}" / f"p{partition:05d}.npz", row=row[sel],
                  cluster=cluster[sel])
    return {"sizes": {str(int(s)): int(c) for s, c in zip(sizes, counts)}}


def cluster_attributes(root: str, tagger: str, unit: str, unit_idx: int) -> dict:
    """attributes/<tagger>/<unit>.npz: `cluster` (the uid of the kept document of the document's cluster; its
    own uid when it has no duplicate) and `keep` (keep_one's choice: the cluster's smallest uid)."""
    store = Store(Path(root))
    index = read_npz(store.unit_index(unit))
    uid, n_bytes = index["uid"], index["bytes"]
    cluster = uid.copy()
    label_dir = store.work(tagger) / "labels" / f"u{unit_idx:05d}"
    for path in sorted(label_dir.glob("*.npz")) if label_dir.is_dir() else []:
        part = read_npz(path)
        cluster[part["row"]] = part["cluster"]
    keep = cluster == uid
    write_npz(store.attributes(tagger, unit), cluster=cluster, keep=keep)
    return {"docs": int(len(uid)), "removed_docs": int((~keep).sum()), "removed_bytes": int(n_bytes[~keep].sum()),
            "bytes": int(n_bytes.sum())}
