"""The tagger pipeline: which taggers exist, the stages each runs, and running them resumably.

A tagger is a list of stages; a stage is a list of tasks (one per file or per partition), each a
module-level function run by a `Mapper` (in this process, or as Ray tasks: `ladder.run.curate`). A task
writes its completion marker in the worker, after its files, so a run killed at any point (kill -9
included) reruns only the tasks without a marker, and a tagger whose last stage finished is skipped whole.

Taggers (`TAGGERS`): `exact` (`curation.exact`), `near` (`curation.near`), and over models
(`curation.model_taggers`) `topics`, `semantic` (semantic-duplicate cluster and diversity weight) and
`quality`. A new tagger is a `TaggerSpec` whose `run(ctx)` writes `attributes/<set>/<unit>.npz` per file,
one array per attribute, rows in the file's document order; the mixer's rules name the attribute sets.

Settings (`SETTING_FLAGS`: the LSH parameters, the topic count, SemDeDup's eps, the quality classifier) are
fixed for a directory once their tagger has begun: `curate` records them in curation.json's `settings` before
the tagger's first stage. A later run takes each setting it is not given from there (else the default), and
refuses one given with another value (`resolve_settings`): resuming, adding a tagger or rerunning needs no
flags repeated, and no changed flag is silently ignored. Flags are checked before any tagger runs and before
curation.json records them (`check_inputs`): a source with no file, a `--topics` the training files are too
few for, and classifier flags that would be ignored or train nothing are refused, so a refused flag never
becomes a directory's setting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from curation import components, exact, near
from curation.minhash import LSHParams
from curation.model_taggers import ModelOptions, check_quality_sources, run_quality, run_semantic, run_topics
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


# Each tagger's settings, as curation.json's `settings` records them, and the flag that sets each.
SETTING_FLAGS: dict[str, dict[str, str]] = {
    "near": {"bands": "--bands", "rows": "--rows", "threshold": "--jaccard", "seed": "seed"},
    "topics": {"n_topics": "--topics"},
    "semantic": {"eps": "--semantic-eps"},
    "quality": {"model": "--quality-model", "positive": "--quality-positive", "negative": "--quality-negative"},
}


def default_settings() -> dict[str, dict[str, Any]]:
    from curation.semantic import DEFAULT_EPS

    lsh = LSHParams()
    return {"near": {"bands": lsh.bands, "rows": lsh.rows, "threshold": lsh.threshold, "seed": lsh.seed},
            "topics": {"n_topics": None},  # None: about one topic per 50 documents
            "semantic": {"eps": DEFAULT_EPS}, "quality": {"model": None, "positive": [], "negative": []}}


def given_settings(lsh: LSHParams | None = None, model_options: ModelOptions | None = None, *,
                   bands: int | None = None, rows: int | None = None, threshold: float | None = None
                   ) -> dict[str, dict[str, Any]]:
    """The settings a caller gave, in `SETTING_FLAGS`' shape, None where not given: all of `lsh` (or those of
    `bands`, `rows`, `threshold` given), and the `model_options` that are set."""
    o = model_options or ModelOptions()
    near_given = ({"bands": lsh.bands, "rows": lsh.rows, "threshold": lsh.threshold, "seed": lsh.seed} if lsh
                  else {"bands": bands, "rows": rows, "threshold": threshold, "seed": None})
    return {"near": near_given, "topics": {"n_topics": o.n_topics}, "semantic": {"eps": o.semantic_eps},
            "quality": {"model": str(Path(o.quality_model).resolve()) if o.quality_model else None,
                        "positive": list(o.quality_positive) or None, "negative": list(o.quality_negative) or None}}


def tagged_settings(store: Store, meta: dict) -> dict[str, dict[str, Any]]:
    """The settings of each tagger that has begun in the directory (fixed from then on)."""
    tagged = {t: dict(v) for t, v in meta.get("settings", {}).items()}
    done = meta.get("taggers", {})
    # a directory written before curation.json had `settings`: the LSH record and the finished taggers' summaries
    if "near" not in tagged and "lsh" in meta and store.marker("near.scan", "-").parent.is_dir():
        tagged["near"] = dict(meta["lsh"])
    if "topics" not in tagged and "n_topics" in done.get("topics", {}):
        tagged["topics"] = {"n_topics": done["topics"]["n_topics"]}
    if "semantic" not in tagged and "eps" in done.get("semantic", {}):
        tagged["semantic"] = {"eps": done["semantic"]["eps"]}
    if "quality" not in tagged and done.get("quality", {}).get("positive"):
        tagged["quality"] = {"model": None, "positive": done["quality"]["positive"],
                             "negative": done["quality"]["negative"]}
    if "topics" in tagged and tagged["topics"].get("n_topics") is None:  # the default count is fixed once fitted
        centroids = store.work("topics") / "centroids.npy"
        if centroids.is_file():
            tagged["topics"]["n_topics"] = int(np.load(centroids, mmap_mode="r").shape[0])
        else:
            del tagged["topics"]  # nothing depends on the count yet
    return tagged


def _describe(tagger: str, values: dict[str, Any]) -> str:
    if tagger == "near":
        return (f"--bands {values['bands']} --rows {values['rows']} --jaccard {values['threshold']} "
                f"(seed {values['seed']})")
    if tagger == "quality":
        if values.get("model"):
            return f"--quality-model {values['model']}"
        return f"--quality-positive {','.join(values['positive'])} --quality-negative {','.join(values['negative'])}"
    return " ".join(f"{SETTING_FLAGS[tagger][k]} {v}" for k, v in values.items())


def _same(given: Any, stored: Any) -> bool:
    if isinstance(given, list) and isinstance(stored, list):  # sources: the same set, in any order
        return sorted(given) == sorted(stored)
    return given == stored


def resolve_settings(store: Store, meta: dict, given: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every tagger's settings for a run into `store` (whose curation.json holds `meta`): for a tagger that has
    begun there, the ones it began with, and a setting `given` (not None) with another value is refused (a
    DataInputError naming its flag: it needs a new --out); for the others, the ones given, else the defaults."""
    tagged = tagged_settings(store, meta)
    settings = default_settings()
    for tagger, values in given.items():
        stored = tagged.get(tagger)
        for key, value in values.items():
            if value is None:
                continue
            if stored is None:
                settings[tagger][key] = value
            elif not _same(value, stored.get(key)):
                flag = SETTING_FLAGS[tagger][key]
                shown = ",".join(value) if isinstance(value, list) else value
                raise DataInputError(f"was tagged with {_describe(tagger, stored)}; {flag} {shown} needs a new --out "
                                     f"(without {flag}, curate keeps the value it was tagged with)",
                                     where=str(store.root), field=flag)
        if stored is not None:
            settings[tagger] = stored
    return settings


def _options(settings: dict[str, dict[str, Any]], model_options: ModelOptions | None) -> ModelOptions:
    q = settings["quality"]
    return replace(model_options or ModelOptions(), n_topics=settings["topics"]["n_topics"],
                   semantic_eps=settings["semantic"]["eps"], quality_model=q["model"],
                   quality_positive=tuple(q["positive"]), quality_negative=tuple(q["negative"]))


def check_sources_have_files(manifest: Manifest) -> None:
    """Refuses a training source whose `files` matched no file (a glob that matched only folders), as `prepare`
    does and with its message: its own check, on the sources with no file (it reads no scan result for those)."""
    from rungs.data.scanning import check_sets

    check_sets("train", tuple(ds for ds in manifest.sources if not ds.files), {}, str(manifest.path))


def check_quality_flags(given: ModelOptions | None, options: ModelOptions) -> None:
    """Refuses classifier flags that would be ignored or would train nothing, whichever taggers run: a saved
    classifier (`--quality-model`) given with sources to train one (it scores as it is), a source given as
    both positive and negative, and positives without negatives or the reverse. `given`: the caller's options;
    `options`: the settings resolved, where a side the caller left out is the one the directory was tagged with."""
    g = given or ModelOptions()
    if g.quality_model and (g.quality_positive or g.quality_negative):
        raise DataInputError("a saved classifier scores as it is, so --quality-positive and --quality-negative would "
                             "be ignored: give either --quality-model DIR, or --quality-positive SOURCES and "
                             "--quality-negative SOURCES to train one", field="--quality-model")
    both = sorted(set(g.quality_positive) & set(g.quality_negative))
    if both:
        raise DataInputError(f"source(s) {both} also given to --quality-positive: the classifier learns the positive "
                             "sources against the negative ones, so a source is one or the other",
                             field="--quality-negative")
    if bool(options.quality_positive) != bool(options.quality_negative):
        given_flag, missing = (("--quality-positive", "--quality-negative") if options.quality_positive
                               else ("--quality-negative", "--quality-positive"))
        raise DataInputError(f"needs {missing} SOURCES too: the quality classifier is trained on both (to score with "
                             "a saved classifier instead, give --quality-model DIR alone)", field=given_flag)


def check_topic_count(manifest: Manifest, units: list[Unit], options: ModelOptions) -> None:
    """Refuses a `--topics` the topics tagger could not fit, before it embeds anything: more topics than
    `topic_sample_size` (the most documents its sample is meant to hold) or than the training documents. It
    fits on every document when they are at most `topic_sample_size` (`run_topics`), so the documents are counted
    (as the tagger reads them) up to `n_topics`: the first ones of a large corpus, all of one too small.

    Above `topic_sample_size` documents the sample is those of the smallest uids, about that many; one a few
    short of `n_topics` is refused by the tagger itself, and `curate` then keeps no `--topics` setting."""
    n = options.n_topics
    if n is None:  # the default count: one topic per 50 documents, at least 1
        return
    where = str(manifest.path)
    if n > options.topic_sample_size:
        raise DataInputError(f"must be at most {options.topic_sample_size} (the topics are fitted on a sample of at "
                             f"most about that many documents), got {n}", where=where, field="--topics")
    have = 0
    for unit in units:
        for _ in unit.documents():
            have += 1
            if have >= n:
                return
    raise DataInputError(f"{n} topics need at least as many documents, the training files hold {have}",
                         where=where, field="--topics")


def check_inputs(manifest: Manifest, units: list[Unit], names: list[str], meta: dict, options: ModelOptions) -> None:
    """What `curate` checks before any tagger runs (and `plan_curation` before any work), for the taggers
    `names` that have not finished in the directory whose curation.json holds `meta`: the quality sources
    (`check_quality_sources`) and the topic count (`check_topic_count`)."""
    done = {n for n, t in meta.get("taggers", {}).items() if t.get("done")}
    if "quality" in names and "quality" not in done:
        check_quality_sources(manifest, units, options)
    if "topics" in names and "topics" not in done:
        check_topic_count(manifest, units, options)


def plan_curation(manifest_path: str | Path, out: str | Path, *, taggers: str | None = None, bands: int | None = None,
                  rows: int | None = None, threshold: float | None = None,
                  model_options: ModelOptions | None = None) -> tuple[list[str], LSHParams, ModelOptions]:
    """What `curate` will run, checked before any work and without writing anything: the taggers (`--taggers`
    syntax) and every setting, those not given (None; unset in `model_options`) as `out` was tagged with, else
    the defaults. A DataInputError for a given setting that `out` was tagged with otherwise, unknown taggers,
    a source with no file, classifier flags that would be ignored (`check_quality_flags`), quality sources the
    classifier cannot be trained on, and a `--topics` the training files are too few for."""
    manifest = load_manifest(manifest_path)
    store = Store(Path(out))
    meta = store.meta() if store.meta_path.is_file() else {}
    if not store.records(meta, manifest):  # another manifest's curation: `curate` refuses it (one line)
        meta = {}
    elif not any(t.get("done") for t in meta.get("taggers", {}).values()) \
            and meta.get("manifest_key") != manifest.content_hash():
        meta = {}  # edited since, with no tagger finished: `curate` starts over (Store.open_for_writing)
    check_sources_have_files(manifest)
    settings = resolve_settings(store, meta, given_settings(model_options=model_options, bands=bands, rows=rows,
                                                            threshold=threshold))
    options = _options(settings, model_options)
    check_quality_flags(model_options, options)
    names = parse_taggers(taggers, options)
    check_inputs(manifest, units_of(manifest), names, meta, options)
    return names, LSHParams(**settings["near"]), options


def curate(manifest_path: str | Path, out: str | Path, *, taggers: list[str] | None = None, partitions: int = 8,
           mapper: Mapper = local_mapper, lsh: LSHParams | None = None, model_options: ModelOptions | None = None,
           on_stage: Callable[[str, int], None] | None = None, on_task: Callable[[str], None] | None = None) -> dict:
    """Run `taggers` (all by default) over the manifest's training files into `out`; returns the summary
    that `out/curation.json` records. Held-out sets are never tagged. Settings not given (`lsh` None, unset
    `model_options`) are those `out` was tagged with, else the defaults; one given with a value other than the
    one `out` was tagged with is refused (`resolve_settings`)."""
    if isinstance(partitions, bool) or not isinstance(partitions, (int, np.integer)) or partitions < 1:
        # every key is shuffled into partition `key % partitions`: with none, no document would meet another
        raise DataInputError(f"partitions must be an int >= 1, got {partitions!r}", field="partitions")
    manifest = load_manifest(manifest_path)
    check_sources_have_files(manifest)
    store = Store(Path(out))
    meta = store.open_for_writing(manifest, manifest.content_hash())
    partitions = int(meta.get("partitions", partitions))
    settings = resolve_settings(store, meta, given_settings(lsh, model_options))
    lsh, options = LSHParams(**settings["near"]), _options(settings, model_options)
    check_quality_flags(model_options, options)
    names = parse_taggers(",".join(taggers) if taggers else None, options)
    units = units_of(manifest)
    check_inputs(manifest, units, names, meta, options)
    meta.update(partitions=partitions, lsh=dict(settings["near"]),
                units=[{"unit": u.name, "source": u.source, "file": u.spec.rel} for u in units])
    store.write_meta(meta)
    ctx = Context(store, manifest, units, partitions, mapper, lsh, options)
    if on_stage is not None:
        ctx.on_stage = on_stage
    if on_task is not None:
        ctx.on_task = on_task
    for name in names:
        if meta["taggers"].get(name, {}).get("done"):
            log.info("curate: %s already done", name)
            continue
        if name in SETTING_FLAGS:  # fixed from now on: a later run resumes with them
            meta.setdefault("settings", {})[name] = settings[name]
            store.write_meta(meta)
        try:
            summary = TAGGERS[name].run(ctx)
        except DataInputError as err:
            if name == "topics" and err.field == "--topics" and not (store.work("topics") / "centroids.npy").is_file():
                # the count did not fit the sample (`run_topics`): nothing depends on it before the centroids
                # are fitted, so it is not kept, and a rerun may give another --topics in this directory
                meta["settings"].pop("topics", None)
                store.write_meta(meta)
            raise
        if name == "topics":  # the count the default chose
            meta["settings"]["topics"]["n_topics"] = summary["n_topics"]
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
