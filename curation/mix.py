"""`mix`: attributes + rules → an arm, a manifest of the kept documents, without running any tagger.

The arm directory holds `manifest.yaml` (the schema of `rungs.data.manifest`: `ladder data prepare` and
every other reader of manifests take it), `data/<source>/<unit>.jsonl.gz` (the kept documents of each
training file with their original ids, and a `weight` where a rule weights: the diversity weights measured over
the arm's kept documents, `curation.arm_weights`), `removed/<rule>.npz` (which
documents each rule removed, for `ladder data inspect`) and `arm.json` (the rules, the counts). Shares stay
the curated manifest's; held-out sets are never curated: the arm's `eval` names the original files by
their path from the arm, or URL. A directory that is not empty and holds no `arm.json` is refused.

Mixing again into an arm replaces what the last mix wrote there and nothing else: `arm.json` lists the files
a mix wrote, and a rejected mix (bad rules, a source left empty) writes nothing. The new files are written
under `.mix-staging/` first and moved into place after; while they move, `arm.json` says `incomplete` and
lists the old and new files, so a crash there leaves an arm the next mix replaces whole and that
`ladder data inspect` refuses.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import math
import os
import re
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import yaml

from curation.arm_weights import kept_diversity_weights
from curation.rules import FILTER_ORDER, RULE_ATTRIBUTES, Rules, check_sources
from curation.store import Store, read_npz, units_of, write_npz
from rungs.data.atomic import atomic_write_bytes, atomic_write_json
from rungs.data.errors import DataInputError
from rungs.data.manifest import load_manifest
from rungs.data.relocation import relative_to_dir
from rungs.data.storage import RemoteFile

log = logging.getLogger("curation")
ARM_META = "arm.json"


STAGING = ".mix-staging"


def _check_arm_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DataInputError("exists and is not a directory", where=str(out), field="--out")
    # a staging folder alone is what a mix that crashed before its first arm.json leaves
    if out.is_dir() and any(p.name != STAGING for p in out.iterdir()) and not (out / ARM_META).is_file():
        raise DataInputError("is not empty and holds no arm.json: refusing to write into a directory mix did not "
                             "create (choose an empty or new --out)", where=str(out), field="--out")


def missing_attributes(meta: dict, rules: Rules) -> list[tuple[str, str]]:
    """(rule, tagger) for each rule whose attribute set no finished tagger wrote."""
    from curation.pipeline import producer_of

    have = {s for t in meta["taggers"].values() if t.get("done") for s in t.get("attributes", {})}
    return [(r, producer_of(RULE_ATTRIBUTES[r])) for r in rules.active()
            if r in RULE_ATTRIBUTES and RULE_ATTRIBUTES[r] not in have]


def mix(curation_dir: str | Path, rules: Rules, out: str | Path, *, rules_path: str = "rules") -> dict:
    store, out = Store(Path(curation_dir)), Path(out)
    meta = store.meta()
    missing = missing_attributes(meta, rules)
    if missing:
        rule, tagger = missing[0]
        raise DataInputError(f"needs the attributes of the `{tagger}` tagger, which this curation has not run: "
                             f"ladder data curate {store.manifest_path(meta)} --out {store.root} --taggers {tagger}",
                             where=rules_path, field=rule)
    manifest = load_manifest(store.manifest_path(meta))
    if manifest.content_hash() != meta["manifest_key"]:
        raise DataInputError("the manifest or its files changed since they were curated: curate again into a new "
                             "directory", where=str(manifest.path))
    sources = [ds.name for ds in manifest.sources]
    check_sources(rules, sources, rules_path)
    _check_arm_dir(out)
    units = units_of(manifest)
    keep, steps, index = _decide(store, units, rules, sources)
    kept_per_source = {s: {"docs": 0, "bytes": 0} for s in sources}
    for unit in units:
        kept_per_source[unit.source]["docs"] += int(keep[unit.name].sum())
        kept_per_source[unit.source]["bytes"] += int(index[unit.name]["bytes"][keep[unit.name]].sum())
    empty = [s for s, k in kept_per_source.items() if not k["docs"]]
    if empty:
        raise DataInputError(f"the rules keep no document of source(s) {empty}; an arm needs every source",
                             where=rules_path)
    staging, created = out / STAGING, not out.exists()
    if staging.exists():
        shutil.rmtree(staging)  # a crashed mix's own leftovers
    try:
        written = _write_files(store, units, keep, steps, rules, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    _replace_files(out, staging, written)
    _write_manifest(out, manifest, rules)
    payload = {"curation": str(store.root.resolve()), "curation_relative": relative_to_dir(store.root, out),
               "manifest": str(out / "manifest.yaml"),
               "rules": rules.model_dump(exclude_none=True), "steps": steps, "kept": kept_per_source,
               "files": written}
    atomic_write_json(out / ARM_META, payload)
    return payload


def _write_files(store: Store, units, keep: dict[str, np.ndarray], steps: list[dict], rules: Rules,
                 root: Path) -> list[str]:
    """The arm's removed/ and data/ files under `root`; their paths relative to it."""
    written = []
    for step in steps:
        unit_no, rows = step.pop("removed_rows")
        write_npz(root / "removed" / f"{step['rule']}.npz", unit=unit_no, row=rows)
        written.append(f"removed/{step['rule']}.npz")
    weights = kept_diversity_weights(store, units, keep) if rules.diversity else {}
    for unit in units:
        mask = keep[unit.name]
        if not mask.any():
            continue
        index = read_npz(store.unit_index(unit.name))
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
            for row, doc in enumerate(unit.documents()):
                if doc.doc_id != index["id"][row]:
                    raise DataInputError(f"document {row} is {doc.doc_id!r}, curated as {index['id'][row]!r}: the "
                                         "file changed since it was curated", where=str(unit.file))
                if mask[row]:
                    record = {"id": doc.doc_id, "text": doc.text}
                    if rules.diversity:
                        record["weight"] = float(weights[unit.name][row])
                    gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
        rel = f"data/{unit.source}/{unit.name}.jsonl.gz"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(root / rel, buf.getvalue())
        written.append(rel)
    return written


# What a mix names its files (for an arm.json written before arms listed their files).
_OWN_FILE = re.compile(r"data/(?P<source>[^/]+)/(?P=source)-\d{5}\.jsonl\.gz|removed/(%s)\.npz" % "|".join(FILTER_ORDER))


def _own_files(out: Path) -> list[str]:
    """The files the last mix into `out` wrote (relative paths): arm.json's list, else mix's own file names."""
    meta = out / ARM_META
    if not meta.is_file():
        return []
    try:
        listed = json.loads(meta.read_text()).get("files")
    except (OSError, ValueError):
        listed = None
    if isinstance(listed, list):
        return [f for f in listed if isinstance(f, str) and _OWN_FILE.fullmatch(f)]
    return sorted(p.relative_to(out).as_posix() for p in [*out.glob("data/*/*.jsonl.gz"), *out.glob("removed/*.npz")]
                  if _OWN_FILE.fullmatch(p.relative_to(out).as_posix()))


def _replace_files(out: Path, staging: Path, written: list[str]) -> None:
    """Move the staged files into `out` in place of the last mix's; other files in `out` are left alone."""
    old = _own_files(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / ARM_META, {"incomplete": True, "files": sorted(set(old) | set(written))})
    for rel in set(old) - set(written):
        (out / rel).unlink(missing_ok=True)
    for rel in written:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, out / rel)
    shutil.rmtree(staging)
    for folder in ("data", "removed"):  # folders the old files leave empty
        for sub in sorted((out / folder).glob("*"), reverse=True):
            if sub.is_dir() and not any(sub.iterdir()):
                sub.rmdir()


def _decide(store: Store, units, rules: Rules,
            sources: list[str]) -> tuple[dict[str, np.ndarray], list[dict], dict[str, dict[str, np.ndarray]]]:
    """Per unit the kept mask; per filter step and source the documents and bytes it removed; per unit its index."""
    index = {u.name: read_npz(store.unit_index(u.name)) for u in units}
    keep = {u.name: np.ones(len(index[u.name]["uid"]), dtype=bool) for u in units}
    steps = []
    for rule in FILTER_ORDER:
        if getattr(rules, rule) is None:
            continue
        before = {u.name: keep[u.name].copy() for u in units}
        if rule == "quality":
            for q in rules.quality_rules():
                for source in q.sources(sources):
                    _keep_top(store, [u for u in units if u.source == source], index, keep, q.keep_top)
        elif rule == "subsample":
            for source in sources:
                _keep_smallest_uids([u for u in units if u.source == source], index, keep, rules.subsample)
        else:
            _keep_one_per_cluster(store, RULE_ATTRIBUTES[rule], units, index, keep)
        removed_rows = {u.name: np.flatnonzero(before[u.name] & ~keep[u.name]) for u in units}
        per_source = {s: {"docs_in": 0, "bytes_in": 0, "docs_removed": 0, "bytes_removed": 0} for s in sources}
        for u in units:
            b = index[u.name]["bytes"]
            ps = per_source[u.source]
            ps["docs_in"] += int(before[u.name].sum())
            ps["bytes_in"] += int(b[before[u.name]].sum())
            ps["docs_removed"] += len(removed_rows[u.name])
            ps["bytes_removed"] += int(b[removed_rows[u.name]].sum())
        steps.append({"rule": rule, "sources": per_source})
        unit_no = np.concatenate([np.full(len(removed_rows[u.name]), k, dtype=np.int32) for k, u in enumerate(units)])
        rows = np.concatenate([removed_rows[u.name] for u in units]).astype(np.int32)
        steps[-1]["removed_rows"] = (unit_no, rows)
    return keep, steps, index


def _keep_one_per_cluster(store: Store, tagger: str, units, index, keep) -> None:
    """keep_one over what the rules before kept: of each duplicate cluster's still-kept documents, the
    tagger's choice if it is among them, else the one with the smallest uid. The tagger chose over every
    document, so its choice alone could be a document an earlier rule removed (near keeps the smallest uid,
    semantic the farthest from its centroid): the cluster would lose every copy. Clusters span units and
    sources (their ids are uids), so the choice is made over all of them at once."""
    attrs = [read_npz(store.attributes(tagger, u.name)) for u in units]
    cluster = np.concatenate([a["cluster"] for a in attrs])
    chosen = np.concatenate([a["keep"] for a in attrs])
    alive = np.concatenate([keep[u.name] for u in units])
    uid = np.concatenate([index[u.name]["uid"] for u in units])
    new = alive & chosen
    orphans = np.flatnonzero(alive & ~chosen & ~np.isin(cluster, cluster[new]))
    if len(orphans):  # clusters whose chosen document an earlier rule removed: their smallest surviving uid
        order = orphans[np.lexsort((uid[orphans], cluster[orphans]))]
        first = np.r_[True, cluster[order[1:]] != cluster[order[:-1]]]
        new[order[first]] = True
    start = 0
    for u in units:
        n = len(keep[u.name])
        keep[u.name] &= new[start:start + n]
        start += n


def _keep_top(store: Store, units, index, keep, fraction: float) -> None:
    """Keep the `fraction` of the still-kept documents of these units with the highest scores (ties: smaller uid)."""
    score = np.concatenate([read_npz(store.attributes("quality", u.name))["score"] for u in units])
    uid = np.concatenate([index[u.name]["uid"] for u in units])
    _keep_first(units, keep, (uid, -score), fraction)


def _keep_smallest_uids(units, index, keep, fraction: float) -> None:
    """Keep the `fraction` of the still-kept documents of these units with the smallest uids: a uid is a hash of
    the document's id, so this is a uniform random sample, the same on every run and for any file layout."""
    _keep_first(units, keep, (np.concatenate([index[u.name]["uid"] for u in units]),), fraction)


def kept_count(fraction: float, n: int) -> int:
    """ceil(fraction·n), with `fraction` read as the decimal the rules file wrote: in binary floating point
    0.07 * 100 is 7.000000000000001, whose ceiling would keep 8 documents of 100."""
    return math.ceil(Decimal(repr(float(fraction))) * n)


def _keep_first(units, keep, sort_keys: tuple[np.ndarray, ...], fraction: float) -> None:
    """Of the still-kept documents of these units (concatenated in order), keep the first ceil(fraction·n) in
    `np.lexsort(sort_keys)` order (the last key primary); the rest are dropped from `keep`."""
    if not units:
        return
    alive = np.concatenate([keep[u.name] for u in units])
    candidates = np.flatnonzero(alive)
    order = candidates[np.lexsort(tuple(k[candidates] for k in sort_keys))]
    new = np.zeros(len(alive), dtype=bool)
    new[order[:kept_count(fraction, len(candidates))]] = True
    start = 0
    for u in units:
        n = len(keep[u.name])
        keep[u.name] &= new[start:start + n]
        start += n


def _write_manifest(out: Path, manifest, rules: Rules) -> None:
    def where(f) -> str:  # a local file relative to the arm (as a manifest's paths are): the two may move together
        return f.url if isinstance(f, RemoteFile) else relative_to_dir(f, out)

    doc = {"name": f"{manifest.name}-{rules.name or 'arm'}",
           "description": f"arm of {relative_to_dir(manifest.path, out)} ({', '.join(rules.active()) or 'no rule'})",
           "sources": [{"name": ds.name, "domain": ds.domain, "share": ds.share,
                        "files": [f"data/{ds.name}/*.jsonl.gz"]} for ds in manifest.sources],
           "eval": [{"name": ds.name, "domain": ds.domain, "files": [where(f) for f in ds.files],
                     "text_field": ds.text_field, "id_field": ds.id_field} for ds in manifest.eval_sets],
           "decontamination": {"ngram_words": manifest.ngram_words}}
    atomic_write_bytes(out / "manifest.yaml", yaml.safe_dump(doc, sort_keys=False).encode())
