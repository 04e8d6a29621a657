"""The scan stage of `prepare`: read every input once, check it, and decontaminate (both directions).

Held-out files first: every document checked, its word n-grams hashed into the held-out index; then the
training files against it. Ids are checked unique per set by 64-bit hashes (8 bytes a document in the
driver, whatever the files). Bad input stops here, before anything is written.

Segments are scanned in parallel, so a later segment of a JSONL file does not know how many lines
come before it; it reports its line count, and a segment that met a line without an id (named by
its line number) is scanned again once the lines before it are known. Files whose lines all have
ids, and every first segment, are read once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from rungs.data.decontam import DecontaminationReport, HeldOutIndex
from rungs.data.errors import DataInputError
from rungs.data.filework import Unit, id_hash, scan_unit
from rungs.data.manifest import DocumentSet, Manifest, duplicate_id
from rungs.data.segments import FilePlan
from rungs.data.workers import run_units

log = logging.getLogger("rungs.data.prepare")
FileKey = tuple[str, str, int]  # (split, set name, file index)


@dataclass
class ScanResult:
    report: dict  # decontamination.json
    removed: dict[FileKey, list[frozenset[str]]]  # per file, per segment: training ids removed
    first_lines: dict[FileKey, list[int]]  # per file, per segment: JSONL lines before it


def units_of(split: str, ds: DocumentSet, i: int, plan: FilePlan, segments_per_task: int) -> list[Unit]:
    """A file's segments, `segments_per_task` to a task."""
    spec = ds.spec(ds.files[i])
    step = max(1, segments_per_task)
    return [Unit(split, i, ds.files[i], spec, FilePlan(plan.kind, plan.codec, plan.segments[a:a + step]))
            for a in range(0, len(plan.segments), step)]


def _scan_sets(split: str, sets: tuple[DocumentSet, ...], plans: dict[FileKey, FilePlan], segments_per_task: int,
               workers: int, address: str | None, **kwargs) -> dict[FileKey, list[dict]]:
    """Per file, per segment, the scan's result; segments with provisional ids scanned again."""
    units = [u for ds in sets for i in range(len(ds.files))
             for u in units_of(split, ds, i, plans[(split, ds.name, i)], segments_per_task)]
    results: dict[FileKey, list[dict]] = {}
    for unit, res in zip(units, run_units(scan_unit, [((u,), kwargs) for u in units], workers, address)):
        results.setdefault((split, unit.spec.set_name, unit.file_index), []).extend(res)
    again = []
    for key, per_segment in results.items():
        lines = _first_lines(per_segment)
        plan = plans[key]
        for j, res in enumerate(per_segment):
            if res["anonymous"]:
                ds = next(d for d in sets if d.name == key[1])
                unit = Unit(split, key[2], ds.files[key[2]], ds.spec(ds.files[key[2]]),
                            FilePlan(plan.kind, plan.codec, (plan.segments[j],)))
                again.append((key, j, ((unit,), dict(kwargs, first_lines=(lines[j],)))))
    if again:
        log.info("prepare: %d segments hold lines without ids; scanning them again with their line numbers", len(again))
    for (key, j, _), res in zip(again, run_units(scan_unit, [call for _, _, call in again], workers, address)):
        results[key][j] = res[0]
    return results


def _first_lines(per_segment: list[dict]) -> list[int]:
    return [int(n) for n in np.concatenate([[0], np.cumsum([r["lines"] for r in per_segment])[:-1]])]


def check_sets(split: str, sets: tuple[DocumentSet, ...], results: dict[FileKey, list[dict]], where: str) -> None:
    """Every file holds a document, and ids are unique within each set (by their 64-bit hashes)."""
    for ds in sets:
        per_file = []
        for i, path in enumerate(ds.files):
            per_segment = results[(split, ds.name, i)]
            if not sum(r["docs"] for r in per_segment):
                raise DataInputError("holds no non-empty document (an empty file?)", where=str(path), field=ds.name)
            per_file.append(np.concatenate([r["id_hashes"] for r in per_segment]))
        _check_ids(ds, per_file)
        if not sum(r["docs"] for i in range(len(ds.files)) for r in results[(split, ds.name, i)]):
            raise DataInputError("has no non-empty documents", where=where,
                                 field=f"{'sources' if split == 'train' else 'eval'}: {ds.name}")


def _check_ids(ds: DocumentSet, per_file: list[np.ndarray]) -> None:
    """Refuse an id that appears twice in the set, naming the first whose second appearance comes first in
    file order (as curate's `repeated_id` does), with its file."""
    hashes = np.concatenate(per_file) if per_file else np.zeros(0, np.uint64)
    if len(hashes) < 2:
        return
    _, first = np.unique(hashes, return_index=True)
    if len(first) == len(hashes):
        return
    again = np.ones(len(hashes), dtype=bool)
    again[first] = False
    position = int(np.flatnonzero(again)[0])  # the earliest second appearance
    owner = np.repeat(np.arange(len(per_file)), [len(h) for h in per_file])
    target = int(hashes[position])
    path = ds.files[int(owner[position])]
    doc_id = next(d.doc_id for d in ds.file_documents(path) if id_hash(d.doc_id) == target)
    raise DataInputError(duplicate_id(doc_id), where=str(path), field=ds.name)


def scan(manifest: Manifest, plans: dict[FileKey, FilePlan], segments_per_task: int, workers: int,
         address: str | None) -> ScanResult:
    """Check every input, build the held-out n-gram index and decontaminate; the report and, per segment,
    the training ids removed and the lines before it."""
    n = manifest.ngram_words
    where = str(manifest.path)
    evals = _scan_sets("eval", manifest.eval_sets, plans, segments_per_task, workers, address, ngram_words=n)
    check_sets("eval", manifest.eval_sets, evals, where)
    checked_eval = {ds.name: sum(r["docs"] for i in range(len(ds.files)) for r in evals[("eval", ds.name, i)])
                    for ds in manifest.eval_sets}
    held_out = HeldOutIndex.build([g for ds in manifest.eval_sets for i in range(len(ds.files))
                                   for r in evals[("eval", ds.name, i)] for g in r["ngrams"]], n)
    first_lines = {key: _first_lines(per_segment) for key, per_segment in evals.items()}
    del evals
    if workers > 1 or address is not None:
        import ray

        held_ref = ray.put(held_out)
    else:
        held_ref = held_out
    trains = _scan_sets("train", manifest.sources, plans, segments_per_task, workers, address, held_out=held_ref)
    check_sets("train", manifest.sources, trains, where)
    removed_train: dict[tuple[str, str], list[str]] = {}
    flagged: dict[tuple[str, str], list[str]] = {}
    removed: dict[FileKey, list[frozenset[str]]] = {}
    checked_train: dict[str, int] = {}
    for ds in manifest.sources:
        checked_train[ds.name] = 0
        for i in range(len(ds.files)):
            per_segment = trains[("train", ds.name, i)]
            first_lines[("train", ds.name, i)] = _first_lines(per_segment)
            removed[("train", ds.name, i)] = [frozenset(doc_id for doc_id, _ in r["removed"]) for r in per_segment]
            for r in per_segment:
                checked_train[ds.name] += r["docs"]
                for doc_id, labels in r["removed"]:
                    removed_train[(ds.name, doc_id)] = [lab.replace("\x00", "/") for lab in labels]
                    for lab in labels:
                        domain, eval_id = lab.split("\x00", 1)
                        flagged.setdefault((domain, eval_id), []).append(f"{ds.name}/{doc_id}")
        gone = sum(1 for (src, _) in removed_train if src == ds.name)
        log.info("decontamination: %s: %d of %d training documents overlap a held-out set", ds.name, gone,
                 checked_train[ds.name])
        if gone == checked_train[ds.name]:
            raise DataInputError("every document was removed by decontamination", where=where,
                                 field=f"sources: {ds.name}")
    report = DecontaminationReport(ngram_words=n, removed_train=removed_train, flagged_eval=flagged,
                                   train_docs_checked=checked_train, eval_docs_checked=checked_eval)
    log.info("prepare: scanned %d training and %d held-out documents", sum(checked_train.values()),
             sum(checked_eval.values()))
    return ScanResult(report.to_json(), removed, first_lines)
