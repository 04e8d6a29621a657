"""Taggers over models: topic bucket, semantic-duplicate cluster, diversity weight (embeddings) and quality
score (a classifier), wired into the pipeline as stages of per-file and per-partition tasks.

- embed (per file): `curation.embedding.embed_texts` of every document, kept in work/embed/<unit>.npy.
- topics: `curation.topics.fit_topics` on a sample of documents chosen by uid (those whose uid is below a
  fraction of the uid range: the same sample for any split or worker count, at most `sample_size` rows in the
  driver), then `assign_topics` per file → attributes/topics (`topic`, int32).
- semantic: embeddings shuffled into partitions by topic (a topic never spans partitions), then per partition
  `curation.semantic.semantic_duplicates` (SemDeDup within each topic) and `diversity_weights` → attributes/
  semantic (`cluster`, `keep`) and attributes/diversity (`weight`). The weights take one corpus-wide scale
  (`diversity_scale`: the median positive spread and the mean clipped ratio, from every document's spread in
  one task after the partitions), so a weight does not depend on how the topics were partitioned.
- quality: `curation.quality.train_quality_classifier` on documents of the sources named as positives and
  negatives (the first `quality_docs` of each source, in file order), or a saved model; `score` per file
  → attributes/quality (`score`, probability of looking like the positives; a document the classifier was
  trained on, or a near-copy of one, is scored by the fold model that did not see it, so a `keep_top` over a
  training source does not rank by training membership). The classifier is trained (or copied) once, into
  work/quality/model, and a resumed run scores with that one; `check_quality_sources` refuses sources it could
  not be trained on before any tagger runs.

`ModelOptions` leaves a setting unset (None, or no sources) where the caller did not give it: `curate` takes
the one the directory was tagged with, else the default (`curation.pipeline.resolve_settings`).
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from curation.ids import UID_MASK
from curation.store import Store, Unit, read_npz, read_parts, write_npz, write_unit_index
from rungs.data.atomic import atomic_write_bytes
from rungs.data.errors import DataInputError

log = logging.getLogger("curation")


@dataclass(frozen=True)
class ModelOptions:
    n_topics: int | None = None  # default: about one topic per 50 documents, between 1 and 100
    topic_sample_size: int = 100_000
    seed: int = 0
    semantic_eps: float | None = None  # default: curation.semantic.DEFAULT_EPS (0.01)
    quality_positive: tuple[str, ...] = ()
    quality_negative: tuple[str, ...] = ()
    quality_model: str | None = None
    quality_docs: int = 2000

    def __post_init__(self) -> None:
        if self.n_topics is not None and self.n_topics < 1:
            raise DataInputError(f"must be at least 1, got {self.n_topics}", field="--topics")
        if self.semantic_eps is not None and not 0.0 <= self.semantic_eps < 2.0:  # NaN included
            raise DataInputError(f"must be in [0, 2) (duplicates have cosine >= 1 - eps), got {self.semantic_eps}",
                                 field="--semantic-eps")

    @property
    def quality_configured(self) -> bool:
        return bool(self.quality_model or (self.quality_positive and self.quality_negative))


def _save_npy(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())


def embed(root: str, unit: Unit) -> dict:
    from curation.embedding import embed_texts

    store = Store(Path(root))
    docs = list(unit.documents())
    write_unit_index(store, unit, docs)
    _save_npy(store.work("embed") / f"{unit.name}.npy", embed_texts([d.text for d in docs]))
    return {"docs": len(docs)}


def embeddings(store: Store, unit: str) -> np.ndarray:
    return np.load(store.work("embed") / f"{unit}.npy", allow_pickle=False)


def topic_sample(root: str, unit: str, uid_cut: int) -> dict:
    store = Store(Path(root))
    uid = read_npz(store.unit_index(unit))["uid"]
    sel = uid < uid_cut
    write_npz(store.work("topics") / "sample" / f"{unit}.npz", uid=uid[sel], x=embeddings(store, unit)[sel])
    return {"sampled": int(sel.sum())}


def assign(root: str, unit: str, unit_idx: int, partitions: int) -> dict:
    from curation.topics import assign_topics

    store = Store(Path(root))
    centroids = np.load(store.work("topics") / "centroids.npy", allow_pickle=False)
    x = embeddings(store, unit)
    topic = assign_topics(x, centroids)
    write_npz(store.attributes("topics", unit), topic=topic)
    index = read_npz(store.unit_index(unit))
    part = topic % partitions
    for p in np.unique(part):
        sel = part == p
        write_npz(store.work("semantic") / "by_topic" / f"p{int(p):05d}" / f"{unit}.npz", uid=index["uid"][sel],
                  unit=np.full(int(sel.sum()), unit_idx, dtype=np.int32), row=np.flatnonzero(sel).astype(np.int32),
                  topic=topic[sel], x=x[sel])
    return {"topics": {str(int(t)): int(c) for t, c in zip(*np.unique(topic, return_counts=True))}}


def semantic_partition(root: str, partition: int, eps: float) -> dict:
    from curation.semantic import neighbour_spread, semantic_duplicates

    store = Store(Path(root))
    d = store.work("semantic") / "by_topic" / f"p{partition:05d}"
    e = read_parts(sorted(d.glob("*.npz")) if d.is_dir() else [], ("uid", "unit", "row", "topic", "x"),
                   (np.int64, np.int32, np.int32, np.int32, np.float32))
    if not len(e["uid"]):
        return {"docs": 0, "removed": 0}
    centroids = np.load(store.work("topics") / "centroids.npy", allow_pickle=False)
    order = np.argsort(e["uid"], kind="stable")  # the same order for any split: the results do not depend on it
    e = {k: v[order] for k, v in e.items()}
    ids = [f"{u:016x}" for u in e["uid"].tolist()]  # fixed width: string order is uid order
    cluster, keep = semantic_duplicates(ids, e["x"], e["topic"], centroids, eps)
    spread = neighbour_spread(e["x"], e["topic"], centroids)  # whole topics per partition: any split, one spread
    for u in np.unique(e["unit"]):
        sel = e["unit"] == u
        write_npz(store.work("semantic") / "labels" / f"u{int(u):05d}" / f"p{partition:05d}.npz", row=e["row"][sel],
                  cluster=cluster[sel], keep=keep[sel], spread=spread[sel])
    return {"docs": int(len(keep)), "removed": int((~keep).sum())}


def diversity_scale(root: str) -> dict:
    """The diversity weights' corpus-wide scale (`curation.semantic.spread_scale`) from every document's
    spread: one task after the partitions, so a weight does not depend on how the topics were partitioned."""
    from curation.semantic import spread_scale

    labels = sorted((Store(Path(root)).work("semantic") / "labels").glob("u*/p*.npz"))
    spread = np.concatenate([read_npz(p)["spread"] for p in labels]) if labels else np.zeros(0)
    return {"scale": spread_scale(spread)}


def semantic_attributes(root: str, unit: str, unit_idx: int, scale: dict | None) -> dict:
    from curation.semantic import weights_from_spread

    store = Store(Path(root))
    index = read_npz(store.unit_index(unit))
    n = len(index["uid"])
    cluster, keep, spread = index["uid"].copy(), np.ones(n, dtype=bool), np.full(n, np.nan)
    d = store.work("semantic") / "labels" / f"u{unit_idx:05d}"
    for path in sorted(d.glob("*.npz")) if d.is_dir() else []:
        p = read_npz(path)
        cluster[p["row"]], keep[p["row"]], spread[p["row"]] = p["cluster"], p["keep"], p["spread"]
    write_npz(store.attributes("semantic", unit), cluster=cluster, keep=keep)
    write_npz(store.attributes("diversity", unit), weight=weights_from_spread(spread, scale))
    return {"docs": n, "removed_docs": int((~keep).sum()), "removed_bytes": int(index["bytes"][~keep].sum()),
            "bytes": int(index["bytes"].sum())}


def score(root: str, unit: Unit) -> dict:
    from curation.quality import QualityModel

    store = Store(Path(root))
    model = QualityModel.load(store.work("quality") / "model")
    docs = list(unit.documents())
    write_unit_index(store, unit, docs)
    s = model.score([d.text for d in docs])
    write_npz(store.attributes("quality", unit.name), score=s)
    return {"docs": len(docs), "mean_score": float(s.mean()) if len(s) else 0.0}


def run_topics(ctx) -> dict:
    from curation.topics import fit_topics

    opts: ModelOptions = ctx.model_options
    root = str(ctx.store.root)
    embedded = ctx.run_stage("embed", embed, [(u.name, (root, u)) for u in ctx.units])
    total = sum(r["docs"] for r in embedded.values())
    fraction = min(1.0, opts.topic_sample_size / max(total, 1))
    uid_cut = int(fraction * UID_MASK) + (1 if fraction >= 1.0 else 0)
    ctx.run_stage("topics.sample", topic_sample, [(u.name, (root, u.name, uid_cut)) for u in ctx.units])
    n_topics = opts.n_topics or max(1, min(100, total // 50))
    centroids_path = ctx.store.work("topics") / "centroids.npy"
    if not centroids_path.is_file():
        parts = sorted((ctx.store.work("topics") / "sample").glob("*.npz"))
        s = read_parts(parts, ("uid", "x"), (np.int64, np.float32))
        order = np.argsort(s["uid"], kind="stable")
        sample = s["x"][order]
        if len(sample) < n_topics:
            raise DataInputError(f"{n_topics} topics need at least as many documents, the sample has {len(sample)}",
                                 field="--topics")
        _save_npy(centroids_path, fit_topics(sample, n_topics, opts.seed))
    assigned = ctx.run_stage("topics.assign", assign, ctx.per_unit(ctx.partitions))
    sizes: dict[str, int] = {}
    for r in assigned.values():
        for t, c in r["topics"].items():
            sizes[t] = sizes.get(t, 0) + c
    return {"docs": total, "n_topics": n_topics, "topic_sizes": dict(sorted(sizes.items(), key=lambda kv: int(kv[0])))}


def run_semantic(ctx) -> dict:
    from curation.semantic import DEFAULT_EPS

    eps = DEFAULT_EPS if ctx.model_options.semantic_eps is None else ctx.model_options.semantic_eps
    parts = ctx.run_stage("semantic.partitions", semantic_partition, ctx.per_partition(eps))
    scale = ctx.run_stage("semantic.scale", diversity_scale, [("all", (str(ctx.store.root),))])["all"]["scale"]
    attrs = ctx.run_stage("semantic.attributes", semantic_attributes, ctx.per_unit(scale))
    return {"docs": sum(r["docs"] for r in parts.values()), "eps": eps, "units": attrs}


def check_quality_sources(manifest, units: list[Unit], opts: ModelOptions) -> None:
    """Refuses, before any tagger runs, positives or negatives the classifier cannot be trained on: a source
    the manifest does not name, or too few documents on one side to hold out a fifth and train on the rest
    (it reads at most that many documents of each source). Nothing to check with a saved model."""
    from curation.quality import HELDOUT_FRACTION, min_documents

    if opts.quality_model:
        return
    names = {ds.name for ds in manifest.sources}
    need = min_documents(HELDOUT_FRACTION)
    for flag, chosen in (("--quality-positive", opts.quality_positive), ("--quality-negative", opts.quality_negative)):
        if set(chosen) - names:
            raise DataInputError(f"unknown source(s) {sorted(set(chosen) - names)}; the manifest's: {sorted(names)}",
                                 field=flag)
        have = len(_first_docs(units, chosen, min(need, opts.quality_docs)))
        if have < need:
            which = f"source {chosen[0]} has" if len(chosen) == 1 else f"sources {', '.join(chosen)} have"
            raise DataInputError(f"{which} {have} document{'s' if have != 1 else ''}: the quality classifier needs "
                                 f"at least {need} on each side (it holds out {HELDOUT_FRACTION:.0%} of them to "
                                 "measure its AUC and trains on the rest)", field=flag)


def run_quality(ctx) -> dict:
    from curation.quality import META_FILE, QualityModel, train_quality_classifier

    opts: ModelOptions = ctx.model_options
    if not opts.quality_configured:
        raise DataInputError("the quality tagger needs a classifier: --quality-model DIR, or --quality-positive "
                             "SOURCES and --quality-negative SOURCES to train one", field="--taggers")
    model_dir = ctx.store.work("quality") / "model"
    if (model_dir / META_FILE).is_file():  # a resumed run: the classifier it began with (its settings are fixed)
        model = QualityModel.load(model_dir)
    elif opts.quality_model:
        model = QualityModel.load(opts.quality_model)
        model.save(model_dir)
    else:  # the sources were checked before any tagger ran (check_quality_sources, from curate)
        model = train_quality_classifier(_first_docs(ctx.units, opts.quality_positive, opts.quality_docs),
                                         _first_docs(ctx.units, opts.quality_negative, opts.quality_docs), opts.seed)
        model.save(model_dir)
    scored = ctx.run_stage("quality.score", score, [(u.name, (str(ctx.store.root), u)) for u in ctx.units])
    return {"docs": sum(r["docs"] for r in scored.values()), "heldout_auc": model.heldout_auc,
            "positive": list(opts.quality_positive), "negative": list(opts.quality_negative)}


def _first_docs(units: list[Unit], sources: tuple[str, ...], limit: int) -> list[str]:
    """The texts of the first `limit` documents of each of `sources`, in file order."""
    texts: list[str] = []
    for name in sources:
        taken = 0
        for unit in (u for u in units if u.source == name):
            for doc in unit.documents():
                if taken >= limit:
                    break
                texts.append(doc.text)
                taken += 1
    return texts
