"""The tagger pipeline: which taggers exist, the stages each runs, and running them resumably.

A tagger is a list of stages; a stage is a list of tasks (one per file or per partition), each a
module-level function run by a `Mapper` (in this process, or as Ray tasks: `ladder.run.curate`). A task
writes its completion marker in the worker, after its files, so a run killed at any point (kill -9
included) reruns only the tasks without a marker, and a tagger whose last stage finished is skipped whole.

Taggers (`TAGGERS`): `exact` (`curation.exact`), `near` (`curation.near`), and over models
(`curation.model_taggers`) `topics`, `semantic` (semantic-duplicate cluster and diversity weight) and
`quality`. A new tagger is a `TaggerSpec` whose `run(ctx)` writes `attributes/<set>/<unit>.npz` per file,
one array per attribute, rows in the file's document order; the mixer's rules name the attribute sets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from curation import components, exact, near
from curation.minhash import LSHParams
from curation.model_taggers import ModelOptions, run_quality, run_semantic, run_topics
from curation.store import Store, Unit, units_of
from rungs.data.errors import DataInputError
from rungs.data.manifest import Manifest, load_manifest

log = logging.getLogger("curation")
Mapper = Callable[[Callable, list[tuple[tuple, dict]]], Iterator]


def local_mapper(fn: Callable, calls: list[tuple[tuple, dict]]) -> Iterator:
    for args, kwargs in calls:
        yield fn(*args, **kwargs)


@dataclass
class Context:
    store: Store
    manifest: Manifest
    units: list[Unit]
    partitions: int
    mapper: Mapper = local_mapper
    lsh: LSHParams = field(default_factory=LSHParams)
    model_options: ModelOptions = field(default_factory=ModelOptions)
    on_stage: Callable[[str, int], None] = lambda stage, tasks: None
    on_task: Callable[[str], None] = lambda stage: None

    def run_stage(self, stage: str, fn: Callable, tasks: list[tuple[str, tuple]]) -> dict[str, dict]:
        """`fn(*args)` for every (task name, args) without a marker; every task's result, by name."""
        results = {name: self.store.done(stage, name) for name, _ in tasks}
        todo = [(name, args) for name, args in tasks if results[name] is None]
        self.on_stage(stage, len(tasks))
        for _ in range(len(tasks) - len(todo)):
            self.on_task(stage)
        calls = [((str(self.store.root), stage, name, fn, args), {}) for name, args in todo]
        for (name, _), result in zip(todo, self.mapper(_marked, calls)):
            results[name] = result
            self.on_task(stage)
        log.info("curate: %s: %d tasks (%d already done)", stage, len(tasks), len(tasks) - len(todo))
        return results

    def per_unit(self, *extra) -> list[tuple[str, tuple]]:
        return [(u.name, (str(self.store.root), u.name, k) + extra) for k, u in enumerate(self.units)]

    def per_partition(self, *extra) -> list[tuple[str, tuple]]:
        return [(f"p{p:05d}", (str(self.store.root), p) + extra) for p in range(self.partitions)]


def _marked(root: str, stage: str, name: str, fn: Callable, args: tuple) -> dict:
    result = fn(*args)
    Store(Path(root)).mark(stage, name, result)
    return result


def merge_sizes(results: dict[str, dict]) -> dict[str, int]:
    total: dict[str, int] = {}
    for r in results.values():
        for size, count in r.get("sizes", {}).items():
            total[size] = total.get(size, 0) + count
    return dict(sorted(total.items(), key=lambda kv: int(kv[0])))


def run_exact(ctx: Context) -> dict:
    root = str(ctx.store.root)
    scanned = ctx.run_stage("exact.scan", exact.scan,
                            [(u.name, (root, u, k, ctx.partitions)) for k, u in enumerate(ctx.units)])
    grouped = ctx.run_stage("exact.group", exact.group, ctx.per_partition())
    attrs = ctx.run_stage("exact.attributes", components.cluster_attributes,
                          [(u.name, (root, exact.TAGGER, u.name, k)) for k, u in enumerate(ctx.units)])
    return {"docs": sum(r["docs"] for r in scanned.values()), "cluster_sizes": merge_sizes(grouped),
            "units": attrs}


def run_near(ctx: Context) -> dict:
    root, lsh = str(ctx.store.root), ctx.lsh
    ctx.run_stage("near.scan", near.scan, [(u.name, (root, u, k, ctx.partitions, lsh)) for k, u in enumerate(ctx.units)])
    cands = ctx.run_stage("near.candidates", near.candidates, ctx.per_partition())
    ctx.run_stage("near.attach", near.attach, ctx.per_unit())
    verified = ctx.run_stage("near.verify", near.verify, ctx.per_unit(ctx.partitions, lsh.threshold))
    round_, previous = 0, None
    while True:
        if round_ >= 2 * components.MAX_ROUNDS:
            raise RuntimeError(f"connected components did not converge in {components.MAX_ROUNDS} rounds")
        step = ctx.run_stage(f"near.cc{round_:03d}", components.star_step,
                             [(f"p{p:05d}", (root, near.TAGGER, round_, p, ctx.partitions))
                              for p in range(ctx.partitions)])
        if round_ % 2 == 0:
            state = (sum(r["digest"] for r in step.values()) % (1 << 64), sum(r["edges"] for r in step.values()))
            if state == previous:
                break
            previous = state
        round_ += 1
    labels = ctx.run_stage("near.labels", components.component_labels,
                           [(f"p{p:05d}", (root, near.TAGGER, round_, p, ctx.partitions)) for p in range(ctx.partitions)])
    attrs = ctx.run_stage("near.attributes", components.cluster_attributes,
                          [(u.name, (root, near.TAGGER, u.name, k)) for k, u in enumerate(ctx.units)])
    return {"candidates": sum(r["candidates"] for r in cands.values()),
            "verified_pairs": sum(r["verified"] for r in verified.values()),
            "cc_rounds": round_ + 1, "cluster_sizes": merge_sizes(labels), "units": attrs}


@dataclass(frozen=True)
class TaggerSpec:
    name: str
    run: Callable[[Context], dict]
    attributes: dict[str, tuple[str, ...]]  # attribute set (attributes/<set>/) -> its arrays
    help: str
    needs: tuple[str, ...] = ()  # taggers whose outputs it reads (run first, automatically)


TAGGERS: dict[str, TaggerSpec] = {
    "exact": TaggerSpec("exact", run_exact, {"exact": ("cluster", "keep")}, "exact duplicates of the normalised text"),
    "near": TaggerSpec("near", run_near, {"near": ("cluster", "keep")}, "near duplicates: MinHash LSH + exact Jaccard"),
    "topics": TaggerSpec("topics", run_topics, {"topics": ("topic",)}, "topic bucket: k-means of embeddings"),
    "semantic": TaggerSpec("semantic", run_semantic, {"semantic": ("cluster", "keep"), "diversity": ("weight",)},
                           "semantic duplicates (SemDeDup) and diversity weights (D4) within topics", ("topics",)),
    "quality": TaggerSpec("quality", run_quality, {"quality": ("score",)}, "quality score of a classifier"),
}


def producer_of(attribute_set: str) -> str:
    """The tagger that writes attributes/<attribute_set>/."""
    return next(t.name for t in TAGGERS.values() if attribute_set in t.attributes)


def parse_taggers(value: str | None, model_options: ModelOptions | None = None) -> list[str]:
    """The taggers to run, in pipeline order, with the taggers they need; by default every tagger that can run
    (quality only with a classifier to use or train)."""
    if not value:
        configured = model_options is not None and model_options.quality_configured
        return [n for n in TAGGERS if n != "quality" or configured]
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in TAGGERS]
    if unknown or not names:
        raise DataInputError(f"unknown tagger(s) {unknown}; valid: {', '.join(TAGGERS)}", field="--taggers")
    if "quality" in names and not (model_options and model_options.quality_configured):
        raise DataInputError("the quality tagger needs a classifier: --quality-model DIR, or --quality-positive "
                             "SOURCES and --quality-negative SOURCES to train one", field="--taggers")
    wanted = set(names)
    for n in names:
        wanted.update(TAGGERS[n].needs)
    return [n for n in TAGGERS if n in wanted]


def curate(manifest_path: str | Path, out: str | Path, *, taggers: list[str] | None = None, partitions: int = 8,
           mapper: Mapper = local_mapper, lsh: LSHParams | None = None, model_options: ModelOptions | None = None,
           on_stage: Callable[[str, int], None] | None = None, on_task: Callable[[str], None] | None = None) -> dict:
    """Run `taggers` (all by default) over the manifest's training files into `out`; returns the summary
    that `out/curation.json` records. Held-out sets are never tagged."""
    manifest = load_manifest(manifest_path)
    store = Store(Path(out))
    meta = store.open_for_writing(manifest, manifest.content_hash())
    partitions = int(meta.get("partitions", partitions))
    if "lsh" in meta and store.marker("near.scan", "-").parent.is_dir():  # near-duplicate tagging has begun
        stored = LSHParams(**meta["lsh"])
        if lsh is not None and lsh != stored:
            raise DataInputError(f"was tagged with bands={stored.bands}, rows={stored.rows}, jaccard={stored.threshold}, "
                                 f"seed={stored.seed}; other near-duplicate settings need a new --out",
                                 where=str(store.root), field="--out")
        lsh = stored
    lsh = lsh or LSHParams()
    units = units_of(manifest)
    meta.update(partitions=partitions, lsh={"bands": lsh.bands, "rows": lsh.rows, "threshold": lsh.threshold,
                                             "seed": lsh.seed},
                units=[{"unit": u.name, "source": u.source, "file": u.spec.rel} for u in units])
    store.write_meta(meta)
    ctx = Context(store, manifest, units, partitions, mapper, lsh, model_options or ModelOptions())
    if on_stage is not None:
        ctx.on_stage = on_stage
    if on_task is not None:
        ctx.on_task = on_task
    for name in parse_taggers(",".join(taggers) if taggers else None, model_options):
        if meta["taggers"].get(name, {}).get("done"):
            log.info("curate: %s already done", name)
            continue
        summary = TAGGERS[name].run(ctx)
        meta["taggers"][name] = dict(summary, done=True, attributes={k: list(v) for k, v in
                                                                     TAGGERS[name].attributes.items()})
        store.write_meta(meta)
        _drop_shuffles(store, name)
    return meta


def _drop_shuffles(store: Store, tagger: str) -> None:
    """A finished tagger's shuffle files (its own, bulky, never read again); the verified pairs' Jaccards stay."""
    import shutil

    for sub in {"exact": ("keys", "labels"), "near": ("shingles", "buckets", "cand", "half", "cc", "nodes", "labels")
                }.get(tagger, ()):
        shutil.rmtree(store.work(tagger) / sub, ignore_errors=True)
